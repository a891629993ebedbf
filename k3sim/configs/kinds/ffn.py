"""FFN kinds: a dense (GLU or plain) MLP, and a (Latent)MoE with routed and shared experts.

Matrices per FFN: 3 for a gated (GLU: gate, up, down; SwiGLU in Kimi, DeepSeek, Qwen, Granite, Jamba,
MiniMax) and 2 for a plain one (up, down: Nemotron-H's and Nemotron 3's squared ReLU), `ModelConfig.ffn_gated`
for the dense FFN, the shared and the routed experts alike. MoE (DeepSeek-V3 sec. 2.1.2; Qwen3-Next;
Nemotron 3): E routed experts of width F, top-k per token, `num_shared_experts` always-on experts of width
`shared_expert_ffn_width`, optionally scaled by a sigmoid gate d -> 1 (Qwen3-Next `shared_expert_gate`);
a router d -> E with a score-correction bias for noaux_tc routing (`router_bias`), whose scores are a
softmax (Qwen, Jamba, Granite, MiniMax) or a sigmoid (DeepSeek-V3, Kimi, Nemotron 3) (`router_score`; the
count does not depend on it); LatentMoE (K3, Nemotron 3 Super `moe_latent_size`): the routed experts run in
a latent of width `latent_width`, with a down- and an up-projection d <-> latent (and K3's RMSNorm on the
latent), the router reading the full hidden state.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from k3sim.configs.bounds import bounded_int
from k3sim.configs.kinds.base import STRICT, DType, Width

Experts = bounded_int("experts")
ExpertCount = bounded_int("experts", lo=0)
ROUTED = "routed_experts"


class MoEConfig(BaseModel):
    """(Latent) MoE FFN. With `latent_width` the routed experts run in a down-projected latent space."""

    model_config = STRICT
    num_routed_experts: Experts
    num_active_experts: Experts = Field(description="routed experts per token (top-k)")
    num_shared_experts: ExpertCount = 0
    expert_ffn_width: Width = Field(description="intermediate width of one routed expert")
    shared_expert_ffn_width: Width | None = Field(
        None, description="intermediate width of one shared expert; None = expert_ffn_width")
    shared_expert_gate: bool = Field(False, description="sigmoid gate d -> 1 on the shared experts (Qwen3-Next)")
    latent_width: Width | None = Field(None, description="None = no latent projection")
    latent_norm: bool = Field(False, description="RMSNorm on the latent (K3 latent_moe_use_norm)")
    router_score: Literal["sigmoid", "softmax"] = Field(
        "sigmoid", description="router score function (DeepSeek-V3 / Kimi sigmoid; Qwen, Jamba, MiniMax softmax)")
    router_bias: bool = Field(True, description="per-expert score-correction bias (noaux_tc)")
    routed_weight_format: DType = "bf16"
    max_nodes_per_token: Experts | None = Field(
        None, description="node-limited (group-limited) routing: a token's experts on at most this many nodes "
                          "(None: unlimited); the EP all-to-all of training reads it (cite the source in the YAML)")

    @model_validator(mode="after")
    def _topk_le_experts(self) -> "MoEConfig":
        if self.num_active_experts > self.num_routed_experts:
            raise ValueError("num_active_experts exceeds num_routed_experts")
        return self


class FFNKind:
    """An FFN kind: its parameters per layer by component, total and active per token."""

    name: ClassVar[str] = ""

    def params(self, model: Any) -> dict[str, int]:
        raise NotImplementedError

    def active(self, model: Any) -> dict[str, int]:
        """Parameters a token is multiplied with, by component (all of them unless routed)."""
        return self.params(model)


def matrices(model: Any) -> int:
    """Weight matrices of one FFN: 3 for a GLU (gate, up, down), 2 for a plain MLP (up, down)."""
    return 3 if getattr(model, "ffn_gated", True) else 2


class Dense(FFNKind):
    name = "dense"

    def params(self, model: Any) -> dict[str, int]:
        return {"dense_ffn": matrices(model) * model.hidden_size * model.dense_ffn_width}


class MoE(FFNKind):
    name = "moe"

    @staticmethod
    def routed_expert_params(model: Any) -> int:
        """One routed expert over the latent (or hidden) width."""
        return matrices(model) * (model.moe.latent_width or model.hidden_size) * model.moe.expert_ffn_width

    def params(self, model: Any) -> dict[str, int]:
        moe, d = model.moe, model.hidden_size
        e = moe.num_routed_experts
        shared_w = moe.shared_expert_ffn_width or moe.expert_ffn_width
        shared = moe.num_shared_experts * matrices(model) * d * shared_w
        if moe.num_shared_experts and moe.shared_expert_gate:
            shared += d
        latent = 0
        if moe.latent_width:
            latent = 2 * d * moe.latent_width + (moe.latent_width if moe.latent_norm else 0)
        return {
            ROUTED: e * self.routed_expert_params(model),
            "shared_experts": shared,
            "latent_projections": latent,
            "router": d * e + (e if moe.router_bias else 0),
        }

    def active(self, model: Any) -> dict[str, int]:
        out = self.params(model)
        out[ROUTED] = model.moe.num_active_experts * self.routed_expert_params(model)
        return out
