"""Translate a Hugging Face `config.json` into our ModelConfig fields, by its `model_type` (`HF_TYPES`).

Kimi and DeepSeek-V3 here: K3 nests the text model under `text_config` (model_type kimi_linear) with
`vision_config` beside it; Kimi-Linear is flat with `linear_attn_config`; K2 and DeepSeek-V3 are flat
(all MLA). Field names of both families are accepted (`num_experts` / `n_routed_experts`, ...). The hybrid
and dense families (Qwen3-Next, Qwen3.5, Nemotron-H, Granite-4.0-H, Jamba, Falcon-H1, MiniMax, Qwen3,
Llama) are `hf_hybrid.py`'s. Keys we do not model are ignored: an HF config carries many (rope scaling,
token ids, ...). An unknown `model_type` is refused with the known list.
"""

from __future__ import annotations

from typing import Any, Callable

from k3sim.configs import hf_hybrid
from k3sim.configs.hf_keys import KNOWN_QUANTIZATION, common_fields, flag, pick, section  # noqa: F401
from k3sim.errors import InputError, shorten


def is_hf_config(data: dict[str, Any]) -> bool:
    """HF configs carry `model_type`/`architectures`/`num_hidden_layers`; ours use `num_layers`."""
    return any(k in data for k in ("model_type", "architectures", "text_config", "num_hidden_layers"))


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


def kimi_fields(data: dict[str, Any], source: str, name: str) -> dict[str, Any]:
    """Kimi K3 / Kimi-Linear / K2 and DeepSeek-V3: KDA + MLA layers by `linear_attn_config`, (Latent)MoE."""
    text = section(data, "text_config", source) or data
    get = lambda *n, **kw: pick(text, *n, source=source, **kw)  # noqa: E731
    out, routed_format = common_fields(data, text, source, name)
    lin = section(text, "linear_attn_config", source)
    if lin:
        out["full_attn_layers"] = pick(lin, "full_attn_layers", source=source)
        if not isinstance(out["full_attn_layers"], list):
            raise InputError(f"expected a list of 1-based layer numbers (got {out['full_attn_layers']!r})",
                             source=source, field="linear_attn_config.full_attn_layers")
        head_dim = pick(lin, "head_dim", source=source)
        full_rank_gate = flag(lin if "use_full_rank_gate" in lin else text, "use_full_rank_gate", source)
        out["kda"] = {
            "num_heads": pick(lin, "num_heads", source=source),
            "head_dim_k": head_dim,
            "head_dim_v": head_dim,
            "conv_kernel_size": pick(lin, "short_conv_kernel_size", source=source, required=False, default=4),
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
            "output_gate": flag(text, "mla_use_output_gate", source),
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
            "latent_norm": flag(text, "latent_moe_use_norm", source),
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
    vision = _vision(section(data, "vision_config", source))
    if vision:
        out["vision"] = vision
    return out


# model_type -> translation. K3's top-level type is kimi_k3 (text model kimi_linear under text_config); K2's
# config.json says kimi_k2 (DeepSeek-V3 architecture).
HF_TYPES: dict[str, Callable[[dict, str, str], dict]] = {
    "kimi_k3": kimi_fields, "kimi_linear": kimi_fields, "kimi_k2": kimi_fields, "deepseek_v3": kimi_fields,
    **hf_hybrid.HF_TYPES,
}


# The inner text config type and the HF port's name of MiniMax-Text-01 are read too, but not listed in errors
# (the line stays within the CLI's 300 characters).
ALIASES = ("qwen3_5_moe_text", "minimax")


def hf_to_model_fields(data: dict[str, Any], source: str, name: str) -> dict[str, Any]:
    """Our ModelConfig fields from an HF config dict (the caller validates them), by its `model_type`."""
    known = ", ".join(t for t in HF_TYPES if t not in ALIASES)
    model_type = data.get("model_type")
    if model_type is None:
        raise InputError(f"missing in config.json (known model types: {known})", source=source, field="model_type")
    translate = HF_TYPES.get(model_type) if isinstance(model_type, str) else None
    if translate is None:
        raise InputError(f"unknown model_type {shorten(repr(model_type), 40)} (known: {known})", source=source,
                         field="model_type")
    return translate(data, source, name)
