"""Gated DeltaNet (Qwen3-Next, Qwen3.5): linear attention with a delta-rule update and a scalar decay per
value head, and grouped value heads (HV value heads share HK < HV key heads, like GQA's groups).

Parameters as in HF transformers' Qwen3NextGatedDeltaNet: in_proj_qkvz (d -> 2 HK d_k + 2 HV d_v: q, k, v
and the output gate z), in_proj_ba (d -> 2 HV: beta and the decay input), a depthwise causal conv over the
q, k, v channels (2 HK d_k + HV d_v, no bias), dt_bias and A_log per value head, the gated RMSNorm over d_v,
out_proj (HV d_v -> d). Qwen3.5 splits in_proj_qkvz into in_proj_qkv and in_proj_z: the same count.
State per request: one d_k x d_v matrix per value head (fla `chunk_gated_delta_rule` with HV > HK keeps
HV states); Qwen3-Next 32 x 128 x 128 x 4 B = 2 MiB per layer. Conv state: the last (kernel - 1) inputs of
the conv channels. TP splits the key heads and the value heads (vLLM's Qwen3NextGatedDeltaNet divides both
by the TP size).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from k3sim.configs.kinds.base import STRICT, DType, Heads, MixerKind, Taps, TPRule, Width, dtype_bytes


class GDNConfig(BaseModel):
    """Gated DeltaNet with grouped value heads."""

    model_config = STRICT
    num_key_heads: Heads = Field(description="HF linear_num_key_heads")
    num_value_heads: Heads = Field(description="HF linear_num_value_heads (a multiple of the key heads)")
    head_dim_k: Width = Field(description="HF linear_key_head_dim")
    head_dim_v: Width = Field(description="HF linear_value_head_dim")
    conv_kernel_size: Taps = Field(4, description="HF linear_conv_kernel_dim")
    state_dtype: DType = Field("fp32", description="recurrent state dtype (HF mamba_ssm_dtype; fla keeps fp32)")
    conv_state_dtype: DType = Field("bf16", description="dtype of the cached last (kernel-1) conv inputs")

    @model_validator(mode="after")
    def _grouped(self) -> "GDNConfig":
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"num_value_heads {self.num_value_heads} is not a multiple of num_key_heads "
                             f"{self.num_key_heads} (each key head serves a whole group of value heads)")
        return self


class GDN(MixerKind):
    name, title, letter, schema, recurrent = "gdn", "GDN", "G", GDNConfig, True

    @staticmethod
    def _conv_channels(cfg: GDNConfig, tp: int = 1) -> int:
        return (2 * cfg.num_key_heads * cfg.head_dim_k + cfg.num_value_heads * cfg.head_dim_v) // tp

    def params(self, cfg: GDNConfig, hidden: int) -> int:
        key, value = cfg.num_key_heads * cfg.head_dim_k, cfg.num_value_heads * cfg.head_dim_v
        in_qkvz = hidden * (2 * key + 2 * value)
        in_ba = hidden * 2 * cfg.num_value_heads
        conv = self._conv_channels(cfg) * cfg.conv_kernel_size
        decay = 2 * cfg.num_value_heads  # dt_bias, A_log
        norm = cfg.head_dim_v
        out = value * hidden
        return in_qkvz + in_ba + conv + decay + norm + out

    def tp_rules(self, cfg: GDNConfig) -> list[TPRule]:
        return [TPRule("GDN key heads", cfg.num_key_heads), TPRule("GDN value heads", cfg.num_value_heads)]

    def state_bytes(self, cfg: GDNConfig, tp: int = 1, state_dtype: str | None = None) -> int:
        return dtype_bytes(cfg.num_value_heads // tp * cfg.head_dim_k * cfg.head_dim_v,
                           state_dtype or cfg.state_dtype)

    def conv_state_bytes(self, cfg: GDNConfig, tp: int = 1) -> int:
        return dtype_bytes((cfg.conv_kernel_size - 1) * self._conv_channels(cfg, tp), cfg.conv_state_dtype)
