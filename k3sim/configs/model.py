"""Model architecture schema: which layer is KDA or MLA, dense or MoE, and each block's shapes.

Field names follow the published Hugging Face configs where one exists (see `hf.py` for the mapping).
All sizes are element counts (widths, heads, ranks); dtypes are names understood by `dtypes.py`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PositiveInt, model_validator

from k3sim.configs.dtypes import check_dtype

DType = Annotated[str, AfterValidator(check_dtype)]
_STRICT = ConfigDict(extra="forbid", frozen=True)


class KDAConfig(BaseModel):
    """Kimi Delta Attention (linear attention with a per-head d_k x d_v recurrent state)."""

    model_config = _STRICT
    num_heads: PositiveInt
    head_dim_k: PositiveInt
    head_dim_v: PositiveInt
    conv_kernel_size: PositiveInt = Field(4, description="short causal conv width (tokens) on q, k, v")
    state_dtype: DType = Field("fp32", description="recurrent state dtype (fla keeps it in fp32)")
    conv_state_dtype: DType = Field("bf16", description="dtype of the cached last (kernel-1) conv inputs")
    alpha_gate_rank: PositiveInt | None = Field(
        None, description="low-rank width of the per-channel decay gate projection; None = full rank "
        "(K3 `use_full_rank_gate: true`; Kimi-Linear f_a/f_b use head_dim)")
    output_gate_rank: PositiveInt | None = Field(
        None, description="low-rank width of the output gate projection (g_a/g_b); None = full rank")


class MLAConfig(BaseModel):
    """Multi-head latent attention (DeepSeek-V2 style); the KV cache holds kv_lora + rope per token."""

    model_config = _STRICT
    num_heads: PositiveInt
    q_lora_rank: PositiveInt | None = Field(None, description="None = direct q projection")
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt
    kv_cache_dtype: DType = "bf16"
    output_gate: bool = Field(False, description="K3 gated MLA: sigmoid gate d -> heads*v_head_dim")


class MoEConfig(BaseModel):
    """(Latent) MoE FFN. With `latent_width` the routed experts run in a down-projected latent space."""

    model_config = _STRICT
    num_routed_experts: PositiveInt
    num_active_experts: PositiveInt = Field(description="routed experts per token (top-k)")
    num_shared_experts: int = Field(0, ge=0)
    expert_ffn_width: PositiveInt = Field(description="intermediate width of one routed expert")
    shared_expert_ffn_width: PositiveInt | None = Field(
        None, description="intermediate width of one shared expert; None = expert_ffn_width")
    latent_width: PositiveInt | None = Field(None, description="None = no latent projection")
    latent_norm: bool = Field(False, description="RMSNorm on the latent (K3 latent_moe_use_norm)")
    router_bias: bool = Field(True, description="per-expert score-correction bias (noaux_tc)")
    routed_weight_format: DType = "bf16"

    @model_validator(mode="after")
    def _topk_le_experts(self) -> "MoEConfig":
        if self.num_active_experts > self.num_routed_experts:
            raise ValueError("num_active_experts exceeds num_routed_experts")
        return self


class VisionConfig(BaseModel):
    """ViT encoder tower (MoonViT). Parameter count covers patch embedding + transformer layers."""

    model_config = _STRICT
    num_layers: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_heads: PositiveInt
    patch_size: PositiveInt
    num_channels: PositiveInt = 3
    mlp_gated: bool = False


class ModelConfig(BaseModel):
    """A hybrid KDA/MLA (Latent)MoE language model.

    Layer pattern: `full_attn_layers` lists the 1-based MLA layers (as in config.json's
    `linear_attn_config.full_attn_layers`); every other layer is KDA. None means all layers are MLA
    (K2). The first `first_k_dense` layers use a dense FFN of width `dense_ffn_width`; the rest are MoE.
    """

    model_config = _STRICT
    name: str
    source: str | None = Field(None, description="where the numbers come from")
    hidden_size: PositiveInt
    num_layers: PositiveInt
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    full_attn_layers: list[PositiveInt] | None = None
    first_k_dense: int = Field(0, ge=0)
    dense_ffn_width: PositiveInt | None = None
    weight_format: DType = Field("bf16", description="non-routed linear weights")
    embedding_format: DType = "bf16"
    activation_dtype: DType = "bf16"
    kda: KDAConfig | None = None
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    attn_res_block_size: PositiveInt | None = Field(None, description="layers per Block-AttnRes block")
    vision: VisionConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ModelConfig":
        L = self.num_layers
        if self.full_attn_layers is not None:
            bad = [i for i in self.full_attn_layers if i > L]
            if bad:
                raise ValueError(f"full_attn_layers {bad} beyond num_layers {L} (indices are 1-based)")
            if len(set(self.full_attn_layers)) != len(self.full_attn_layers):
                raise ValueError("full_attn_layers has duplicates")
        kinds = self.layer_kinds
        if "kda" in kinds and self.kda is None:
            raise ValueError("kda section missing but the layer pattern has KDA layers")
        if "mla" in kinds and self.mla is None:
            raise ValueError("mla section missing but the layer pattern has MLA layers")
        if self.first_k_dense > L:
            raise ValueError(f"first_k_dense {self.first_k_dense} exceeds num_layers {L}")
        if "dense" in self.ffn_kinds and self.dense_ffn_width is None:
            raise ValueError("dense_ffn_width is not set but there are dense FFN layers")
        if "moe" in self.ffn_kinds and self.moe is None:
            raise ValueError("moe section missing but there are MoE layers")
        return self

    @property
    def layer_kinds(self) -> list[Literal["kda", "mla"]]:
        """Attention kind of each layer, 0-based list."""
        if self.full_attn_layers is None:
            return ["mla"] * self.num_layers
        mla = set(self.full_attn_layers)
        return ["mla" if i + 1 in mla else "kda" for i in range(self.num_layers)]

    @property
    def ffn_kinds(self) -> list[Literal["dense", "moe"]]:
        """FFN kind of each layer: the first `first_k_dense` are dense (HF first_k_dense_replace)."""
        if self.moe is None:
            return ["dense"] * self.num_layers
        return ["dense" if i < self.first_k_dense else "moe" for i in range(self.num_layers)]

    @property
    def num_kda_layers(self) -> int:
        return self.layer_kinds.count("kda")

    @property
    def num_mla_layers(self) -> int:
        return self.layer_kinds.count("mla")

    @property
    def num_moe_layers(self) -> int:
        return self.ffn_kinds.count("moe")

    @property
    def num_dense_layers(self) -> int:
        return self.ffn_kinds.count("dense")

    @property
    def num_attn_res_blocks(self) -> int:
        """Block AttnRes blocks = ceil(layers / block size) (K3: ceil(93/12) = 8); 0 without AttnRes."""
        if self.attn_res_block_size is None:
            return 0
        return math.ceil(self.num_layers / self.attn_res_block_size)
