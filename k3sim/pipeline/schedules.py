"""Pipeline schedules as static per-device op orders, and their dependency graph.

A schedule says, for each pipeline device, the order in which it runs its compute ops; the data
dependencies between ops are the same for every schedule. Both are needed by the engine: the order
fixes what a device does next, the dependencies decide when it can start. Keeping the orders as plain
lists (not a graph search at run time) is what makes the engine fast enough for the planner's sweeps.

Ops: F (forward), B (backward; for ZB-H1 only the input gradient), W (weight gradient, ZB-H1 only),
per (virtual stage s, micro-batch mb). Virtual stage s lives on device s % p as model chunk s // p
(Megatron's interleaved layout: device d holds chunks d, d + p, ...).

Schedules (p devices, m micro-batches, v chunks per device):
- gpipe: all forwards, then all backwards (Huang et al. 2019); bubble (p-1)/m.
- 1f1b: p-d-1 warm-up forwards on device d, then one forward / one backward (Narayanan et al.,
  SC'21, PipeDream-flush); bubble (p-1)/m.
- interleaved-1f1b: Megatron-LM's virtual pipeline (same paper, sec. 2.2): (p-d-1)*2 + (v-1)*p
  warm-up chunk forwards, chunk order by groups of p micro-batches; needs m to be a multiple of p;
  bubble (p-1)/(v m).
- zb-h1: 1F1B with the backward split into B and W (Qi et al., ICLR 2024, "Zero Bubble Pipeline
  Parallelism", ZB-H1): device d defers its W passes by d micro-batches, which lets the B chain run
  at B speed and fills the tail with W; bubble (p-1)(F+B-W) per device, (p-1)/(3m) for F = B = W.
  The construction is ours (the repo derives its order with a greedy + ILP search); with uniform
  costs it reproduces the paper's bubble exactly (tests/pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass

from k3sim.errors import InputError

F, B, W = 0, 1, 2
KIND_NAMES = ("F", "B", "W")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


@dataclass(frozen=True)
class Schedule:
    """Per-device op orders. `orders[d]` is a list of (kind, virtual_stage, micro_batch).

    `split_backward`: B and W are separate ops (ZB-H1); otherwise B is the whole backward and there
    are no W ops."""

    name: str
    p: int
    v: int
    m: int
    orders: tuple[tuple[tuple[int, int, int], ...], ...]
    split_backward: bool

    @property
    def num_stages(self) -> int:
        """Virtual stages (model chunks over all devices) = p * v."""
        return self.p * self.v

    def device_of(self, stage: int) -> int:
        return stage % self.p


def check_shape(name: str, p: int, m: int, v: int, *, source: str | None = None) -> None:
    """Refuse layouts the schedule cannot run, naming the option at fault."""
    if name not in SCHEDULES:
        raise InputError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}", source=source or "--schedule")
    if p < 1:
        raise InputError(f"need at least 1 stage, got {p}", source="--stages")
    if m < 1:
        raise InputError(f"need at least 1 micro-batch, got {m}", source="--microbatches")
    if v < 1:
        raise InputError(f"virtual stages must be >= 1, got {v}", source="--virtual")
    if v > 1 and name != "interleaved-1f1b":
        raise InputError(f"--virtual {v} needs --schedule interleaved-1f1b ({name} has one chunk per stage)",
                         source="--virtual")
    if name == "interleaved-1f1b" and m % p:
        raise InputError(f"interleaved-1f1b needs the micro-batch count to be a multiple of the stages: "
                         f"m={m}, p={p}", source="--microbatches")


def _gpipe(p: int, m: int) -> list[list[tuple[int, int, int]]]:
    return [[(F, d, k) for k in range(m)] + [(B, d, k) for k in range(m)] for d in range(p)]


def _one_f_one_b(p: int, m: int) -> list[list[tuple[int, int, int]]]:
    orders = []
    for d in range(p):
        nw = min(p - d - 1, m)
        o = [(F, d, k) for k in range(nw)]
        for k in range(m - nw):
            o += [(F, d, k + nw), (B, d, k)]
        o += [(B, d, k) for k in range(m - nw, m)]
        orders.append(o)
    return orders


def _zb_h1(p: int, m: int) -> list[list[tuple[int, int, int]]]:
    orders = []
    for d in range(p):
        nw = min(p - d - 1, m)
        o = [(F, d, k) for k in range(nw)]
        deferred: list[int] = []

        def backward(k: int) -> None:
            o.append((B, d, k))
            deferred.append(k)
            if len(deferred) > d:               # device d keeps d weight-gradient passes pending
                o.append((W, d, deferred.pop(0)))

        for k in range(m - nw):
            o.append((F, d, k + nw))
            backward(k)
        for k in range(m - nw, m):
            backward(k)
        o += [(W, d, k) for k in deferred]
        orders.append(o)
    return orders


def _interleaved(p: int, m: int, v: int) -> list[list[tuple[int, int, int]]]:
    """Megatron-LM `forward_backward_pipelining_with_interleaving` order (m a multiple of p)."""
    total = m * v

    def fwd(d: int, k: int) -> tuple[int, int, int]:
        chunk = (k // p) % v
        return (F, chunk * p + d, (k // (p * v)) * p + k % p)

    def bwd(d: int, k: int) -> tuple[int, int, int]:
        chunk = v - 1 - (k // p) % v
        return (B, chunk * p + d, (k // (p * v)) * p + k % p)

    orders = []
    for d in range(p):
        nw = min((p - d - 1) * 2 + (v - 1) * p, total)
        o = [fwd(d, k) for k in range(nw)]
        for k in range(total - nw):
            o += [fwd(d, k + nw), bwd(d, k)]
        o += [bwd(d, k) for k in range(total - nw, total)]
        orders.append(o)
    return orders


def build_schedule(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The op order per device of schedule `name` (see module docstring)."""
    check_shape(name, p, m, v)
    if name == "gpipe":
        orders = _gpipe(p, m)
    elif name == "1f1b":
        orders = _one_f_one_b(p, m)
    elif name == "zb-h1":
        orders = _zb_h1(p, m)
    else:
        orders = _interleaved(p, m, v)
    return Schedule(name, p, v, m, tuple(tuple(o) for o in orders), split_backward=name == "zb-h1")


def op_dependencies(kind: int, stage: int, mb: int, num_stages: int, split_backward: bool) -> list[tuple[int, int, int]]:
    """Text ops an op needs finished: F(s) after F(s-1); B(s) after F(s) and B(s+1); W(s) after B(s)."""
    if kind == F:
        return [(F, stage - 1, mb)] if stage > 0 else []
    if kind == B:
        deps = [(F, stage, mb)]
        if stage < num_stages - 1:
            deps.append((B, stage + 1, mb))
        return deps
    if not split_backward:
        raise ValueError("W op in a schedule without split backward")
    return [(B, stage, mb)]


def dependency_graph(schedule: Schedule):
    """networkx DiGraph of the text ops: data edges (kind 'data') and device-order edges ('order').

    Used to validate a schedule (every op once, acyclic, so it cannot deadlock), not by the engine."""
    import networkx as nx

    g = nx.DiGraph()
    S = schedule.num_stages
    for d, order in enumerate(schedule.orders):
        for i, op in enumerate(order):
            g.add_node(op, device=d)
            if i:
                g.add_edge(order[i - 1], op, kind="order")
    for op in list(g.nodes):
        for dep in op_dependencies(*op, S, schedule.split_backward):
            g.add_edge(dep, op, kind="data")
    return g


def validate_schedule(schedule: Schedule) -> None:
    """Raise ValueError unless every (kind, stage, mb) op appears exactly once, on its stage's
    device, and data + order edges form a DAG (no deadlock)."""
    import networkx as nx

    kinds = (F, B, W) if schedule.split_backward else (F, B)
    want = {(k, s, mb) for k in kinds for s in range(schedule.num_stages) for mb in range(schedule.m)}
    seen = [op for order in schedule.orders for op in order]
    if len(seen) != len(set(seen)) or set(seen) != want:
        raise ValueError(f"{schedule.name}: ops missing or repeated")
    for d, order in enumerate(schedule.orders):
        if any(schedule.device_of(s) != d for _, s, _ in order):
            raise ValueError(f"{schedule.name}: an op runs on a device that does not hold its stage")
    g = dependency_graph(schedule)
    if not nx.is_directed_acyclic_graph(g):
        raise ValueError(f"{schedule.name}: the order contradicts a data dependency (deadlock)")
