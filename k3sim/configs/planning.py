"""The scenario's optional `training:` and `sweep:` sections (`k3sim plan`, `k3sim sweep`), and the training
step model's options.

`training:` sets the step model's knobs; `TrainOptions` is those knobs plus the run's choice of pipeline
clock, the one options object `k3sim.training.train_step` takes (defined here, below the model, so a scenario
and the step model read one definition). `sweep:` is the layout grid of `k3sim sweep`. Both sections are
optional: without them the step model's defaults and a grid derived from the scenario's own layout are used.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from k3sim.configs.bounds import bounded_float, bounded_int
from k3sim.errors import InputError

_STRICT = ConfigDict(extra="forbid", frozen=True)

# Documented ranges (k3sim/configs/bounds.py): a Zipf exponent of .inf, 10^9 redundant slots (a hang) or a
# seed of 10^30 are refused in the file, naming the field.
Skew = bounded_float("zipf_exponent")
Share = bounded_float("fraction")
Degree = bounded_int("parallel")
Count = bounded_int("batch")


from k3sim.configs.recipe import (  # noqa: F401 - the recipe's choices, re-exported with the schema
    GlueMode, GLUE_MODES, Precision, PRECISIONS, RecomputeMode, RECOMPUTE_MODES, RecomputeModule,
    RECOMPUTE_MODULES, DEEPSEEK_V3_RECOMPUTE, RECOMPUTE_MODULE_NEEDS, RECOMPUTE_MODULE_COVERS, _NEED_LAYERS,
    resolve_recompute, _has_part, TrainSchedule, TRAIN_SCHEDULES, StageSplit, STAGE_SPLITS
)



class TrainingSection(BaseModel):
    """The step model's knobs a scenario may set. Each acts on one part of the model and one parallel dimension
    (`k3sim.planner.inputs.TRAINING_NEEDS`): given for a model or (in `k3sim plan`) a layout without it, it is
    refused, not ignored.

    routing_skew: Zipf exponent of expert popularity (0 = uniform router; a modelling choice standing in
    for a measured router histogram). redundant_experts: MoonEP redundant expert slots per EP rank (0 =
    off). tp_overlap / ep_overlap: fraction of TP / EP communication hidden under compute (0 = none, the
    conservative default; Megatron's TP-comm-overlap and K2.5's EP overlap under interleaved 1F1B can raise
    it). kda_cp / mla_cp: CP schemes (k3sim.cp). moe_glue: "calibrated" (the measured unfused routing glue,
    `k3sim.step.glue`) or "proxy" (bytes-only: a stack with fused permute kernels, not measured)."""

    model_config = _STRICT
    routing_skew: Skew = Field(0.0, description="Zipf exponent of expert popularity (0 uniform)")
    redundant_experts: bounded_int("experts", lo=0) = Field(0, description="MoonEP redundant expert slots per "
                                                                            "EP rank")
    tp_overlap: Share = Field(0.0, description="share of TP communication hidden")
    ep_overlap: Share | None = Field(None, description="share of EP all-to-all hidden (None: computed from the "
                                                        "pipeline schedule)")
    kda_cp: Literal["kcp", "lasp2", "ulysses"] = "kcp"
    mla_cp: Literal["allgather-kv", "ring", "zigzag-ring", "ulysses"] = "allgather-kv"
    seed: bounded_int("seed") = Field(0, description="seed of the routing samples behind the EP imbalance")
    moe_glue: GlueMode = Field(
        "auto", description="MoE routing glue: auto (the model's published stack), calibrated (measured unfused, "
                            "reports/training), fused (measured fused permute kernels) or proxy (bytes only)")
    precision: Precision = Field("bf16", description="GEMM precision: bf16, or fp8 block-scaled (DeepSeek-V3)")
    recompute: RecomputeMode | None = Field(
        None, description="activation recompute: none | full | selective (None: workload.activation_checkpointing)")
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        (), description="modules recomputed under selective recompute (empty: DeepSeek-V3's norms + mla_up_proj)")
    pipeline_schedule: TrainSchedule = Field("auto", description="pipeline schedule (auto: 1F1B / interleaved)")
    stage_split: StageSplit = Field("balanced", description="layers over pipeline stages: balanced or uniform")
    tokens: bounded_float("train_tokens") | None = Field(None, description="token budget of the training run")
    days: bounded_float("train_days") | None = Field(None, description="wall-clock days the run may take")

    def options(self, use_pipeline_engine: bool | None = None) -> TrainOptions:
        """These knobs as the step model's options, with the run's pipeline clock (the planner: the engine;
        a sweep: the closed form)."""
        return TrainOptions(**self.model_dump(), use_pipeline_engine=use_pipeline_engine)


class TrainOptions(TrainingSection):
    """The options of `k3sim.training.train_step`: the scenario's knobs (`TrainingSection`, one definition)
    plus `use_pipeline_engine`, which the caller chooses and a scenario does not set (None = the pipeline
    engine when present, False = Megatron's closed form). Frozen and hashable, so it can key a memo.

    Built in Python, a value out of range raises `InputError` naming the field, as a scenario's does."""

    use_pipeline_engine: bool | None = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            from k3sim.configs.loaders import validation_error_line

            field, reason = validation_error_line(err)
            raise InputError(reason, field=field) from None


def check_redundant_experts(slots: int, experts: int, ep: int, source: str | None) -> None:
    """MoonEP slots per EP rank beyond the experts the rank does not hold change nothing (every rank then holds
    every expert) and cost a heap step each: refused (10^9 slots hung the balancer). Here, below the planner
    and the step model, because both check it: the planner for a scenario's own layout, the step model for
    every layout it is given."""
    cap = experts - experts // ep
    if slots > cap:
        raise InputError(f"{slots:,} redundant slots per EP rank exceed the {cap:,} routed experts a rank does "
                         f"not hold ({experts:,} - {experts:,}/ep={ep}): beyond that every rank holds every "
                         f"expert; give at most {cap:,}", source=source, field="training.redundant_experts")


# The dimensions of each mode's grid (`k3sim sweep`): the other mode's are refused by `Scenario`.
TRAIN_SWEEP_FIELDS = ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "num_micro_batches", "global_batch_sequences")
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
    num_micro_batches: list[Count] | None = Field(
        None, description="micro-batches per step; at a fixed global batch they set the micro-batch size")
    global_batch_sequences: list[Count] | None = Field(
        None, description="sequences per step (None: the scenario's dp x micro-batches x micro_batch_size)")
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
