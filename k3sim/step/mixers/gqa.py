"""Grouped-query softmax attention (GQA) and sliding-window attention (SWA) as vLLM's Qwen3NextAttention /
LlamaAttention run it: the column-parallel QKV projection (q twice as wide with the sigmoid output gate:
Qwen3-Next's attn_output_gate), per-head q/k RMSNorms (Qwen3's qk_norm), RoPE over the rotated share of each head
(partial_rotary_factor; none for NoPE models), the KV cache write, the attention (prefill: FlashAttention-2 over
prefix + chunk, op `gqa_prefill_fwd`; decode: over each sequence's cache, op `gqa_decode`), the output gate and the
row-parallel o_proj. SWA is the same layer whose queries see at most `window_tokens` keys.

Per TP rank: Hq / tp query heads and Hkv / tp KV heads, or one replicated KV head when tp exceeds them (vLLM
QKVParallelLinear, configs/kinds/gqa.py `tp_rules`)."""

from __future__ import annotations

import math
from functools import partial
from typing import Iterator

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers.common import MixerCalls, _c, elementwise, gemm, linear_dtype, rmsnorm


def visible_pairs(tokens: int, window: int | None) -> int:
    """(query, key) pairs of causal attention over `tokens` positions when a query sees at most `window` keys
    (itself and window - 1 before it): sum over t of min(t + 1, window), as `kernels.ops.window_pairs`."""
    W = tokens if window is None else min(window, tokens)
    return W * (W + 1) // 2 + (tokens - W) * W


def prefill_shape(chunk: int, prefix: int, window: int | None) -> tuple[int, int]:
    """(T, window) of a `gqa_prefill_fwd` call with the (query, key) pairs of `chunk` queries after `prefix` cached
    tokens: the pairs of positions prefix .. prefix + chunk - 1, each seeing min(position + 1, window) keys.

    The measured op runs T queries over their own T keys (self-attention from position 0); a chunk after a cached
    prefix is priced at the shape of equal FLOP, as MLA's prefill is (a causal square of T (T + 1) / 2 pairs): T
    solving that for a window that does not bind at that size, else (T, window) with window (window + 1) / 2 +
    (T - window) window pairs, T >= window as the op requires. Without a prefix and a window, T = chunk."""
    pairs = visible_pairs(prefix + chunk, window) - visible_pairs(prefix, window)
    if window is not None and 2 * pairs >= window * (window + 1):
        return _c(pairs / window + (window - 1) / 2), window
    T = (math.isqrt(8 * pairs + 1) - 1) // 2
    if T * (T + 1) < 2 * pairs:
        T += 1
    return max(1, T), max(1, T)


def gqa_body(model: ModelConfig, layout: StepLayout, batch: Batch, kind: str = "gqa") -> Iterator[Call]:
    """The calls of a GQA (or SWA: `kind` "swa") layer; component names `gqa_*` for both."""
    cfg, d, t, M = model.section(kind), model.hidden_size, layout.tp, batch.tokens
    window = MIXERS[kind].window_tokens(cfg)
    hq, kv, D = cfg.num_heads / t, MIXERS[kind].tp_rules(cfg)[1].per_rank(t), cfg.head_dim
    Hq = _c(hq)
    dt = linear_dtype(model, kind)
    q_width = hq * D * (2 if cfg.output_gate else 1)
    yield gemm("gqa_qkv_proj", M, q_width + 2 * kv * D, d, dt)
    if cfg.qk_norm:
        yield rmsnorm("gqa_qk_norm", M * Hq, D)
        yield rmsnorm("gqa_qk_norm", M * kv, D)
    rotary = int(round(D * cfg.rope_fraction))
    if rotary >= 2:
        yield Call("gqa_rope", "rope", {"T": M, "H": Hq + kv, "D": rotary},
                   proxy_bytes=2 * M * (Hq + kv) * rotary * BF16)
    kv_width = 2 * kv * D
    yield Call("gqa_kv_cache_write", "kv_cache_write", {"T": M, "D": kv_width},
               proxy_bytes=M * kv_width * (BF16 + bytes_per_element(cfg.kv_cache_dtype)))
    heads = {"Hq": Hq, "Hkv": kv, "D": D}
    for chunk, prefix in batch.prefill:
        T, w = prefill_shape(chunk, prefix, window)
        yield Call("gqa_prefill_attention", "gqa_prefill_fwd", {"T": T, **heads, "window": w})
    if batch.num_decode:
        q = batch.tokens_per_decode
        ctx = _c(batch.mean_decode_context + q)
        # the q = 1 + k query tokens of an MTP verification fold into the query-head axis (each sequence's KV read
        # once, as MLA's decode); a window caps the keys a query reads
        C = ctx if window is None else min(ctx, window)
        yield Call("gqa_decode_attention", "gqa_decode",
                   {"B": batch.num_decode, "C": C, "Hq": Hq * q, "Hkv": kv, "D": D})
    if cfg.output_gate:
        yield elementwise("gqa_out_gate", "sigmoid_mul", M, hq * D, streams=3)
    yield gemm("gqa_o_proj", M, d, hq * D, dt)


_CORE = {"gqa_decode_attention": "GQA KV cache", "gqa_prefill_attention": "GQA prefill attention"}
GQA_CALLS = MixerCalls("gqa", partial(gqa_body, kind="gqa"), core=_CORE, per_chunk=("gqa_prefill_attention",),
                       decode_context=("gqa_decode_attention",))
SWA_CALLS = MixerCalls("swa", partial(gqa_body, kind="swa"), core=_CORE, per_chunk=("gqa_prefill_attention",),
                       decode_context=("gqa_decode_attention",))
