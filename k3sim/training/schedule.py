"""Pipeline step time and bubble for per-stage micro-batch costs: one function the training model calls.

If `k3sim.pipeline` (the discrete-event schedule engine) is installed it runs the schedule; otherwise the
closed forms of Narayanan et al. (SC'21, Megatron-LM) are used: with m micro-batches, p stages and v virtual
stages per rank, the pipeline runs m x (F + B) of the slowest stage plus a bubble of (p - 1)/v x (F + B)
(1F1B: v = 1). Non-uniform stages are bounded by the slowest stage (a modelling choice: the closed form
assumes equal stages; the engine does not).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass
class PipelineTime:
    step_time_s: float              # compute + bubble + exposed stage-to-stage sends (no DP/optimizer)
    bubble_s: float                 # idle of the slowest stage with free sends: T(no sends) - m x (F + B)
    bubble_ratio: float             # bubble / ideal compute (Megatron's convention)
    p2p_s: float                    # what the sends add to the step
    source: str
    timeline: object | None = None  # the engine's Timeline, for the report's Gantt chart


def closed_form(fwd: list[float], bwd: list[float], v: int, m: int, send_s: float = 0.0) -> PipelineTime:
    """Megatron: m (F + B) of the slowest stage + (p - 1)/v (F + B); sends exposed on the fill and drain
    chains only, 2 (p v - 1) hops (modelling choice: steady-state sends overlap compute)."""
    p = len(fwd)
    per_mb = max(f + b for f, b in zip(fwd, bwd))
    ideal = m * per_mb
    bubble = (p - 1) / v * per_mb
    p2p = 2 * (p * v - 1) * send_s if p > 1 else 0.0
    return PipelineTime(ideal + bubble + p2p, bubble, bubble / ideal if ideal else 0.0, p2p,
                        f"closed form (p-1)/(v m) (Narayanan et al. SC'21), p={p}, v={v}, m={m}")


def engine_available() -> bool:
    try:
        return importlib.util.find_spec("k3sim.pipeline.engine") is not None
    except ModuleNotFoundError:
        return False


def pipeline_time(fwd: list[float], bwd: list[float], *, virtual_stages: int = 1, micro_batches: int = 1,
                  send_s: float = 0.0, use_engine: bool | None = None) -> PipelineTime:
    """Step time of the pipeline for forward/backward seconds of one micro-batch on each rank (all its
    virtual chunks together; each chunk costs 1/v of it) and one stage-to-stage send of `send_s`.
    `use_engine` None: the discrete-event engine when present and p > 1."""
    p = len(fwd)
    if p == 1:
        t = micro_batches * (fwd[0] + bwd[0])
        return PipelineTime(t, 0.0, 0.0, 0.0, "no pipeline (pp=1)")
    if use_engine is None:
        use_engine = engine_available()
    if use_engine and engine_available():
        return _engine_time(fwd, bwd, virtual_stages, micro_batches, send_s)
    return closed_form(fwd, bwd, virtual_stages, micro_batches, send_s)


def run_engine(fwd, bwd, v, m, send_s):
    """The engine's timeline of (interleaved) 1F1B for these per-rank costs (k3sim.pipeline.run_pipeline)."""
    from k3sim.pipeline import build_schedule, run_pipeline
    from k3sim.pipeline.stagecosts import StageCosts

    p = len(fwd)
    name = "interleaved-1f1b" if v > 1 else "1f1b"
    sched = build_schedule(name, p, m, v)
    n = p * v
    f = tuple(fwd[s % p] / v for s in range(n))
    b = tuple(bwd[s % p] / v for s in range(n))
    costs = StageCosts(f, b, (0.0,) * n, (send_s,) * n, (send_s,) * n, source="k3sim.training")
    return run_pipeline(sched, costs).timeline


def _engine_time(fwd, bwd, v, m, send_s) -> PipelineTime:
    ideal = m * max(f + b for f, b in zip(fwd, bwd))
    free = run_engine(fwd, bwd, v, m, 0.0)
    full = run_engine(fwd, bwd, v, m, send_s) if send_s > 0 else free
    bubble = free.step_time_s - ideal
    return PipelineTime(full.step_time_s, bubble, bubble / ideal if ideal else 0.0,
                        full.step_time_s - free.step_time_s,
                        f"k3sim.pipeline discrete-event engine ({'interleaved-1f1b' if v > 1 else '1f1b'}, "
                        f"p={len(fwd)}, v={v}, m={m})", full)
