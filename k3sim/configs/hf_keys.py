"""Reading a Hugging Face `config.json`: typed key look-ups, quantization schemes and the fields every model
type shares, for the per-type translations in `hf.py` (Kimi, DeepSeek-V3) and `hf_hybrid.py` (the hybrid and
dense families). Every failure is an InputError naming the config.json key.
"""

from __future__ import annotations

from typing import Any

from k3sim.errors import InputError, shorten


def pick(cfg: dict, *names: str, source: str, required: bool = True, default: Any = None) -> Any:
    """The first of `names` present (and not null) in `cfg`; a missing required key is refused by its first name."""
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    if required:
        raise InputError("missing in config.json", source=source, field=names[0])
    return default


def section(cfg: dict, key: str, source: str) -> dict | None:
    """A nested block of config.json (`text_config`, `linear_attn_config`, ...): a mapping or absent."""
    value = cfg.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise InputError(f"expected a mapping, got {type(value).__name__}", source=source, field=key)


def flag(cfg: dict, key: str, source: str, default: bool = False) -> bool:
    """A true/false field; absent or null = `default`. A string such as "false" is rejected, not read as true."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"expected true or false (got {shorten(repr(value), 40)})", source=source, field=key)
    return value


def key_list(cfg: dict, key: str, source: str, length: int, what: str) -> list | None:
    """A per-layer list (`layer_types`, `attn_type_list`, a pattern string's characters), checked to hold one
    entry per layer (`num_hidden_layers`); None if absent."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, str) and what == "characters":
        value = list(value)
    if not isinstance(value, list):
        raise InputError(f"expected a list (got {type(value).__name__})", source=source, field=key)
    if len(value) != length:
        raise InputError(f"has {len(value):,} {what} but num_hidden_layers is {length:,}: one per layer",
                         source=source, field=key)
    return value


def unknown_entry(key: str, value: Any, known: str, source: str) -> InputError:
    return InputError(f"unknown entry {shorten(repr(value), 30)} (known: {known})", source=source, field=key)


# HF torch dtype names -> ours (configs/dtypes.py).
HF_DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16",
             "fp16": "fp16", "half": "fp16", "float": "fp32"}


def dtype(cfg: dict, key: str, source: str, default: str = "fp32") -> str:
    """A dtype key (`mamba_ssm_dtype`, `mamba_ssm_cache_dtype`: "float32", "bfloat16", ...) as our name; absent
    or "auto" = `default` (fp32 for recurrent states: what fla, mamba_ssm and vLLM keep by default)."""
    value = cfg.get(key)
    if value is None or value == "auto":
        return default
    name = HF_DTYPES.get(str(value).lower())
    if name is None:
        raise InputError(f"unknown dtype {shorten(repr(value), 30)} (known: {', '.join(HF_DTYPES)})",
                         source=source, field=key)
    return name


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


def quant_formats(quant: dict | None, source: str = "config.json") -> tuple[str, str]:
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


def common_fields(data: dict, text: dict, source: str, name: str) -> tuple[dict[str, Any], str]:
    """The fields every model type shares (name, widths, vocabulary, context limit, tied embeddings, weight
    format) and the routed experts' format; `text` is the text model's block (`text_config`) or `data`."""
    quant = section(data, "quantization_config", source) or section(text, "quantization_config", source)
    weight_format, routed_format = quant_formats(quant, source)
    get = lambda *n, **kw: pick(text, *n, source=source, **kw)  # noqa: E731
    tie = text if "tie_word_embeddings" in text else data
    out = {
        "name": str(data.get("_name_or_path") or name),
        "source": f"Hugging Face config.json ({source})",
        "hidden_size": get("hidden_size"),
        "num_layers": get("num_hidden_layers"),
        "vocab_size": get("vocab_size"),
        "max_context_tokens": text.get("max_position_embeddings") or data.get("max_position_embeddings"),
        "tie_word_embeddings": flag(tie, "tie_word_embeddings", source),
        "weight_format": weight_format,
    }
    return out, routed_format
