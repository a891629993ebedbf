"""Mamba2 (SSD; Nemotron-H, Nemotron 3, Granite-4.0-H, Falcon-H1): a selective state-space layer whose
transition is a scalar decay per head, with B and C shared by the heads of a group.

Parameters as in HF transformers' NemotronHMamba2Mixer / GraniteMoeHybrid's Mamba2 mixer (Dao & Gu,
arXiv 2405.21060): in_proj d -> 2 d_inner + 2 G N + H (z, x, B, C, dt; bias if `proj_bias`), a depthwise
causal conv over x, B, C (d_inner + 2 G N channels, bias if `conv_bias`), dt_bias, A_log and D per head,
the gated RMSNorm over d_inner (absent in Falcon-H1 without `mamba_rms_norm`), out_proj d_inner -> d, with
d_inner = H x P (heads x head_dim). State per request: H x P x N (the d_state N per head dim);
Nemotron-H-56B 256 x 64 x 256 x 4 B = 16 MiB per layer. Conv state: the last (kernel - 1) conv inputs.
TP (vLLM MambaMixer2): "Tensor parallel world size must divide num heads", and n_groups must divide by
it or be 1 (then every rank holds the one group whole, its B, C and their conv channels replicated).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from k3sim.configs.kinds.base import STRICT, DType, Heads, MixerKind, Taps, TPRule, Width, dtype_bytes


class Mamba2Config(BaseModel):
    """Mamba2 mixer shapes: H heads of dim P, G groups of B/C with state size N."""

    model_config = STRICT
    num_heads: Heads = Field(description="H (HF mamba_num_heads / mamba_n_heads)")
    head_dim: Width = Field(description="P (HF mamba_head_dim / mamba_d_head); d_inner = H x P")
    state_size: Width = Field(description="N (HF ssm_state_size / mamba_d_state)")
    n_groups: Heads = Field(1, description="G groups sharing B and C (HF n_groups / mamba_n_groups)")
    conv_kernel_size: Taps = Field(4, description="HF conv_kernel / mamba_d_conv")
    conv_bias: bool = True
    proj_bias: bool = False
    gated_norm: bool = Field(True, description="gated RMSNorm over d_inner before out_proj")
    state_dtype: DType = Field("fp32", description="SSM state dtype (HF mamba_ssm_cache_dtype; fp32 default)")
    conv_state_dtype: DType = Field("bf16", description="dtype of the cached last (kernel-1) conv inputs")


class Mamba2(MixerKind):
    name, title, letter, schema, recurrent = "mamba2", "Mamba2", "S", Mamba2Config, True

    def params(self, cfg: Mamba2Config, hidden: int) -> int:
        inner, bc = cfg.num_heads * cfg.head_dim, 2 * cfg.n_groups * cfg.state_size
        proj = 2 * inner + bc + cfg.num_heads
        in_proj = hidden * proj + (proj if cfg.proj_bias else 0)
        conv_ch = inner + bc
        conv = conv_ch * cfg.conv_kernel_size + (conv_ch if cfg.conv_bias else 0)
        per_head = 3 * cfg.num_heads  # dt_bias, A_log, D
        norm = inner if cfg.gated_norm else 0
        out_proj = inner * hidden + (hidden if cfg.proj_bias else 0)
        return in_proj + conv + per_head + norm + out_proj

    def tp_rules(self, cfg: Mamba2Config) -> list[TPRule]:
        return [TPRule("Mamba2 heads", cfg.num_heads), TPRule("Mamba2 groups", cfg.n_groups, "divide_or_one")]

    def state_bytes(self, cfg: Mamba2Config, tp: int = 1, state_dtype: str | None = None) -> int:
        return dtype_bytes(cfg.num_heads // tp * cfg.head_dim * cfg.state_size, state_dtype or cfg.state_dtype)

    def conv_state_bytes(self, cfg: Mamba2Config, tp: int = 1) -> int:
        """(kernel - 1) x (d_inner / tp + 2 x groups per rank x N): a single group is held whole by every rank."""
        groups = self.tp_rules(cfg)[1].per_rank(tp)
        channels = cfg.num_heads // tp * cfg.head_dim + 2 * groups * cfg.state_size
        return dtype_bytes((cfg.conv_kernel_size - 1) * channels, cfg.conv_state_dtype)
