"""Timing with CUDA events: warm-up, L2 flushed before every repetition, median and spread.

The H200's L2 is 60 MB (METHOD.md of the device tool: "data several times the L2"); writing a 256 MiB
buffer between repetitions evicts it, so each repetition reads its operands from HBM as a real
layer would.

Launch-bound kernels (a decode step is tens of microseconds of GPU work behind a Python call that
enqueues several kernels) would otherwise be timed with the host's enqueue time inside the events:
the GPU idles between the start event and the first kernel. A GPU sleep queued before the start
event gives the host that time, so the events bracket GPU execution alone, as a CUDA-graph replay
in a serving engine sees it. The host time of one call is recorded beside it (`host_s`).
Two limits: a call that synchronises with the host inside (a `.item()`, a device-to-host copy) still
shows the launch gaps after that point; and multi-GPU timings (collectives, KCP) start from a barrier
instead, without the sleep, so they include the host's launch time where it exceeds the GPU work.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

FLUSH_BYTES = 256 * 1024 * 1024
# Harness choices, not measured: a call under 200 us gets 200 repetitions (see time_cuda).
SHORT_KERNEL_S = 200e-6
SHORT_KERNEL_REPS = 200
# torch.cuda._sleep counts SM clock cycles; 2 GHz is above the H100/H200 boost clock (1.98 GHz), so
# a requested headroom is never shorter on the GPU than asked.
SLEEP_CYCLES_PER_S = 2.0e9
HEADROOM_MIN_S = 20e-6  # harness choice: a floor for a call whose host time is unknown or tiny
HEADROOM_MAX_S = 5e-3


@dataclass
class Timing:
    seconds: float  # median
    seconds_p20: float
    seconds_p80: float
    reps: int
    host_s: float = float("nan")  # host time to enqueue one call (no synchronisation)


def launch_headroom_s(host_s: float) -> float:
    """GPU sleep queued before each timed call: twice the host's enqueue time, clamped.

    Twice, because host time jitters; at most 5 ms, because a call whose host side takes longer is
    not launch-bound in any shape worth timing this way (and its GPU work dwarfs the gap anyway).
    """
    if not host_s == host_s or host_s <= 0:  # NaN or unknown
        return HEADROOM_MIN_S
    return min(HEADROOM_MAX_S, max(HEADROOM_MIN_S, 2.0 * host_s))


_flush_buf = None


def flush_l2() -> None:
    import torch

    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    _flush_buf.zero_()


def spin_gpu(seconds: float) -> None:
    """Keep the GPU busy for a while so its clocks ramp back up before timing."""
    import torch

    a = torch.randn((4096, 4096), device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def time_cuda(fn: Callable[[], object], *, reps: int = 25, warmup: int = 3, budget_s: float = 3.0,
              flush: bool = True, before_each: Callable[[], object] | None = None,
              barrier: Callable[[], object] | None = None) -> Timing:
    """Median device time of `fn` over repetitions, each after an L2 flush.

    The repetition count shrinks for slow kernels so one shape costs at most about `budget_s`.
    `before_each` (untimed) resets state such as gradients; `barrier` aligns ranks for collectives.
    """
    import torch

    t0 = time.perf_counter()
    host_s = float("nan")
    for _ in range(warmup):
        if before_each:
            before_each()
        h0 = time.perf_counter()
        fn()
        host_s = time.perf_counter() - h0  # the last warm-up's: compiles and autotuning are over
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t0) / max(warmup, 1)
    if per_call > 0.5:
        # The warm-up compiled or autotuned: the GPU idled meanwhile and its clocks dropped.
        spin_gpu(0.3)
        t1 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        per_call = time.perf_counter() - t1
    if per_call < SHORT_KERNEL_S:
        # Launch-bound kernels scatter from repetition to repetition (the 2026-11-30 H200 decode rows
        # spread 10-100 %); many more repetitions keep their median stable at little cost.
        reps = max(reps, SHORT_KERNEL_REPS)
    n = max(5, min(reps, int(budget_s / max(per_call, 1e-6))))
    # Collectives keep their barrier-aligned start: a sleep there would skew the ranks instead.
    sleep_cycles = 0 if barrier else int(launch_headroom_s(host_s) * SLEEP_CYCLES_PER_S)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if before_each:
            before_each()
        if flush:
            flush_l2()
        if barrier:
            barrier()
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    xs = [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]
    return Timing(statistics.median(xs), _quantile(xs, 0.2), _quantile(xs, 0.8), n, host_s)
