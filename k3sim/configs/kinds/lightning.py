"""Lightning attention (MiniMax-Text-01 / MiniMax-M1, arXiv 2501.08313): linear attention with a fixed
per-head exponential decay (ALiBi-like slopes), so the state per head is one d x d matrix.

Parameters as in HF transformers' MiniMaxLightningAttention: qkv_proj d -> 3 H d_h, output_gate
d -> H d_h, an RMSNorm over H d_h, out_proj H d_h -> d; the decay slopes are computed, not learned. No
short conv. State per request: H x d_h x d_h (MiniMax-M1: 64 x 128 x 128 x 4 B = 4 MiB per layer). TP
splits the heads (vLLM's MiniMaxText01LinearAttention shards heads).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from k3sim.configs.kinds.base import STRICT, DType, Heads, MixerKind, TPRule, Width, dtype_bytes


class LightningConfig(BaseModel):
    """Lightning attention shapes: H heads of dim d_h (q, k and v share it)."""

    model_config = STRICT
    num_heads: Heads
    head_dim: Width
    state_dtype: DType = Field("fp32", description="recurrent state dtype (fp32 default)")


class Lightning(MixerKind):
    name, title, letter, schema, recurrent = "lightning", "lightning", "L", LightningConfig, True

    def params(self, cfg: LightningConfig, hidden: int) -> int:
        inner = cfg.num_heads * cfg.head_dim
        return hidden * 3 * inner + hidden * inner + inner + inner * hidden  # qkv, gate, norm, out

    def tp_rules(self, cfg: LightningConfig) -> list[TPRule]:
        return [TPRule("lightning heads", cfg.num_heads)]

    def state_bytes(self, cfg: LightningConfig, tp: int = 1, state_dtype: str | None = None) -> int:
        return dtype_bytes(cfg.num_heads // tp * cfg.head_dim * cfg.head_dim, state_dtype or cfg.state_dtype)
