"""Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds the compressed latent and one shared RoPE
key per token.

Parameters as in DeepSeek-V3 (arXiv 2412.19437 sec. 2.1.1): q_a / q_a_norm / q_b (or a direct q projection
without q LoRA), kv_a with the rope key and kv_a_norm, kv_b, o, plus K3's sigmoid output gate. The latent is
shared by all heads, so under TP every rank caches all of it (vLLM / SGLang MLA): the KV per token does not
divide by TP. TP splits the heads.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from k3sim.configs.kinds.base import STRICT, DType, Heads, MixerKind, TPRule, Width, dtype_bytes


class MLAConfig(BaseModel):
    """Multi-head latent attention (DeepSeek-V2 style); the KV cache holds kv_lora + rope per token."""

    model_config = STRICT
    num_heads: Heads
    q_lora_rank: Width | None = Field(None, description="None = direct q projection")
    kv_lora_rank: Width
    qk_nope_head_dim: Width
    qk_rope_head_dim: Width
    v_head_dim: Width
    kv_cache_dtype: DType = "bf16"
    output_gate: bool = Field(False, description="K3 gated MLA: sigmoid gate d -> heads*v_head_dim")


class MLA(MixerKind):
    name, title, letter, schema = "mla", "MLA", "M", MLAConfig

    def params(self, cfg: MLAConfig, hidden: int) -> int:
        d, h, qk = hidden, cfg.num_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank is None:
            q = d * h * qk
        else:
            q = d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * h * qk  # q_a, q_a_norm, q_b
        kv_a = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank  # + kv_a_norm
        kv_b = cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        o = h * cfg.v_head_dim * d
        gate = d * h * cfg.v_head_dim if cfg.output_gate else 0
        return q + kv_a + kv_b + o + gate

    def tp_rules(self, cfg: MLAConfig) -> list[TPRule]:
        return [TPRule("MLA heads", cfg.num_heads)]

    def kv_bytes_per_token(self, cfg: MLAConfig, tp: int = 1) -> int:
        """kv_lora_rank + qk_rope_head_dim elements, on every TP rank; K3: (512 + 64) x 2 B = 1,152 B."""
        return dtype_bytes(cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.kv_cache_dtype)
