"""The scenario's optional `training:` and `sweep:` sections (`k3sim plan`, `k3sim sweep`).

`training:` sets the step model's knobs (k3sim.training.TrainOptions); `sweep:` the layout grid of
`k3sim sweep`. Both are optional: without them the step model's defaults and a grid derived from the
scenario's own layout are used.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from k3sim.configs.bounds import bounded_float, bounded_int

_STRICT = ConfigDict(extra="forbid", frozen=True)

# Documented ranges (k3sim/configs/bounds.py): a Zipf exponent of .inf, 10^9 redundant slots (a hang) or a
# seed of 10^30 are refused in the file, naming the field.
Skew = bounded_float("zipf_exponent")
Share = bounded_float("fraction")
Degree = bounded_int("parallel")
Count = bounded_int("batch")


class TrainingSection(BaseModel):
    """Each knob acts on one part of the model and one parallel dimension (`k3sim.planner.inputs.TRAINING_NEEDS`):
    given for a model or (in `k3sim plan`) a layout without it, it is refused, not ignored."""

    model_config = _STRICT
    routing_skew: Skew = Field(0.0, description="Zipf exponent of expert popularity (0 uniform)")
    redundant_experts: bounded_int("experts", lo=0) = Field(0, description="MoonEP redundant expert slots per "
                                                                            "EP rank")
    tp_overlap: Share = Field(0.0, description="share of TP communication hidden")
    ep_overlap: Share = Field(0.0, description="share of EP all-to-all hidden")
    kda_cp: Literal["kcp", "lasp2", "ulysses"] = "kcp"
    mla_cp: Literal["allgather-kv", "ring", "zigzag-ring", "ulysses"] = "allgather-kv"
    seed: bounded_int("seed") = Field(0, description="seed of the routing samples behind the EP imbalance")
    moe_glue: Literal["calibrated", "proxy"] = Field(
        "calibrated", description="MoE routing glue: calibrated (measured unfused, reports/training) or proxy "
                                  "(bytes only: fused permute kernels, not measured)")

    def options(self, use_pipeline_engine: bool | None = None):
        from k3sim.training import TrainOptions

        return TrainOptions(**self.model_dump(), use_pipeline_engine=use_pipeline_engine)


# The dimensions of each mode's grid (`k3sim sweep`): the other mode's are refused by `Scenario`.
TRAIN_SWEEP_FIELDS = ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "num_micro_batches")
SERVE_SWEEP_FIELDS = ("max_batch", "prefill_replicas")


class SweepSection(BaseModel):
    """Values to try per dimension; None = derived from the scenario (see k3sim.planner.sweep.grid). Each
    value once (a repeated value would be a repeated point); the grid's size is bounded
    (`k3sim.planner.sweep.check_grid_size`)."""

    model_config = _STRICT
    tp: list[Degree] | None = None
    pp: list[Degree] | None = None
    virtual_stages: list[Degree] | None = None
    ep: list[Degree] | None = None
    cp: list[Degree] | None = None
    dp: list[Degree] | None = None
    num_micro_batches: list[Count] | None = None
    max_batch: list[Count] | None = Field(None, description="serving: engine batch limits")
    prefill_replicas: list[bounded_int("replicas", lo=0)] | None = Field(
        None, description="serving: prefill replicas of a P:D split (0: the scenario's own fleet)")

    @field_validator("*")
    @classmethod
    def _each_once(cls, v):
        if v is not None:
            if not v:
                raise ValueError("is empty: give at least one value, or leave the field out (derived from the "
                                 "scenario)")
            seen = set()
            for x in v:
                if x in seen:
                    raise ValueError(f"{x} appears twice; give each value once")
                seen.add(x)
        return v
