"""Grouped-query softmax attention (GQA; MHA and MQA are its ends), with the variants the hybrid models use:
an output gate (Qwen3-Next / Qwen3.5: q_proj also emits a per-channel sigmoid gate, so it is twice as wide),
partial RoPE (`rope_fraction`: Qwen3-Next rotates 1/4 of each head, MiniMax 64 of 128 dims, Granite-4.0-H
and Jamba none), per-head q/k RMSNorm (Qwen3). And sliding-window attention (`swa`), the same layer keeping
at most `window_tokens` tokens of KV.

Parameters as in HF transformers' Qwen3NextAttention / LlamaAttention: q (x2 with the gate), k, v, o, the
q/k norms (head_dim each) and the qkv biases where `qkv_bias`. KV cache: 2 x kv_heads x head_dim per
token. TP splits the query heads and the KV heads; with more ranks than KV heads each rank holds one copy
of a KV head (vLLM `QKVParallelLinear`: `num_kv_head_replicas = tp_size // total_num_kv_heads`), so the
KV per token per rank stops shrinking at one head.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from k3sim.configs.bounds import bounded_float, bounded_int
from k3sim.configs.kinds.base import STRICT, DType, Heads, MixerKind, TPRule, Width, dtype_bytes


class GQAConfig(BaseModel):
    """Grouped-query attention: `num_heads` query heads share `num_kv_heads` key/value heads."""

    model_config = STRICT
    num_heads: Heads
    num_kv_heads: Heads
    head_dim: Width
    output_gate: bool = Field(False, description="sigmoid output gate from q_proj (Qwen3-Next attn_output_gate)")
    rope_fraction: bounded_float("fraction") = Field(
        1.0, description="share of each head's dims rotated by RoPE (partial_rotary_factor; 0 = no RoPE)")
    qk_norm: bool = Field(False, description="per-head RMSNorm on q and k (Qwen3)")
    qkv_bias: bool = Field(False, description="biases on q, k, v (HF attention_bias)")
    kv_cache_dtype: DType = "bf16"

    @model_validator(mode="after")
    def _kv_groups(self) -> "GQAConfig":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} does not divide num_heads {self.num_heads} "
                             "(each KV head serves a whole group of query heads)")
        return self


class SWAConfig(GQAConfig):
    """Sliding-window attention: a GQA layer that attends to (and caches) the last `window_tokens` tokens."""

    window_tokens: bounded_int("tokens") = Field(description="sliding window (HF sliding_window), tokens")


class GQA(MixerKind):
    name, title, letter, schema = "gqa", "GQA", "A", GQAConfig

    def params(self, cfg: GQAConfig, hidden: int) -> int:
        h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q = hidden * h * hd * (2 if cfg.output_gate else 1)
        k_v = 2 * hidden * kv * hd
        o = h * hd * hidden
        norms = 2 * hd if cfg.qk_norm else 0
        bias = (h + 2 * kv) * hd if cfg.qkv_bias else 0
        return q + k_v + o + norms + bias

    def tp_rules(self, cfg: GQAConfig) -> list[TPRule]:
        return [TPRule(f"{self.title} query heads", cfg.num_heads),
                TPRule(f"{self.title} key/value heads", cfg.num_kv_heads, "divide_or_multiple")]

    def kv_bytes_per_token(self, cfg: GQAConfig, tp: int = 1) -> int:
        """K and V of the KV heads one rank holds; Qwen3-Next: 2 x 2 x 256 x 2 B = 2 KiB per layer at tp 1."""
        heads = self.tp_rules(cfg)[1].per_rank(tp)
        return dtype_bytes(2 * heads * cfg.head_dim, cfg.kv_cache_dtype)


class SWA(GQA):
    name, title, letter, schema = "swa", "SWA", "W", SWAConfig

    def window_tokens(self, cfg: SWAConfig) -> int | None:
        return cfg.window_tokens
