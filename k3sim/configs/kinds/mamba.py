"""Mamba (Mamba-1, selective scan; Jamba): a diagonal state-space layer with d_state N per inner channel.

Parameters as in HF transformers' JambaMambaMixer (Gu & Dao, arXiv 2312.00752): in_proj d -> 2 d_inner
(x and the gate z; bias if `proj_bias`), a depthwise causal conv over d_inner (bias if `conv_bias`),
x_proj d_inner -> dt_rank + 2 N (dt, B, C), dt_proj dt_rank -> d_inner with bias, A_log (d_inner x N), D
(d_inner), out_proj d_inner -> d; Jamba adds RMSNorms on dt (dt_rank), B and C (N each) (`inner_norms`).
State per request: d_inner x N (Jamba-1.5-Mini 8192 x 16 x 4 B = 512 KiB per layer); conv state: the last
(kernel - 1) inputs of d_inner channels. TP splits d_inner (vLLM MambaMixer: column-parallel in_proj,
row-parallel x_proj and out_proj).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from k3sim.configs.kinds.base import STRICT, DType, MixerKind, Taps, TPRule, Width, dtype_bytes


class MambaConfig(BaseModel):
    """Mamba-1 mixer shapes."""

    model_config = STRICT
    inner_size: Width = Field(description="d_inner = HF mamba_expand x hidden_size")
    state_size: Width = Field(description="N (HF mamba_d_state)")
    dt_rank: Width = Field(description="HF mamba_dt_rank ('auto' = ceil(hidden / 16))")
    conv_kernel_size: Taps = Field(4, description="HF mamba_d_conv")
    conv_bias: bool = True
    proj_bias: bool = False
    inner_norms: bool = Field(False, description="RMSNorms on dt, B and C (Jamba)")
    state_dtype: DType = Field("fp32", description="SSM state dtype (fp32 default)")
    conv_state_dtype: DType = Field("bf16", description="dtype of the cached last (kernel-1) conv inputs")


class Mamba(MixerKind):
    name, title, letter, schema, recurrent = "mamba", "Mamba", "P", MambaConfig, True

    def params(self, cfg: MambaConfig, hidden: int) -> int:
        di, n, r = cfg.inner_size, cfg.state_size, cfg.dt_rank
        in_proj = hidden * 2 * di + (2 * di if cfg.proj_bias else 0)
        conv = di * cfg.conv_kernel_size + (di if cfg.conv_bias else 0)
        x_proj = di * (r + 2 * n)
        dt_proj = r * di + di
        ssm = di * n + di  # A_log, D
        out_proj = di * hidden + (hidden if cfg.proj_bias else 0)
        norms = r + 2 * n if cfg.inner_norms else 0
        return in_proj + conv + x_proj + dt_proj + ssm + out_proj + norms

    def tp_rules(self, cfg: MambaConfig) -> list[TPRule]:
        return [TPRule("Mamba inner channels", cfg.inner_size)]

    def state_bytes(self, cfg: MambaConfig, tp: int = 1, state_dtype: str | None = None) -> int:
        return dtype_bytes(cfg.inner_size // tp * cfg.state_size, state_dtype or cfg.state_dtype)

    def conv_state_bytes(self, cfg: MambaConfig, tp: int = 1) -> int:
        return dtype_bytes((cfg.conv_kernel_size - 1) * (cfg.inner_size // tp), cfg.conv_state_dtype)
