"""The scenario's optional `training:` and `sweep:` sections (`k3sim plan`, `k3sim sweep`).

`training:` sets the step model's knobs (k3sim.training.TrainOptions); `sweep:` the layout grid of
`k3sim sweep`. Both are optional: without them the step model's defaults and a grid derived from the
scenario's own layout are used.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt

_STRICT = ConfigDict(extra="forbid", frozen=True)


class TrainingSection(BaseModel):
    model_config = _STRICT
    routing_skew: NonNegativeFloat = Field(0.0, description="Zipf exponent of expert popularity (0 uniform)")
    redundant_experts: NonNegativeInt = Field(0, description="MoonEP redundant expert slots per EP rank")
    tp_overlap: float = Field(0.0, ge=0, le=1, description="share of TP communication hidden")
    ep_overlap: float = Field(0.0, ge=0, le=1, description="share of EP all-to-all hidden")
    kda_cp: Literal["kcp", "lasp2", "ulysses"] = "kcp"
    mla_cp: Literal["allgather-kv", "ring", "zigzag-ring", "ulysses"] = "allgather-kv"
    seed: NonNegativeInt = 0
    moe_glue: Literal["calibrated", "proxy"] = Field(
        "calibrated", description="MoE routing glue: calibrated (measured unfused, reports/training) or proxy "
                                  "(bytes only: fused permute kernels, not measured)")

    def options(self, use_pipeline_engine: bool | None = None):
        from k3sim.training import TrainOptions

        return TrainOptions(**self.model_dump(), use_pipeline_engine=use_pipeline_engine)


class SweepSection(BaseModel):
    """Values to try per dimension; None = derived from the scenario (see k3sim.planner.sweep.grid)."""

    model_config = _STRICT
    tp: list[PositiveInt] | None = None
    pp: list[PositiveInt] | None = None
    virtual_stages: list[PositiveInt] | None = None
    ep: list[PositiveInt] | None = None
    cp: list[PositiveInt] | None = None
    dp: list[PositiveInt] | None = None
    num_micro_batches: list[PositiveInt] | None = None
    max_batch: list[PositiveInt] | None = Field(None, description="serving: engine batch limits")
    prefill_replicas: list[NonNegativeInt] | None = Field(
        None, description="serving: prefill replicas of a P:D split (0: the scenario's own fleet)")
