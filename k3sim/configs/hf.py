"""Translate a Hugging Face `config.json` (Kimi-Linear, Kimi K2, Kimi K3) into our ModelConfig fields.

K3 nests the text model under `text_config` (model_type kimi_linear) with `vision_config` beside it;
Kimi-Linear is flat with `linear_attn_config`; K2 is flat DeepSeek-V3 style (all MLA). Field names of
both families are accepted (`num_experts` / `n_routed_experts`, ...). Keys we do not model are ignored:
an HF config carries many (rope scaling, token ids, ...).
"""

from __future__ import annotations

from typing import Any

from k3sim.errors import InputError


def is_hf_config(data: dict[str, Any]) -> bool:
    """HF configs carry `model_type`/`architectures`/`num_hidden_layers`; ours use `num_layers`."""
    return any(k in data for k in ("model_type", "architectures", "text_config", "num_hidden_layers"))


def _pick(cfg: dict, *names: str, source: str, required: bool = True, default: Any = None) -> Any:
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    if required:
        raise InputError("missing in config.json", source=source, field=names[0])
    return default


def _section(cfg: dict, key: str, source: str) -> dict | None:
    """A nested block of config.json (`text_config`, `linear_attn_config`, ...): a mapping or absent."""
    value = cfg.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise InputError(f"expected a mapping, got {type(value).__name__}", source=source, field=key)


def _flag(cfg: dict, key: str, source: str) -> bool:
    """A true/false field; absent or null = false. A string such as "false" is rejected, not read as true."""
    value = cfg.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InputError(f"expected true or false (got {value!r})", source=source, field=key)
    return value


# quantization_config schemes we know, as (quant_method, format) -> (non-routed format, routed format).
# K3: compressed-tensors `mxfp4-pack-quantized`, ignore list holds attention, shared experts, lm_head
# and vision, so only routed experts are MXFP4 (an NVFP4 pack likewise). K2-Instruct: `quant_method: fp8`
# block-wise on all linear weights (DeepSeek-V3 style); compressed-tensors `float-quantized` is the same FP8.
KNOWN_QUANTIZATION = {
    ("compressed-tensors", "mxfp4-pack-quantized"): ("bf16", "mxfp4"),
    ("compressed-tensors", "nvfp4-pack-quantized"): ("bf16", "nvfp4"),
    ("compressed-tensors", "float-quantized"): ("fp8", "fp8"),
    ("fp8", ""): ("fp8", "fp8"),
    ("mxfp4", ""): ("bf16", "mxfp4"),
}


def _quant_formats(quant: dict | None, source: str = "config.json") -> tuple[str, str]:
    """(non-routed weight format, routed expert format) from `quantization_config`.

    A scheme not in `KNOWN_QUANTIZATION` (AWQ, GPTQ, bitsandbytes, ...) is refused with the known list: read
    as bf16 it would overstate the weights several times over without a word."""
    if not quant:
        return "bf16", "bf16"
    method = str(quant.get("quant_method", "")).lower()
    fmt = str(quant.get("format", "") or "").lower()
    for key in ((method, fmt), (method, "")):
        if key in KNOWN_QUANTIZATION:
            return KNOWN_QUANTIZATION[key]
    known = ", ".join(f"{m}" + (f" format {f}" if f else "") for m, f in KNOWN_QUANTIZATION)
    got = method + (f" format {fmt}" if fmt else "")
    raise InputError(f"unknown quantization scheme '{got[:60]}' (known: {known})", source=source,
                     field="quantization_config")


def _vision(vc: dict | None) -> dict | None:
    """MoonViT fields (`vt_` prefix in K2.5/K3, plain in Kimi-VL); None if the tower is not described."""
    if not vc:
        return None

    def get(key: str) -> Any:
        return vc.get(f"vt_{key}", vc.get(key))

    fields = {
        "num_layers": get("num_hidden_layers"),
        "hidden_size": get("hidden_size"),
        "intermediate_size": get("intermediate_size"),
        "num_heads": get("num_attention_heads"),
        "patch_size": get("patch_size"),
    }
    if any(v is None for v in fields.values()):
        return None
    return fields


def hf_to_model_fields(data: dict[str, Any], source: str, name: str) -> dict[str, Any]:
    """Our ModelConfig fields from an HF config dict (the caller validates them)."""
    text = _section(data, "text_config", source) or data
    get = lambda *n, **kw: _pick(text, *n, source=source, **kw)  # noqa: E731
    num_layers = get("num_hidden_layers")
    hidden = get("hidden_size")
    quant = (_section(data, "quantization_config", source)
             or _section(text, "quantization_config", source))
    weight_format, routed_format = _quant_formats(quant, source)
    out: dict[str, Any] = {
        "name": str(data.get("_name_or_path") or name),
        "source": f"Hugging Face config.json ({source})",
        "hidden_size": hidden,
        "num_layers": num_layers,
        "vocab_size": get("vocab_size"),
        "max_context_tokens": text.get("max_position_embeddings") or data.get("max_position_embeddings"),
        "tie_word_embeddings": _flag(text, "tie_word_embeddings", source),
        "weight_format": weight_format,
    }
    lin = _section(text, "linear_attn_config", source)
    if lin:
        out["full_attn_layers"] = _pick(lin, "full_attn_layers", source=source)
        if not isinstance(out["full_attn_layers"], list):
            raise InputError(f"expected a list of 1-based layer numbers (got {out['full_attn_layers']!r})",
                             source=source, field="linear_attn_config.full_attn_layers")
        head_dim = _pick(lin, "head_dim", source=source)
        full_rank_gate = _flag(lin if "use_full_rank_gate" in lin else text, "use_full_rank_gate", source)
        out["kda"] = {
            "num_heads": _pick(lin, "num_heads", source=source),
            "head_dim_k": head_dim,
            "head_dim_v": head_dim,
            "conv_kernel_size": _pick(lin, "short_conv_kernel_size", source=source, required=False, default=4),
            "alpha_gate_rank": None if full_rank_gate else head_dim,
            "output_gate_rank": head_dim,  # Kimi-Linear's g_a/g_b width; assumed for K3 (not in config.json)
        }
    if lin is None or out["full_attn_layers"]:
        out["mla"] = {
            "num_heads": get("num_attention_heads"),
            "q_lora_rank": get("q_lora_rank", required=False),
            "kv_lora_rank": get("kv_lora_rank"),
            "qk_nope_head_dim": get("qk_nope_head_dim"),
            "qk_rope_head_dim": get("qk_rope_head_dim"),
            "v_head_dim": get("v_head_dim"),
            "output_gate": _flag(text, "mla_use_output_gate", source),
        }
    experts = get("num_experts", "n_routed_experts", required=False)
    if experts:
        out["first_k_dense"] = get("first_k_dense_replace", required=False, default=0)
        out["moe"] = {
            "num_routed_experts": experts,
            "num_active_experts": get("num_experts_per_token", "num_experts_per_tok"),
            "num_shared_experts": get("num_shared_experts", "n_shared_experts", required=False, default=0),
            "expert_ffn_width": get("moe_intermediate_size"),
            "latent_width": get("routed_expert_hidden_size", required=False),
            "latent_norm": _flag(text, "latent_moe_use_norm", source),
            "routed_weight_format": routed_format,
            # group-limited gating (topk_group of n_group expert groups, DeepSeek-V3 sec. 2.1.2): one group per node
            # in its EP layout, so at most topk_group nodes per token; one group (K2, K3) is no limit
            "max_nodes_per_token": (get("topk_group", required=False) if (get(
                "n_group", "num_expert_group", required=False, default=1) or 1) > 1 else None),
        }
    if not experts or out.get("first_k_dense"):
        out["dense_ffn_width"] = get("intermediate_size")
    block = get("attn_res_block_size", required=False)
    if block:
        out["attn_res_block_size"] = block
    vision = _vision(_section(data, "vision_config", source))
    if vision:
        out["vision"] = vision
    return out
