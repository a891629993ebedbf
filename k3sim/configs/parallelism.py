"""The parallel layout schema (`Parallelism`), on its own so the serving schema can build on it without a
module cycle (`parallel.Scenario` holds a `serving.ServingConfig`, whose pools hold a `Parallelism`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from typing_extensions import Annotated

from k3sim.configs.bounds import _not_bool, bounded_int
from k3sim.configs.model import ModelConfig
from k3sim.errors import InputError

Degree = bounded_int("parallel")  # documented range (k3sim/configs/bounds.py); `tp: true` is refused, not read as 1
_STRICT = ConfigDict(extra="forbid", frozen=True)


class Parallelism(BaseModel):
    """Degrees of each parallel dimension.

    GPUs per replica = tp * pp * cp * dp. Expert parallelism is folded into the ranks of one pipeline
    stage (tp * cp * dp of them, as Megatron folds EP over DP/CP/TP), so `ep` must divide that product.
    """

    model_config = _STRICT
    tp: Degree = 1
    pp: Degree = 1
    virtual_stages: Degree = Field(1, description="model chunks per pipeline rank (interleaved 1F1B)")
    ep: Degree = 1
    cp: Degree = 1
    dp: Degree = 1
    zero_stage: Annotated[Literal[0, 1, 2, 3], BeforeValidator(_not_bool)] = Field(1, description="0 none, 1 optimizer, 2 +grads, 3 +weights over DP")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage: the group experts are spread over."""
        return self.tp * self.cp * self.dp

    def check_against(self, model: ModelConfig, source: str | None = None) -> None:
        """Raise InputError if this layout does not divide `model` (the model part of `check_layout`)."""

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
