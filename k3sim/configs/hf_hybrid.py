"""Translate the hybrid and dense families' `config.json` into our ModelConfig fields (`HF_TYPES`).

Each family says which layer is which in its own keys, read here into one `layer_pattern` entry per layer
(`"<mixers>/<ffn>"`, configs/kinds; the schema merges runs):
- `qwen3_next`, `qwen3_5_moe` (its `text_config`, model_type `qwen3_5_moe_text`): `layer_types`
  ("linear_attention" = Gated DeltaNet, "full_attention" = gated GQA) or `full_attention_interval`; MoE
  unless a layer is in `mlp_only_layers` or off `decoder_sparse_step`; `linear_*` GDN keys;
  `mamba_ssm_dtype` for the state (HF Qwen3NextConfig / Qwen3_5MoeTextConfig key names);
- `nemotron_h`: `hybrid_override_pattern` (M Mamba2, * attention, - MLP, E MoE, one block each) or
  `layers_block_type`; squared-ReLU FFNs (`mlp_hidden_act` relu2: up, down only); LatentMoE by
  `moe_latent_size`; `mamba_ssm_cache_dtype` (HF NemotronHConfig, NVIDIA's Nemotron 3 configs);
- `granitemoehybrid`: `layer_types` ("mamba" / "attention"), a MoE with a shared expert on every layer (a
  dense FFN of `shared_intermediate_size` without experts), no RoPE unless `position_embedding_type` rope
  (HF GraniteMoeHybridConfig);
- `jamba`: attention every `attn_layer_period` from `attn_layer_offset`, MoE every `expert_layer_period` from
  `expert_layer_offset`, Mamba-1 elsewhere (HF JambaConfig);
- `falcon_h1`: attention and Mamba2 in parallel in every layer, a dense FFN (HF FalconH1Config);
- `minimax_m1`, `minimax_text_01`, `minimax`: `attn_type_list` (0 lightning, 1 softmax GQA) or `layer_types`;
- `qwen3`, `qwen3_moe`, `llama`: GQA (sliding-window layers where `use_sliding_window` or `layer_types` say so).
A per-layer key with the wrong length, an unknown entry, or a count that does not split is refused naming
the key. Absent layout keys take the HF configuration class's default, as transformers does.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from k3sim.configs.bounds import check_range
from k3sim.configs.hf_keys import common_fields, dtype, flag, key_list, pick, section, unknown_entry
from k3sim.errors import InputError


def _int(cfg: dict, key: str, source: str, kind: str = "width", default: Any = None) -> int:
    """A whole number in the documented range of `kind` (required when `default` is None)."""
    value = pick(cfg, key, source=source, required=default is None, default=default)
    return int(check_range(value, kind, source, field=key, integer=True))


def _layers(text: dict, source: str) -> int:
    return _int(text, "num_hidden_layers", source, "layers")


def _entries(mixers: list[str], ffns: list[str]) -> list[str]:
    return [f"{m}/{f}" for m, f in zip(mixers, ffns)]


def _map(values: list, key: str, table: dict, source: str) -> list:
    """Each per-layer value through `table`, refusing one it does not know."""
    known = ", ".join(str(k) for k in table)
    out = []
    for v in values:
        if isinstance(v, bool) or v not in table:
            raise unknown_entry(key, v, known, source)
        out.append(table[v])
    return out


def _gqa(text: dict, source: str, **extra: Any) -> dict[str, Any]:
    """The softmax-attention section from the usual keys (head_dim defaults to hidden / heads)."""
    heads = _int(text, "num_attention_heads", source, "heads")
    hidden = _int(text, "hidden_size", source)
    head_dim = pick(text, "head_dim", "attention_head_dim", source=source, required=False) or hidden // heads
    return {"num_heads": heads, "num_kv_heads": _int(text, "num_key_value_heads", source, "heads", default=heads),
            "head_dim": int(check_range(head_dim, "width", source, field="head_dim", integer=True)),
            "qkv_bias": flag(text, "attention_bias", source), **extra}


def _moe(text: dict, source: str, routed_format: str, experts_key: str, width_key: str, *, shared_key: str,
         router_score: str, router_bias: bool, **extra: Any) -> dict[str, Any]:
    shared_w = _int(text, shared_key, source) if shared_key and text.get(shared_key) not in (None, 0) else 0
    out = {"num_routed_experts": _int(text, experts_key, source, "experts"),
           "num_active_experts": _int(text, "num_experts_per_tok", source, "topk"),
           "expert_ffn_width": _int(text, width_key, source), "router_score": router_score,
           "router_bias": router_bias, "routed_weight_format": routed_format, **extra}
    if shared_w:
        out["num_shared_experts"] = _int(text, "n_shared_experts", source, "experts", default=1)
        out["shared_expert_ffn_width"] = shared_w
    return out


def _sparse_step_ffn(text: dict, source: str, layers: int, has_experts: bool) -> list[str]:
    """Qwen's rule: a layer is MoE unless it is in `mlp_only_layers` (0-based) or off `decoder_sparse_step`."""
    if not has_experts:
        return ["dense"] * layers
    step = _int(text, "decoder_sparse_step", source, "layers", default=1)
    only = pick(text, "mlp_only_layers", source=source, required=False, default=[])
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise InputError("expected a list of 0-based layer numbers", source=source, field="mlp_only_layers")
    dense = set(only)
    return ["dense" if i in dense or (i + 1) % step else "moe" for i in range(layers)]


def qwen3_next_fields(data: dict, source: str, name: str) -> dict[str, Any]:
    """Qwen3-Next and Qwen3.5 (text config): Gated DeltaNet + gated GQA, MoE with a gated shared expert."""
    text = section(data, "text_config", source) or data
    out, routed = common_fields(data, text, source, name)
    L = _layers(text, source)
    types = key_list(text, "layer_types", source, L, "entries")
    if types is None:
        every = _int(text, "full_attention_interval", source, "layers", default=4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)]
    mixers = _map(types, "layer_types", {"linear_attention": "gdn", "full_attention": "gqa"}, source)
    experts = pick(text, "num_experts", source=source, required=False, default=0)
    ffns = _sparse_step_ffn(text, source, L, bool(experts))
    out["layer_pattern"] = _entries(mixers, ffns)
    if "gdn" in mixers:
        out["gdn"] = {"num_key_heads": _int(text, "linear_num_key_heads", source, "heads"),
                      "num_value_heads": _int(text, "linear_num_value_heads", source, "heads"),
                      "head_dim_k": _int(text, "linear_key_head_dim", source),
                      "head_dim_v": _int(text, "linear_value_head_dim", source),
                      "conv_kernel_size": _int(text, "linear_conv_kernel_dim", source, "kernel", default=4),
                      "state_dtype": dtype(text, "mamba_ssm_dtype", source)}
    if "gqa" in mixers:
        rope = section(text, "rope_parameters", source) or {}
        fraction = pick(text, "partial_rotary_factor", source=source, required=False,
                        default=rope.get("partial_rotary_factor", 0.25))  # Qwen3NextConfig's default
        gate = True if data.get("model_type") == "qwen3_next" else flag(text, "attn_output_gate", source, True)
        out["gqa"] = _gqa(text, source, output_gate=gate, rope_fraction=fraction, qk_norm=True)
    if "moe" in ffns:
        out["moe"] = _moe(text, source, routed, "num_experts", "moe_intermediate_size",
                          shared_key="shared_expert_intermediate_size", router_score="softmax", router_bias=False)
        out["moe"]["shared_expert_gate"] = "shared_expert_ffn_width" in out["moe"]
    if "dense" in ffns:
        out["dense_ffn_width"] = _int(text, "intermediate_size", source)
    return out


NEMOTRON_BLOCKS = {"M": ("mamba2", "none"), "*": ("gqa", "none"), "-": ("none", "dense"), "E": ("none", "moe")}
NEMOTRON_NAMES = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def nemotron_h_fields(data: dict, source: str, name: str) -> dict[str, Any]:
    """Nemotron-H / Nemotron 3: blocks of one Mamba2, attention, MLP or MoE each."""
    out, routed = common_fields(data, data, source, name)
    L = _layers(data, source)
    chars = key_list(data, "hybrid_override_pattern", source, L, "characters")
    key = "hybrid_override_pattern"
    if chars is None:
        key = "layers_block_type"
        names = key_list(data, key, source, L, "entries")
        if names is None:
            raise InputError("missing in config.json (or layers_block_type)", source=source,
                             field="hybrid_override_pattern")
        chars = _map(names, key, NEMOTRON_NAMES, source)
    blocks = _map(chars, key, NEMOTRON_BLOCKS, source)
    out["layer_pattern"] = [f"{m}/{f}" for m, f in blocks]
    used = {k for b in blocks for k in b}
    out["ffn_gated"] = str(data.get("mlp_hidden_act", "relu2")).lower() not in ("relu2", "relu")
    if "mamba2" in used:
        out["mamba2"] = {"num_heads": _int(data, "mamba_num_heads", source, "heads"),
                         "head_dim": _int(data, "mamba_head_dim", source),
                         "state_size": _int(data, "ssm_state_size", source),
                         "n_groups": _int(data, "n_groups", source, "heads", default=1),
                         "conv_kernel_size": _int(data, "conv_kernel", source, "kernel", default=4),
                         "conv_bias": flag(data, "use_conv_bias", source, True),
                         "proj_bias": flag(data, "use_bias", source),
                         "state_dtype": dtype(data, "mamba_ssm_cache_dtype" if "mamba_ssm_cache_dtype" in data
                                              else "mamba_ssm_dtype", source)}
    if "gqa" in used:
        out["gqa"] = _gqa(data, source)
    if "dense" in used:
        out["dense_ffn_width"] = _int(data, "intermediate_size", source)
    if "moe" in used:
        groups = _int(data, "n_group", source, "experts", default=1)
        out["moe"] = _moe(data, source, routed, "n_routed_experts", "moe_intermediate_size",
                          shared_key="moe_shared_expert_intermediate_size", router_score="sigmoid",
                          router_bias=True, latent_width=data.get("moe_latent_size"),
                          max_nodes_per_token=_int(data, "topk_group", source, "experts", default=1)
                          if groups > 1 else None)
    return out


def _mamba2(cfg: dict, source: str, hidden: int, *, inner_key: str | None, gated_norm: bool) -> dict[str, Any]:
    """Granite / Falcon-H1 Mamba2 keys (`mamba_n_heads`, `mamba_d_head` "auto" = inner / heads, ...)."""
    heads = _int(cfg, "mamba_n_heads", source, "heads", default=128)
    expand = _int(cfg, "mamba_expand", source, "kernel", default=2)
    inner = _int(cfg, inner_key, source, default=expand * hidden) if inner_key else expand * hidden
    head_dim = cfg.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else _int(cfg, "mamba_d_head", source)
    if heads * head_dim != inner:
        raise InputError(f"mamba_n_heads x mamba_d_head = {heads} x {head_dim} is not the Mamba inner width "
                         f"{inner}", source=source, field="mamba_d_head")
    return {"num_heads": heads, "head_dim": head_dim,
            "state_size": _int(cfg, "mamba_d_state", source, default=256),
            "n_groups": _int(cfg, "mamba_n_groups", source, "heads", default=1),
            "conv_kernel_size": _int(cfg, "mamba_d_conv", source, "kernel", default=4),
            "conv_bias": flag(cfg, "mamba_conv_bias", source, True), "proj_bias": flag(cfg, "mamba_proj_bias", source),
            "gated_norm": gated_norm,
            "state_dtype": dtype(cfg, "mamba_ssm_dtype", source)}


def granite_fields(data: dict, source: str, name: str) -> dict[str, Any]:
    """Granite-4.0-H: Mamba2 and NoPE GQA layers, each with a MoE (+ shared expert) or a dense FFN."""
    out, routed = common_fields(data, data, source, name)
    L = _layers(data, source)
    key = "layer_types" if "layer_types" in data else "layers_block_type"
    types = key_list(data, key, source, L, "entries") or ["mamba"] * L
    mixers = _map(types, key, {"mamba": "mamba2", "attention": "gqa"}, source)
    experts = _int(data, "num_local_experts", source, "experts", default=0) if data.get("num_local_experts") else 0
    ffn = "moe" if experts else "dense"
    out["layer_pattern"] = _entries(mixers, [ffn] * L)
    if "mamba2" in mixers:
        out["mamba2"] = _mamba2(data, source, out["hidden_size"], inner_key=None, gated_norm=True)
    if "gqa" in mixers:
        rope = 1.0 if data.get("position_embedding_type") == "rope" else 0.0
        out["gqa"] = _gqa(data, source, rope_fraction=rope)
    if experts:
        out["moe"] = _moe(data, source, routed, "num_local_experts", "intermediate_size",
                          shared_key="shared_intermediate_size", router_score="softmax", router_bias=False)
    else:  # without experts the shared MLP is the layer's FFN (GraniteMoeHybridDecoderLayer.shared_mlp)
        out["dense_ffn_width"] = _int(data, "shared_intermediate_size", source)
    return out


def _period(data: dict, source: str, name: str, default_period: int, default_offset: int) -> tuple[int, int]:
    """Jamba's `<name>_period` and `<name>_offset`: every period-th layer from the offset (0-based)."""
    period = _int(data, f"{name}_period", source, "layers", default=default_period)
    offset = pick(data, f"{name}_offset", source=source, required=False, default=default_offset)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
        raise InputError(f"expected a whole number from 0 to {name}_period - 1 = {period - 1} (got "
                         f"{str(offset)[:20]})", source=source, field=f"{name}_offset")
    return period, offset


def jamba_fields(data: dict, source: str, name: str) -> dict[str, Any]:
    """Jamba: Mamba-1 with one attention layer per `attn_layer_period`, MoE every `expert_layer_period`."""
    out, routed = common_fields(data, data, source, name)
    L, hidden = _layers(data, source), out["hidden_size"]
    a_period, a_offset = _period(data, source, "attn_layer", 8, 4)
    e_period, e_offset = _period(data, source, "expert_layer", 2, 1)
    experts = _int(data, "num_experts", source, "experts", default=16)
    mixers = ["gqa" if i % a_period == a_offset else "mamba" for i in range(L)]
    ffns = ["moe" if experts > 1 and i % e_period == e_offset else "dense" for i in range(L)]
    out["layer_pattern"] = _entries(mixers, ffns)
    dt_rank = data.get("mamba_dt_rank", "auto")
    if "mamba" in mixers:
        out["mamba"] = {"inner_size": _int(data, "mamba_expand", source, "kernel", default=2) * hidden,
                        "state_size": _int(data, "mamba_d_state", source, default=16),
                        "dt_rank": math.ceil(hidden / 16) if dt_rank in (None, "auto")
                        else _int(data, "mamba_dt_rank", source),
                        "conv_kernel_size": _int(data, "mamba_d_conv", source, "kernel", default=4),
                        "conv_bias": flag(data, "mamba_conv_bias", source, True),
                        "proj_bias": flag(data, "mamba_proj_bias", source), "inner_norms": True,
                        "state_dtype": dtype(data, "mamba_ssm_dtype", source)}
    if "gqa" in mixers:
        out["gqa"] = _gqa(data, source, rope_fraction=0.0)  # Jamba uses no positional embedding
    if "moe" in ffns:
        out["moe"] = _moe(data, source, routed, "num_experts", "intermediate_size", shared_key="",
                          router_score="softmax", router_bias=False)
    if "dense" in ffns:
        out["dense_ffn_width"] = _int(data, "intermediate_size", source)
    return out


def falcon_h1_fields(data: dict, source: str, name: str) -> dict[str, Any]:
    """Falcon-H1: attention and Mamba2 side by side in every layer, then a dense SwiGLU FFN."""
    out, _ = common_fields(data, data, source, name)
    L = _layers(data, source)
    out["layer_pattern"] = [f"gqa+mamba2/dense x{L}"]
    out["mamba2"] = _mamba2(data, source, out["hidden_size"], inner_key="mamba_d_ssm",
                            gated_norm=flag(data, "mamba_rms_norm", source))
    out["gqa"] = _gqa(data, source)
    out["dense_ffn_width"] = _int(data, "intermediate_size", source)
    return out


def minimax_fields(data: dict, source: str, name: str) -> dict[str, Any]:
    """MiniMax-Text-01 / M1: lightning attention with a softmax GQA layer every 8th, MoE in every layer."""
    out, routed = common_fields(data, data, source, name)
    L = _layers(data, source)
    if "attn_type_list" in data:
        key, table = "attn_type_list", {0: "lightning", 1: "gqa"}
    else:
        key, table = "layer_types", {"linear_attention": "lightning", "full_attention": "gqa"}
    types = key_list(data, key, source, L, "entries")
    if types is None:
        raise InputError("missing in config.json (0 = lightning, 1 = softmax attention per layer)", source=source,
                         field="attn_type_list")
    mixers = _map(types, key, table, source)
    out["layer_pattern"] = _entries(mixers, ["moe"] * L)
    heads = _int(data, "num_attention_heads", source, "heads")
    head_dim = _int(data, "head_dim", source, default=out["hidden_size"] // heads)
    if "lightning" in mixers:
        out["lightning"] = {"num_heads": heads, "head_dim": head_dim}
    if "gqa" in mixers:
        rotary = _int(data, "rotary_dim", source, default=head_dim)
        out["gqa"] = _gqa(data, source, rope_fraction=min(rotary / head_dim, 1.0))
    out["moe"] = _moe(data, source, routed, "num_local_experts", "intermediate_size",
                      shared_key="shared_intermediate_size", router_score="softmax", router_bias=False)
    return out


def dense_gqa_fields(data: dict, source: str, name: str) -> dict[str, Any]:
    """Qwen3 / Qwen3-MoE / Llama: GQA in every layer (sliding-window layers where configured)."""
    out, routed = common_fields(data, data, source, name)
    L = _layers(data, source)
    mtype = data.get("model_type")
    types = key_list(data, "layer_types", source, L, "entries")
    if types is None:
        sliding = mtype != "llama" and flag(data, "use_sliding_window", source)
        first = _int(data, "max_window_layers", source, "layers", default=L) if sliding else L
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(L)]
    mixers = _map(types, "layer_types", {"full_attention": "gqa", "sliding_attention": "swa"}, source)
    experts = pick(data, "num_experts", source=source, required=False, default=0) if mtype == "qwen3_moe" else 0
    ffns = _sparse_step_ffn(data, source, L, bool(experts))
    out["layer_pattern"] = _entries(mixers, ffns)
    attn = _gqa(data, source, qk_norm=mtype != "llama",
                rope_fraction=pick(data, "partial_rotary_factor", source=source, required=False, default=1.0))
    if "gqa" in mixers:
        out["gqa"] = attn
    if "swa" in mixers:
        out["swa"] = {**attn, "window_tokens": _int(data, "sliding_window", source, "tokens")}
    if "moe" in ffns:
        out["moe"] = _moe(data, source, routed, "num_experts", "moe_intermediate_size", shared_key="",
                          router_score="softmax", router_bias=False)
    if "dense" in ffns:
        out["dense_ffn_width"] = _int(data, "intermediate_size", source)
    return out


HF_TYPES: dict[str, Callable[[dict, str, str], dict]] = {
    "qwen3_next": qwen3_next_fields, "qwen3_5_moe": qwen3_next_fields, "qwen3_5_moe_text": qwen3_next_fields,
    "nemotron_h": nemotron_h_fields, "granitemoehybrid": granite_fields, "jamba": jamba_fields,
    "falcon_h1": falcon_h1_fields, "minimax_m1": minimax_fields, "minimax_text_01": minimax_fields,
    "minimax": minimax_fields, "qwen3": dense_gqa_fields, "qwen3_moe": dense_gqa_fields, "llama": dense_gqa_fields,
}
