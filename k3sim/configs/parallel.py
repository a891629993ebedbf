"""Parallel layout, cluster and workload schemas, and the scenario that ties them to a model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from k3sim.configs.model import ModelConfig
from k3sim.errors import InputError

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Parallelism(BaseModel):
    """Degrees of each parallel dimension.

    GPUs per replica = tp * pp * cp * dp. Expert parallelism is folded into the ranks of one pipeline
    stage (tp * cp * dp of them, as Megatron folds EP over DP/CP/TP), so `ep` must divide that product.
    """

    model_config = _STRICT
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    virtual_stages: PositiveInt = Field(1, description="model chunks per pipeline rank (interleaved 1F1B)")
    ep: PositiveInt = 1
    cp: PositiveInt = 1
    dp: PositiveInt = 1
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="0 none, 1 optimizer, 2 +grads, 3 +weights over DP")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage: the group experts are spread over."""
        return self.tp * self.cp * self.dp

    def check_against(self, model: ModelConfig, source: str | None = None) -> None:
        """Raise InputError if this layout does not divide `model`."""

        def fail(field: str, reason: str) -> None:
            raise InputError(reason, source=source, field=field)

        for kind, cfg in (("kda", model.kda), ("mla", model.mla)):
            if cfg is not None and cfg.num_heads % self.tp:
                fail("tp", f"tp={self.tp} does not divide the {cfg.num_heads} {kind.upper()} heads")
        if model.moe is not None:
            experts = model.moe.num_routed_experts
            if experts % self.ep:
                fail("ep", f"ep={self.ep} does not divide the {experts} routed experts")
            if self.stage_gpus % self.ep:
                fail("ep", f"ep={self.ep} does not divide the tp*cp*dp={self.stage_gpus} GPUs of a stage")
        elif self.ep > 1:
            fail("ep", f"ep={self.ep} but model '{model.name}' has no MoE layers")
        chunks = self.pp * self.virtual_stages
        if chunks > model.num_layers:
            fail("pp", f"pp*virtual_stages={chunks} exceeds the {model.num_layers} layers")


class Cluster(BaseModel):
    """The GPUs available (their kind is the scenario's `hardware`)."""

    model_config = _STRICT
    num_gpus: PositiveInt
    gpus_per_node: PositiveInt = 8


class Workload(BaseModel):
    """What the cluster runs. serve: requests of `context_tokens`; train: sequences of that length."""

    model_config = _STRICT
    mode: Literal["serve", "train"]
    context_tokens: PositiveInt = Field(description="serve: context per request; train: sequence length")
    prefill_chunk_tokens: PositiveInt = Field(8192, description="serve: tokens per chunked-prefill step")
    micro_batch_size: PositiveInt = Field(1, description="train: sequences per micro-batch")
    num_micro_batches: PositiveInt | None = Field(None, description="train: per step; None = pp*virtual")
    activation_checkpointing: bool = Field(True, description="train: full per-layer recompute")
    workspace_fraction: float = Field(
        0.10, ge=0, lt=1, allow_inf_nan=False,
        description="HBM share reserved for CUDA context, NCCL buffers, temporaries")


class Scenario(BaseModel):
    """A what-if: model file, hardware, cluster, parallel layout, workload."""

    model_config = _STRICT
    name: str
    description: str | None = None
    model: str = Field(description="model file (our YAML or HF config.json), relative to the scenario")
    hardware: str = Field(description="hardware profile name (hardware_profiles/<name>.yaml) or path")
    cluster: Cluster
    parallelism: Parallelism
    workload: Workload
    serving: ServingConfig | None = None  # k3sim serve: replicas, engine, router, P/D pools (configs/serving.py)

    @property
    def replicas(self) -> int:
        """Model replicas the cluster holds: num_gpus / (tp * pp * cp * dp), exact by validation."""
        return self.cluster.num_gpus // self.parallelism.gpus

    @model_validator(mode="after")
    def _fits_cluster(self) -> "Scenario":
        if self.cluster.num_gpus % self.parallelism.gpus:
            raise ValueError(
                f"cluster.num_gpus={self.cluster.num_gpus} is not a multiple of "
                f"tp*pp*cp*dp={self.parallelism.gpus}")
        return self


# serving.py builds on Parallelism above, so it is imported once this module's classes exist
from k3sim.configs.serving import ServingConfig  # noqa: E402

Scenario.model_rebuild()
