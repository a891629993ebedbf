"""Discrete-event execution of a pipeline program on simpy: devices run their ops in a fixed order,
each op starts when the device is free and its inputs have arrived; transfers occupy a link, not the
device.

Design for speed (the planner calls this thousands of times): one simpy process per device walks its
precomputed op order. It waits on a dependency only when that dependency has not finished yet (an event
created lazily, just for that waiter). When it starts an op, it also runs on through every following op
whose inputs were already complete at that moment (their times are then fixed: start = max(device
free, inputs ready)) and yields one timeout for the whole run; a device waiting on an op inside the run
is woken at that op's finish time. Same timeline as one timeout per op, fewer simpy events. A
link is a FIFO modelled by its next-free time: a transfer starts when its producer finishes or when
the link frees, whichever is later. Every directed link has one sending device, which issues its
sends in its own op order, so FIFO-by-issue-time equals FIFO-by-order and needs no process of its
own. Sends are asynchronous (the sender does not wait for the receiver): a modelling choice matching
Megatron's batched isend/irecv overlap; a device never computes while blocked on a send.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Program:
    """What the engine runs. Ops are ints 0..n-1.

    orders[d]: op ids device d runs, in order. cost[i]: seconds of op i on its device.
    deps[i]: (dep op id, remote) pairs; a remote dependency is ready when its transfer arrives, a local
    one when it finishes. out_link[i]: link id op i's output travels over (-1: none), out_seconds[i]:
    that transfer's duration. labels[i]: (kind, stage, chunk, micro_batch) for traces and metrics;
    kind is one of F, B, W, EF (encoder forward), EB (encoder backward)."""

    num_devices: int
    orders: list[list[int]]
    cost: list[float]
    deps: list[tuple[tuple[int, bool], ...]]
    out_link: list[int]
    out_seconds: list[float]
    labels: list[tuple[str, int, int, int]]
    link_names: list[str] = field(default_factory=list)

    @property
    def num_ops(self) -> int:
        return len(self.cost)

    def device_of_op(self) -> list[int]:
        dev = [-1] * self.num_ops
        for d, order in enumerate(self.orders):
            for op in order:
                dev[op] = d
        return dev


@dataclass
class Timeline:
    """Start and finish of every op (s), and of every transfer (xfer_start, arrival; -1 if none)."""

    program: Program
    start: list[float]
    finish: list[float]
    xfer_start: list[float]
    arrival: list[float]

    @property
    def step_time_s(self) -> float:
        return max(self.finish) if self.finish else 0.0

    def busy_s(self) -> list[float]:
        """Compute seconds per device."""
        c = self.program.cost
        return [sum(c[op] for op in order) for order in self.program.orders]


class Deadlock(RuntimeError):
    """The program's op orders contradict its dependencies: some device waits forever."""


def simulate(program: Program) -> Timeline:
    """Run `program` to completion; raise Deadlock if it cannot finish."""
    import simpy

    n = program.num_ops
    env = simpy.Environment()
    timeout = env.timeout
    cost, deps = program.cost, program.deps
    out_link, out_seconds = program.out_link, program.out_seconds
    start = [-1.0] * n
    finish = [-1.0] * n
    xfer_start = [-1.0] * n
    arrival = [-1.0] * n
    waiting: dict[int, object] = {}
    link_free = [0.0] * (max(out_link, default=-1) + 1)
    done_devices = [0]

    def wake_later(ev, delay: float) -> None:
        timeout(delay).callbacks.append(lambda _e: ev.succeed())

    def device(order: list[int]):
        i, n = 0, len(order)
        while i < n:
            op = order[i]
            ready = 0.0
            for dep, remote in deps[op]:
                if finish[dep] < 0:
                    ev = waiting.get(dep)
                    if ev is None:
                        ev = waiting[dep] = env.event()
                    yield ev
                t = arrival[dep] if remote else finish[dep]
                if t > ready:
                    ready = t
            now = env.now
            if ready > now:
                yield timeout(ready - now)
                now = env.now
            # Run this op and every following one whose inputs were already complete at `now`: their
            # start and finish times are fixed (start = max(device free, input ready)), so one timeout
            # covers the run; anyone waiting on an op inside it is woken at that op's finish time.
            t = now
            while True:
                if ready > t:
                    t = ready
                start[op] = t
                t += cost[op]
                finish[op] = t
                link = out_link[op]
                if link >= 0:
                    s = link_free[link]
                    if s < t:
                        s = t
                    xfer_start[op] = s
                    arrival[op] = link_free[link] = s + out_seconds[op]
                ev = waiting.pop(op, None)
                if ev is not None:
                    if t > now:
                        wake_later(ev, t - now)
                    else:
                        ev.succeed()
                i += 1
                if i == n:
                    break
                nxt = order[i]
                ready = 0.0
                for dep, remote in deps[nxt]:
                    f = finish[dep]
                    if f < 0 or f > now:
                        ready = -1.0
                        break
                    r = arrival[dep] if remote else f
                    if r > ready:
                        ready = r
                if ready < 0:
                    break
                op = nxt
            if t > now:
                yield timeout(t - now)
        done_devices[0] += 1

    for order in program.orders:
        env.process(device(order))
    env.run()
    if done_devices[0] != len(program.orders):
        stuck = [program.labels[op] for op in waiting]
        raise Deadlock(f"pipeline program deadlocked; ops waited on but never run: {stuck[:5]}")
    return Timeline(program, start, finish, xfer_start, arrival)
