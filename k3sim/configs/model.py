"""Model architecture schema: which layer is KDA or MLA, dense or MoE, and each block's shapes.

Field names follow the published Hugging Face configs where one exists (see `hf.py` for the mapping).
All sizes are element counts (widths, heads, ranks); dtypes are names understood by `dtypes.py`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from k3sim.configs.bounds import bounded_int
from k3sim.configs.dtypes import check_dtype

# Every count and width has a documented range (k3sim/configs/bounds.py); booleans are not numbers.
Layers = bounded_int("layers")
LayerCount = bounded_int("layers", lo=0)
Heads = bounded_int("heads")
Experts = bounded_int("experts")
ExpertCount = bounded_int("experts", lo=0)
Vocab = bounded_int("vocab")
Width = bounded_int("width")
Taps = bounded_int("kernel")

DType = Annotated[str, AfterValidator(check_dtype)]
_STRICT = ConfigDict(extra="forbid", frozen=True)


class KDAConfig(BaseModel):
    """Kimi Delta Attention (linear attention with a per-head d_k x d_v recurrent state)."""

    model_config = _STRICT
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


class MLAConfig(BaseModel):
    """Multi-head latent attention (DeepSeek-V2 style); the KV cache holds kv_lora + rope per token."""

    model_config = _STRICT
    num_heads: Heads
    q_lora_rank: Width | None = Field(None, description="None = direct q projection")
    kv_lora_rank: Width
    qk_nope_head_dim: Width
    qk_rope_head_dim: Width
    v_head_dim: Width
    kv_cache_dtype: DType = "bf16"
    output_gate: bool = Field(False, description="K3 gated MLA: sigmoid gate d -> heads*v_head_dim")


class MoEConfig(BaseModel):
    """(Latent) MoE FFN. With `latent_width` the routed experts run in a down-projected latent space."""

    model_config = _STRICT
    num_routed_experts: Experts
    num_active_experts: Experts = Field(description="routed experts per token (top-k)")
    num_shared_experts: ExpertCount = 0
    expert_ffn_width: Width = Field(description="intermediate width of one routed expert")
    shared_expert_ffn_width: Width | None = Field(
        None, description="intermediate width of one shared expert; None = expert_ffn_width")
    latent_width: Width | None = Field(None, description="None = no latent projection")
    latent_norm: bool = Field(False, description="RMSNorm on the latent (K3 latent_moe_use_norm)")
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


class VisionConfig(BaseModel):
    """ViT encoder tower (MoonViT). Parameter count covers patch embedding + transformer layers."""

    model_config = _STRICT
    num_layers: Layers
    hidden_size: Width
    intermediate_size: Width
    num_heads: Heads
    patch_size: Taps
    num_channels: Taps = 3
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
    hidden_size: Width
    num_layers: Layers
    vocab_size: Vocab
    max_context_tokens: bounded_int("tokens") | None = Field(
        None, description="longest context the model supports (HF max_position_embeddings); None = unchecked")
    tie_word_embeddings: bool = False
    full_attn_layers: list[Layers] | None = None
    first_k_dense: LayerCount = 0
    dense_ffn_width: Width | None = None
    weight_format: DType = Field("bf16", description="non-routed linear weights")
    embedding_format: DType = "bf16"
    activation_dtype: DType = "bf16"
    kda: KDAConfig | None = None
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    attn_res_block_size: Layers | None = Field(None, description="layers per Block-AttnRes block")
    vision: VisionConfig | None = None
    training_stack_fused_permute: bool = Field(
        False, description="the model's published training stack permutes / unpermutes MoE tokens with fused "
                           "kernels (training.moe_glue auto prices them so; cite the source in the YAML)")

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

    def _pattern(self) -> dict:
        """Layer and FFN kinds, built once per model (O(layers)) and reused: building them per call made
        every per-layer loop quadratic (a 10,000-layer model took minutes). The cache sits in the instance
        dict keyed by the fields it derives from, so a `model_copy(update=...)` cannot see a stale one.
        Callers must not mutate the lists."""
        key = (self.num_layers, id(self.full_attn_layers), self.first_k_dense, self.moe is None)
        cached = self.__dict__.get("_k3sim_pattern")
        if cached is None or cached["key"] != key:
            L = self.num_layers
            if self.full_attn_layers is None:
                kinds = ["mla"] * L
            else:
                kinds = ["kda"] * L
                for i in self.full_attn_layers:
                    if 1 <= i <= L:
                        kinds[i - 1] = "mla"
            ffn = ["dense"] * L if self.moe is None else (
                ["dense"] * min(self.first_k_dense, L) + ["moe"] * max(L - self.first_k_dense, 0))
            cached = {"key": key, "layer": kinds, "ffn": ffn, "mla": kinds.count("mla"), "moe": ffn.count("moe")}
            self.__dict__["_k3sim_pattern"] = cached  # frozen model: bypass __setattr__ for a derived cache
        return cached

    @property
    def layer_kinds(self) -> list[Literal["kda", "mla"]]:
        """Attention kind of each layer, 0-based list (shared: do not mutate)."""
        return self._pattern()["layer"]

    @property
    def ffn_kinds(self) -> list[Literal["dense", "moe"]]:
        """FFN kind of each layer: the first `first_k_dense` are dense (HF first_k_dense_replace)."""
        return self._pattern()["ffn"]

    @property
    def num_kda_layers(self) -> int:
        return self.num_layers - self._pattern()["mla"]

    @property
    def num_mla_layers(self) -> int:
        return self._pattern()["mla"]

    @property
    def num_moe_layers(self) -> int:
        return self._pattern()["moe"]

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self._pattern()["moe"]

    def check_context(self, tokens: int, source: str | None = "--context") -> None:
        """Refuse a serving context longer than the model supports (`max_context_tokens`, HF
        max_position_embeddings); None = unchecked. Training sequences are not checked: context-extension
        runs train past the released limit."""
        from k3sim.errors import InputError

        lim = self.max_context_tokens
        if lim is not None and tokens > lim:
            raise InputError(f"{tokens:,} tokens exceeds the {lim:,} the model supports (max_context_tokens)",
                             source=source)

    @property
    def num_attn_res_blocks(self) -> int:
        """Block AttnRes blocks = ceil(layers / block size) (K3: ceil(93/12) = 8); 0 without AttnRes."""
        if self.attn_res_block_size is None:
            return 0
        return math.ceil(self.num_layers / self.attn_res_block_size)
