"""Pipeline step time and bubble for per-stage micro-batch costs: one function the training model calls.

If `k3sim.pipeline` (the discrete-event schedule engine) is installed it runs the schedule; otherwise the
closed forms of Narayanan et al. (SC'21, Megatron-LM) are used: with m micro-batches, p stages and v virtual
stages per rank, the pipeline runs m x (F + B) of the slowest stage plus a bubble of (p - 1)/v x (F + B)
(1F1B: v = 1). Non-uniform stages are bounded by the slowest stage (a modelling choice: the closed form
assumes equal stages; the engine does not).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field


@dataclass
class PipelineTime:
    step_time_s: float              # compute + bubble of the pipeline (no DP/optimizer)
    bubble_s: float                 # step_time_s - m x (F + B) of the slowest stage
    bubble_ratio: float             # bubble / ideal compute (Megatron's convention)
    source: str
    stage_idle_s: list[float] = field(default_factory=list)
    engine: object | None = None    # the engine's own result, for the report's Gantt chart


def closed_form(fwd: list[float], bwd: list[float], v: int, m: int) -> PipelineTime:
    p = len(fwd)
    per_mb = max(f + b for f, b in zip(fwd, bwd))
    ideal = m * per_mb
    bubble = (p - 1) / v * per_mb
    idle = [ideal + bubble - m * (f + b) for f, b in zip(fwd, bwd)]
    return PipelineTime(ideal + bubble, bubble, bubble / ideal if ideal else 0.0,
                        f"closed form (p-1)/(v m) (Narayanan et al. SC'21), p={p}, v={v}, m={m}", idle)


def engine_available() -> bool:
    return importlib.util.find_spec("k3sim.pipeline") is not None


def pipeline_time(fwd: list[float], bwd: list[float], *, virtual_stages: int = 1, micro_batches: int = 1,
                  use_engine: bool | None = None) -> PipelineTime:
    """Step time of the pipeline for forward/backward seconds of one micro-batch on each rank (all its
    virtual chunks together). `use_engine` None: the engine when present and p > 1."""
    p = len(fwd)
    if p == 1:
        t = micro_batches * (fwd[0] + bwd[0])
        return PipelineTime(t, 0.0, 0.0, "no pipeline (pp=1)", [0.0])
    if use_engine is None:
        use_engine = engine_available()
    if use_engine:
        run = _engine_time(fwd, bwd, virtual_stages, micro_batches)
        if run is not None:
            return run
    return closed_form(fwd, bwd, virtual_stages, micro_batches)


def _engine_time(fwd, bwd, v, m) -> PipelineTime | None:
    """Adapter to k3sim.pipeline; returns None where the engine cannot run this case."""
    try:
        from k3sim.pipeline import simulate_costs  # type: ignore[attr-defined]
    except ImportError:
        return None
    res = simulate_costs(fwd=fwd, bwd=bwd, virtual_stages=v, micro_batches=m)
    ideal = m * max(f + b for f, b in zip(fwd, bwd))
    return PipelineTime(res.step_time_s, res.step_time_s - ideal, (res.step_time_s - ideal) / ideal,
                        "k3sim.pipeline discrete-event engine", list(getattr(res, "idle_s", [])), res)
