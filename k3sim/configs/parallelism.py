"""The parallel layout schema (`Parallelism`), on its own so the serving schema can build on it without a
module cycle (`parallel.Scenario` holds a `serving.ServingConfig`, whose pools hold a `Parallelism`)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from typing_extensions import Annotated

from k3sim.configs.bounds import _not_bool, bounded_float, bounded_int
from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import ModelConfig
from k3sim.errors import InputError

Degree = bounded_int("parallel")  # documented range (k3sim/configs/bounds.py); `tp: true` is refused, not read as 1
# Names of the expert-parallel all-to-all kernels and dispatch dtypes (k3sim.step.layout holds the same tuples
# with "auto"; the schema spells them as the CLI does, low-latency with a hyphen)
EP_KERNEL_NAMES = ("auto", "normal", "low-latency", "nccl")
DISPATCH_DTYPE_NAMES = ("auto", "fp8", "bf16")
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
    # Serving at scale (DeepEP, EPLB, TBO: docs/sources.md "Deployed serving")
    redundant_experts: bounded_int("experts", lo=0) = Field(
        0, description="extra routed-expert slots spread over the EP ranks (EPLB); ep must divide experts + these")
    ep_kernel: Literal["auto", "normal", "low-latency", "nccl"] = Field(
        "auto", description="expert all-to-all: DeepEP normal (hierarchical), low-latency (direct RDMA), NCCL; "
                            "auto = low-latency for decode-only steps, normal otherwise")
    dispatch_dtype: Literal["auto", "fp8", "bf16"] = Field(
        "auto", description="dispatch payload (combine is bf16); auto = fp8 where the profile has FP8")
    max_nodes_per_token: Optional[bounded_int("parallel")] = Field(
        None, description="node-limited routing: a token's experts on at most this many nodes (DeepSeek-V3: 4)")
    tbo: bool = Field(False, description="two-batch overlap: two micro-batches, one's compute against the "
                                          "other's all-to-all")
    tbo_variant: Literal["auto", "overlap", "five-stage"] = Field(
        "auto", description="TBO schedule: overlap (SGLang prefill), five-stage (DeepSeek decode); auto by phase")
    mla_decode_kernel: Literal["measured", "flashmla"] = Field(
        "measured", description="absorbed MLA decode: the measured Triton kernel, or FlashMLA from its published "
                                "throughput (capped by the measured kernel)")
    routing_zipf: bounded_float("zipf_exponent") = Field(
        0.0, description="expert popularity Zipf exponent over a seeded ranking (0 = uniform routing)")

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

        for kind in model.mixer_kinds:  # what each kind's TP split needs (heads, KV heads, groups, channels)
            reason = MIXERS[kind].tp_problem(model.section(kind), self.tp)
            if reason:
                fail("tp", reason)
        if model.moe is not None:
            experts = model.moe.num_routed_experts
            slots = experts + self.redundant_experts
            if self.ep > slots:
                fail("ep", f"ep={self.ep} is larger than the {experts} routed experts + {self.redundant_experts} "
                     f"redundant slots: every EP rank needs a slot (at most {slots}, or add redundant_experts)")
            if slots % self.ep:
                fix = (f"choose an ep that divides {slots}, or set redundant_experts so that ep divides experts + "
                       f"redundant (e.g. {-slots % self.ep + self.redundant_experts})")
                what = (f"the {experts} routed experts" if not self.redundant_experts else
                        f"the {experts} routed experts + {self.redundant_experts} redundant slots = {slots}")
                fail("ep", f"ep={self.ep} does not divide {what}: {fix}")
            if self.stage_gpus % self.ep:
                fail("ep", f"ep={self.ep} does not divide the tp*cp*dp={self.stage_gpus} GPUs of a stage")
        else:
            if self.ep > 1:
                fail("ep", f"ep={self.ep} but model '{model.name}' has no MoE layers")
            if self.redundant_experts:
                fail("redundant_experts", f"model '{model.name}' has no MoE layers: remove redundant_experts")
        chunks = self.pp * self.virtual_stages
        if chunks > model.num_layers:
            fail("pp", f"pp*virtual_stages={chunks} exceeds the {model.num_layers} layers")
