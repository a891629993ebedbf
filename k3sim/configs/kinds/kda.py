"""Kimi Delta Attention: linear attention with one d_k x d_v recurrent state per head.

Shapes as in fla `KimiDeltaAttention` / Kimi-Linear (arXiv 2510.26692): q, k, v projections, a depthwise
short conv on each, the per-channel decay-gate projection (full rank or low rank f_a/f_b), beta, A_log,
dt_bias, the output gate (low rank g_a/g_b), o_norm, o_proj. TP splits the heads (vLLM's KDA layer shards
q/k/v, the gates and the state by head).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from k3sim.configs.kinds.base import STRICT, DType, Heads, MixerKind, Taps, TPRule, Width, dtype_bytes


class KDAConfig(BaseModel):
    """Kimi Delta Attention (linear attention with a per-head d_k x d_v recurrent state)."""

    model_config = STRICT
    num_heads: Heads
    head_dim_k: Width
    head_dim_v: Width
    conv_kernel_size: Taps = Field(4, description="short causal conv width (tokens) on q, k, v")
    state_dtype: DType = Field("fp32", description="recurrent state dtype (fla keeps it in fp32)")
    conv_state_dtype: DType = Field("bf16", description="dtype of the cached last (kernel-1) conv inputs")
    alpha_gate_rank: Width | None = Field(
        None, description="low-rank width of the per-channel decay gate projection; None = full rank "
        "(K3 `use_full_rank_gate: true`; Kimi-Linear f_a/f_b use head_dim)")
    output_gate_rank: Width | None = Field(
        None, description="low-rank width of the output gate projection (g_a/g_b); None = full rank")


class KDA(MixerKind):
    name, title, letter, schema, recurrent = "kda", "KDA", "K", KDAConfig, True

    def params(self, cfg: KDAConfig, hidden: int) -> int:
        d, h, dk, dv = hidden, cfg.num_heads, cfg.head_dim_k, cfg.head_dim_v
        qkv = d * h * (2 * dk + dv)
        conv = cfg.conv_kernel_size * h * (2 * dk + dv)  # depthwise, no bias
        r = cfg.alpha_gate_rank
        alpha_gate = d * h * dk if r is None else d * r + r * h * dk
        beta = d * h
        decay = h + h * dk  # A_log per head, dt_bias per channel
        r = cfg.output_gate_rank
        out_gate = d * h * dv if r is None else d * r + r * h * dv
        o_norm = dv
        o_proj = h * dv * d
        return qkv + conv + alpha_gate + beta + decay + out_gate + o_norm + o_proj

    def tp_rules(self, cfg: KDAConfig) -> list[TPRule]:
        return [TPRule("KDA heads", cfg.num_heads)]

    def state_bytes(self, cfg: KDAConfig, tp: int = 1, state_dtype: str | None = None) -> int:
        """heads x d_k x d_v elements (one S matrix per head); K3: 96 x 128 x 128 x 4 B = 6 MiB per layer."""
        return dtype_bytes(cfg.num_heads // tp * cfg.head_dim_k * cfg.head_dim_v, state_dtype or cfg.state_dtype)

    def conv_state_bytes(self, cfg: KDAConfig, tp: int = 1) -> int:
        """The last (kernel - 1) inputs of the q, k and v convolutions (heads x (2 d_k + d_v) channels)."""
        channels = cfg.num_heads // tp * (2 * cfg.head_dim_k + cfg.head_dim_v)
        return dtype_bytes((cfg.conv_kernel_size - 1) * channels, cfg.conv_state_dtype)
