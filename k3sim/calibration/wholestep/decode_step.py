"""Decode step of B sequences at context C under ONE CUDA graph, and the same step eager.

Static inputs (token ids, or hidden states for a slice without embedding), MLA latent caches and KDA /
conv states filled with random data, routing from the real router on those inputs. Timers:
- `graph`: CUDA-event time of one graph replay (L2 flushed before each, median of >= 20 replays);
- `eager_events`: the same step launched op by op, events around it with a GPU sleep queued first
  (`timing.time_cuda`), i.e. GPU execution with whatever launch gaps the host still leaves;
- `eager_wall`: host wall time of one synchronised eager step (what an engine without graphs pays).
"""

from __future__ import annotations

import statistics
import time

from k3sim.calibration.wholestep import spec as S

# Harness choice: GPU memory held back when sizing the decode pool (graph pools, activations, cuBLAS
# workspaces, the 256 MiB L2-flush buffer). Not measured; a point that still runs out is recorded failed.
RESERVE_BYTES = 6 * 2 ** 30
GRAPH_REPS = 30      # replays asked of time_cuda (>= 20 always: the budget below allows it)
EAGER_REPS = 10


def static_input(model, st: S.StepShape, seed: int = 1):
    torch = model.torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    if model.spec.embed_head:
        return torch.randint(0, model.spec.vocab_local, (st.tokens,), device="cuda", generator=g)
    return torch.randn((st.tokens, model.spec.hidden), device="cuda", generator=g).to(torch.bfloat16)


def wall_time(fn, n: int):
    """Median host wall time of `n` synchronised calls, as a Timing."""
    import torch

    from k3sim.calibration.timing import Timing, _quantile

    xs = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        xs.append(time.perf_counter() - t0)
    return Timing(statistics.median(xs), _quantile(xs, 0.2), _quantile(xs, 0.8), n)


def kernel_profile(step) -> list[dict]:
    """GPU time of every CUDA kernel one eager call of `step` launches (torch.profiler, CUPTI), summed by
    kernel name: the measured decomposition a whole-step miss is explained with."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0.0)
        if t and e.count:
            rows.append({"kernel": e.key[:160], "calls": int(e.count), "gpu_s": float(t) * 1e-6})
    return rows


def measure_point(model, st: S.StepShape, pool, *, eager: bool = True, graph: bool = True, trace: bool = True,
                  profile: list | None = None):
    """Timings of one decode step ({"graph": Timing, "eager_events": Timing, "eager_wall": Timing}) and
    the traced kernel list of one eager call (None without `trace`)."""
    import torch

    from k3sim.calibration.timing import time_cuda

    states = model.alloc_states(st, pool)
    inp = static_input(model, st)
    out = {}

    def step():
        return model.forward(inp, st, states)

    with torch.no_grad():
        step()  # compiles / autotunes fla kernels for this shape family
        torch.cuda.synchronize()
        traced = model.trace(inp, st, states) if trace else None
        if profile is not None:
            try:
                profile.extend(kernel_profile(step))
            except Exception as err:  # noqa: BLE001 - a profiler failure must not cost the timing
                print(f"[wholestep] kernel profile failed: {type(err).__name__}: {err}", flush=True)
        if eager:
            out["eager_events"] = time_cuda(step, reps=EAGER_REPS, warmup=2, budget_s=3.0)
            out["eager_wall"] = wall_time(step, 5)
        if graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            torch.cuda.synchronize()
            out["graph"] = time_cuda(g.replay, reps=GRAPH_REPS, warmup=3, budget_s=3.0)
            del g
    del states
    torch.cuda.empty_cache()
    return out, traced


def free_bytes() -> int:
    """GPU memory free for decode buffers now, less the reserve."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    return max(0, free - RESERVE_BYTES)
