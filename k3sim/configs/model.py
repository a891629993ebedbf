"""Model architecture schema: a list of layers, each with its sequence mixers and its FFN, and the shapes of
every kind it uses (one section per kind: `kda`, `mla`, `gdn`, `mamba2`, `mamba`, `lightning`, `gqa`, `swa`,
`moe`; the kinds themselves live in `configs/kinds/`).

Field names follow the published Hugging Face configs where one exists (see `hf.py` for the mapping).
All sizes are element counts (widths, heads, ranks); dtypes are names understood by `dtypes.py`.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from k3sim.configs.bounds import bounded_int
from k3sim.configs.dtypes import check_dtype
from k3sim.configs.kinds import (MIXERS, NONE, GDNConfig, GQAConfig, KDAConfig, Layer, LightningConfig,
                                 MambaConfig, Mamba2Config, MLAConfig, MoEConfig, SWAConfig, canonical_entries,
                                 parse_pattern)

__all__ = ["GDNConfig", "GQAConfig", "KDAConfig", "Layer", "LightningConfig", "MLAConfig", "Mamba2Config",
           "MambaConfig", "ModelConfig", "MoEConfig", "SWAConfig", "VisionConfig"]

# Every count and width has a documented range (k3sim/configs/bounds.py); booleans are not numbers.
Layers = bounded_int("layers")
LayerCount = bounded_int("layers", lo=0)
Heads = bounded_int("heads")
Vocab = bounded_int("vocab")
Width = bounded_int("width")
Taps = bounded_int("kernel")

DType = Annotated[str, AfterValidator(check_dtype)]
_STRICT = ConfigDict(extra="forbid", frozen=True, defer_build=True)


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


# Sections of the mixer kinds (`configs/kinds/`): KDA and MLA are read by the old `full_attn_layers` rule too;
# the others need `layer_pattern` to say which layers are theirs.
PATTERN_ONLY = ("gdn", "mamba2", "mamba", "lightning", "gqa", "swa")


# The mixer kinds the step model prices (decode, prefill and serving steps: `k3sim.step.mixers`, one call builder
# per kind): every registered kind. A consumer that does not price a kind yet refuses it in one line with its own
# list (`ModelConfig.require_kinds`).
MODELLED_MIXERS: tuple[str, ...] = tuple(MIXERS)


class ModelConfig(BaseModel):
    """A language model as a list of layers, each a sequence mixer and an FFN (`layers`).

    Layer pattern, either way: `layer_pattern` (one entry per run of layers, `"<mixers>/<ffn>[ xN]"`, see
    `configs/kinds`), or the Kimi rule: `full_attn_layers` lists the 1-based MLA layers (as in config.json's
    `linear_attn_config.full_attn_layers`) and every other layer is KDA, None meaning all MLA (K2); the first
    `first_k_dense` layers use a dense FFN of width `dense_ffn_width`, the rest MoE. A kind's shapes are the
    section of its name (`kda`, `mla`, `gdn`, `mamba2`, `mamba`, `lightning`, `gqa`, `swa`, `moe`).
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
    layer_pattern: list[str] | None = Field(
        None, description="per run of layers '<mixers>/<ffn>[ xN]' (configs/kinds); None = the full_attn_layers "
                          "and first_k_dense rule")
    dense_ffn_width: Width | None = None
    ffn_gated: bool = Field(True, description="FFNs are GLUs (gate, up, down); false: up, down only (squared "
                                              "ReLU, Nemotron-H) for the dense FFN and the experts alike")
    weight_format: DType = Field("bf16", description="non-routed linear weights")
    embedding_format: DType = "bf16"
    activation_dtype: DType = "bf16"
    kda: KDAConfig | None = None
    mla: MLAConfig | None = None
    gdn: GDNConfig | None = None
    mamba2: Mamba2Config | None = None
    mamba: MambaConfig | None = None
    lightning: LightningConfig | None = None
    gqa: GQAConfig | None = None
    swa: SWAConfig | None = None
    moe: MoEConfig | None = None
    attn_res_block_size: Layers | None = Field(None, description="layers per Block-AttnRes block")
    vision: VisionConfig | None = None
    training_stack_fused_permute: bool = Field(
        False, description="the model's published training stack permutes / unpermutes MoE tokens with fused "
                           "kernels (training.moe_glue auto prices them so; cite the source in the YAML)")

    @field_validator("layer_pattern")
    @classmethod
    def _canonical(cls, entries: list[str] | None) -> list[str] | None:
        return None if entries is None else canonical_entries(entries)

    @model_validator(mode="after")
    def _consistent(self) -> "ModelConfig":
        L = self.num_layers
        if self.layer_pattern is not None:
            self._check_pattern_mode()
        elif self.full_attn_layers is not None:
            bad = [i for i in self.full_attn_layers if i > L]
            if bad:
                raise ValueError(f"full_attn_layers {bad} beyond num_layers {L} (indices are 1-based)")
            if len(set(self.full_attn_layers)) != len(self.full_attn_layers):
                raise ValueError("full_attn_layers has duplicates")
        if self.layer_pattern is None:
            for kind in PATTERN_ONLY:
                if getattr(self, kind) is not None:
                    raise ValueError(f"{kind} section given but no layer_pattern says which layers are "
                                     f"{MIXERS[kind].title}: add layer_pattern")
        used = set(self._pattern()["count"])
        for kind in MIXERS:
            if kind in used and getattr(self, kind) is None:
                raise ValueError(f"{kind} section missing but the layer pattern has {MIXERS[kind].title} layers")
        if self.first_k_dense > L:
            raise ValueError(f"first_k_dense {self.first_k_dense} exceeds num_layers {L}")
        if "dense" in used and self.dense_ffn_width is None:
            raise ValueError("dense_ffn_width is not set but there are dense FFN layers")
        if "moe" in used and self.moe is None:
            raise ValueError("moe section missing but there are MoE layers")
        return self

    def _check_pattern_mode(self) -> None:
        """layer_pattern excludes the Kimi rule's fields and every section it does not use."""
        for name in ("full_attn_layers", "first_k_dense"):
            if name in self.model_fields_set:
                raise ValueError(f"{name} cannot be combined with layer_pattern, which gives every layer's "
                                 "mixer and FFN: remove it")
        layers = parse_pattern(self.layer_pattern, self.num_layers)  # the layer count, with the field named
        used = {k for layer in layers for k in layer.mixers} | {layer.ffn for layer in layers}
        for kind in (*MIXERS, "moe"):
            if getattr(self, kind) is not None and kind not in used:
                raise ValueError(f"{kind} section given but no layer_pattern entry uses {kind}: remove it")

    def _pattern(self) -> dict:
        """Layers and their kinds, built once per model (O(layers)) and reused: building them per call made
        every per-layer loop quadratic (a 10,000-layer model took minutes). The cache sits in the instance
        dict keyed by the fields it derives from, so a `model_copy(update=...)` cannot see a stale one.
        Callers must not mutate the lists."""
        key = (self.num_layers, id(self.full_attn_layers), self.first_k_dense, self.moe is None,
               id(self.layer_pattern))
        cached = self.__dict__.get("_k3sim_pattern")
        if cached is None or cached["key"] != key:
            layers = self._build_layers()
            kinds = [layer.mixer for layer in layers]
            ffn = [layer.ffn or NONE for layer in layers]
            count: dict[str, int] = {}
            for layer in layers:
                for k in (*layer.mixers, layer.ffn or NONE):
                    count[k] = count.get(k, 0) + 1
            cached = {"key": key, "layers": tuple(layers), "layer": kinds, "ffn": ffn, "count": count}
            self.__dict__["_k3sim_pattern"] = cached  # frozen model: bypass __setattr__ for a derived cache
        return cached

    def _build_layers(self) -> list[Layer]:
        L = self.num_layers
        if self.layer_pattern is not None:
            return parse_pattern(self.layer_pattern, L)
        if self.full_attn_layers is None:
            kinds = ["mla"] * L
        else:
            kinds = ["kda"] * L
            for i in self.full_attn_layers:
                if 1 <= i <= L:
                    kinds[i - 1] = "mla"
        ffn = ["dense"] * L if self.moe is None else (
            ["dense"] * min(self.first_k_dense, L) + ["moe"] * max(L - self.first_k_dense, 0))
        return [Layer(i, (kinds[i],), ffn[i]) for i in range(L)]

    @property
    def layers(self) -> tuple[Layer, ...]:
        """Every layer with its mixer kinds and FFN kind (`configs.kinds.Layer`), 0-based."""
        return self._pattern()["layers"]

    @property
    def layer_kinds(self) -> list[str]:
        """Mixer kind of each layer, 0-based list (shared: do not mutate): "kda", "mla", "gdn", ...; "none"
        for a layer without a mixer, kinds joined by "+" for parallel mixers ("gqa+mamba2")."""
        return self._pattern()["layer"]

    @property
    def ffn_kinds(self) -> list[str]:
        """FFN kind of each layer ("dense", "moe", "none"): under the Kimi rule the first `first_k_dense` are
        dense (HF first_k_dense_replace)."""
        return self._pattern()["ffn"]

    def section(self, kind: str):
        """The shapes of kind `kind` (`model.gdn` for "gdn"); None if the model has none."""
        return getattr(self, kind)

    def num_layers_with(self, kind: str) -> int:
        """Layers that hold mixer (or FFN) kind `kind`, parallel mixers included."""
        return self._pattern()["count"].get(kind, 0)

    @property
    def mixer_kinds(self) -> tuple[str, ...]:
        """The mixer kinds the model uses, in registry order."""
        count = self._pattern()["count"]
        return tuple(k for k in MIXERS if k in count)

    def require_kinds(self, supported: tuple[str, ...], consumer: str, *, source: str | None = None,
                      field: str | None = None) -> None:
        """Refuse, in one line, a model with a mixer kind `consumer` (e.g. "the step model") does not price yet:
        the first such kind, its first layer (0-based) and what `consumer` does cover. The one refusal every
        consumer not yet generalised calls, instead of pricing a GDN layer as an MLA one."""
        from k3sim.errors import InputError

        for layer in self.layers:
            for kind in layer.mixers:
                if kind not in supported:
                    raise InputError(f"{MIXERS[kind].title} layers (mixer kind '{kind}', first at layer {layer.index}, "
                                     f"0-based) are not modelled by {consumer} yet (it covers "
                                     f"{', '.join(supported)}); model-info and memory --mode serve answer for "
                                     f"this model", source=source, field=field)

    @property
    def num_kda_layers(self) -> int:
        return self.num_layers_with("kda")

    @property
    def num_mla_layers(self) -> int:
        return self.num_layers_with("mla")

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers_with("moe")

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers_with("dense")

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
