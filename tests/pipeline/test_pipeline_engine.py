"""The engine: dependencies honoured, one compute op per device at a time, transfers on links only."""

from __future__ import annotations

import pytest

from k3sim.pipeline import EncoderWork, StageCosts, build_schedule, place, simulate, text_program, uniform_costs
from k3sim.pipeline.engine import Deadlock, Program


def check_timeline(tl) -> None:
    prog = tl.program
    for order in prog.orders:                       # device: ops back to back, never overlapping
        for a, b in zip(order, order[1:]):
            assert tl.start[b] >= tl.finish[a] - 1e-12
    for op in range(prog.num_ops):
        assert tl.finish[op] == pytest.approx(tl.start[op] + prog.cost[op])
        for dep, remote in prog.deps[op]:
            ready = tl.arrival[dep] if remote else tl.finish[dep]
            assert tl.start[op] >= ready - 1e-12
        if prog.out_link[op] >= 0:
            assert tl.xfer_start[op] >= tl.finish[op] - 1e-12
            assert tl.arrival[op] == pytest.approx(tl.xfer_start[op] + prog.out_seconds[op])
    by_link: dict[int, list[tuple[float, float]]] = {}
    for op in range(prog.num_ops):
        if prog.out_link[op] >= 0:
            by_link.setdefault(prog.out_link[op], []).append((tl.xfer_start[op], tl.arrival[op]))
    for spans in by_link.values():                  # a link carries one transfer at a time
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-12


def skewed_costs(p: int, v: int, send: float) -> StageCosts:
    n = p * v
    f = tuple(0.5 + 0.37 * ((s * 7) % 5) for s in range(n))
    return StageCosts(f, tuple(2 * x for x in f), tuple(0.6 * x for x in f), (send,) * n, (1.5 * send,) * n)


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 5, 1), ("1f1b", 4, 6, 1), ("interleaved-1f1b", 4, 8, 2),
                                        ("zb-h1", 5, 7, 1), ("1f1b", 6, 3, 1)])
@pytest.mark.parametrize("send", [0.0, 0.3, 2.0])
def test_timeline_respects_dependencies_devices_and_links(name, p, m, v, send):
    s = build_schedule(name, p, m, v)
    costs = skewed_costs(p, v, send)
    check_timeline(simulate(text_program(s, costs).program))
    for policy in ("serial", "decoupled", "bubble"):
        enc = EncoderWork(tuple(0.2 + 0.1 * (j % 3) for j in range(m)), tuple(0.5 for _ in range(m)), send)
        check_timeline(simulate(place(s, costs, enc, policy).program))


def test_hand_worked_transfers_add_to_the_chain():
    # p=2, m=1, F=1, B=2 per stage, 0.5 s per hop: F0 1 + hop .5 + F1 1 + B1 2 + hop .5 + B0 2 = 7
    s = build_schedule("1f1b", 2, 1)
    c = uniform_costs(2, 1, 1.0, 2.0, send_s=0.5)
    assert simulate(text_program(s, c).program).step_time_s == pytest.approx(7.0)


def test_a_transfer_occupies_the_link_not_the_device():
    # GPipe, slow link: stage 0 keeps computing forwards while its first output is still in flight,
    # and transfers over the one link queue (the second waits for the first).
    s = build_schedule("gpipe", 2, 3)
    placed = text_program(s, uniform_costs(2, 1, 1.0, 2.0, send_s=5.0))
    tl = simulate(placed.program)
    f = [placed.text_ids[(0, 0, j)] for j in range(3)]
    assert tl.start[f[1]] == pytest.approx(1.0) and tl.start[f[2]] == pytest.approx(2.0)
    assert tl.arrival[f[0]] == pytest.approx(6.0)
    assert tl.xfer_start[f[1]] == pytest.approx(6.0) and tl.arrival[f[1]] == pytest.approx(11.0)


def test_deadlock_is_reported():
    # device 0 runs op 1 then op 0, but op 1 needs op 0
    prog = Program(1, [[1, 0]], [1.0, 1.0], [(), ((0, False),)], [-1, -1], [0.0, 0.0],
                   [("F", 0, 0, 0), ("F", 1, 0, 0)])
    with pytest.raises(Deadlock):
        simulate(prog)


def test_engine_is_fast_enough_for_a_mid_size_layout():
    """32 stages x 2 chunks x 128 micro-batches (16k compute ops) in well under a second of the
    planner's budget; the 64 x 2 x 512 benchmark is benchmarks/bench_pipeline.py."""
    import time

    s = build_schedule("interleaved-1f1b", 32, 128, 2)
    prog = text_program(s, uniform_costs(32, 2, 1.0, 2.0)).program
    t = time.perf_counter()
    tl = simulate(prog)
    assert time.perf_counter() - t < 60  # a hang guard only: the speed is benchmarks/bench_pipeline.py's
    assert (tl.step_time_s - 128 * 3) / (128 * 3) == pytest.approx(31 / (2 * 128))


def reference_times(prog: Program) -> tuple[list[float], list[float]]:
    """Oracle without simpy: sweep the devices until every op is placed; an op starts at max(device
    free, each input finished (local) or arrived (remote, FIFO on its link in sender order))."""
    n = prog.num_ops
    start, finish, arrival = [None] * n, [None] * n, [None] * n
    pos, free = [0] * prog.num_devices, [0.0] * prog.num_devices
    link_free: dict[int, float] = {}
    progress = True
    while progress:
        progress = False
        for d, order in enumerate(prog.orders):
            while pos[d] < len(order):
                op = order[pos[d]]
                if any(finish[dep] is None for dep, _ in prog.deps[op]):
                    break
                t = max([free[d]] + [arrival[dep] if remote else finish[dep] for dep, remote in prog.deps[op]])
                start[op], finish[op] = t, t + prog.cost[op]
                free[d] = finish[op]
                if prog.out_link[op] >= 0:
                    s = max(finish[op], link_free.get(prog.out_link[op], 0.0))
                    arrival[op] = link_free[prog.out_link[op]] = s + prog.out_seconds[op]
                pos[d] += 1
                progress = True
    return start, finish


@pytest.mark.parametrize("seed", range(6))
def test_engine_matches_a_simpy_free_oracle(seed):
    import random

    rng = random.Random(seed)
    name, p, m, v = rng.choice([("1f1b", 4, 6, 1), ("interleaved-1f1b", 4, 8, 2), ("zb-h1", 5, 7, 1),
                                ("gpipe", 3, 4, 1)])
    n = p * v
    costs = StageCosts(*(tuple(rng.uniform(0.05, 3) for _ in range(n)) for _ in range(3)),
                       (rng.choice([0.0, 0.4]),) * n, (rng.choice([0.0, 0.7]),) * n)
    enc = EncoderWork(tuple(rng.uniform(0, 2) for _ in range(m)), tuple(rng.uniform(0, 4) for _ in range(m)), 0.1)
    for policy in ("none", "serial", "decoupled", "bubble"):
        prog = place(build_schedule(name, p, m, v), costs, enc, policy).program
        tl = simulate(prog)
        start, finish = reference_times(prog)
        assert tl.start == pytest.approx(start, abs=1e-9)
        assert tl.finish == pytest.approx(finish, abs=1e-9)
