"""Multi-head latent attention as vLLM serves DeepSeek-V3-style MLA (MISSION sec. 1, 3): q_a/kv_a
down-projection (whole on every rank, or sharded and all-gathered), latent norms, q_b, then absorbed decode
(q_nope x W_UK, attention over the latent cache, x W_UV) or expanded prefill (kv_b over prefix + chunk, causal
attention of the chunk's queries against it); K3's sigmoid output gate; o_proj."""

from __future__ import annotations

import math
from typing import Iterator

from k3sim.configs.mla import mla_attention_head_dims
from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers.common import MixerCalls, _c, collective, elementwise, gemm, linear_dtype, rmsnorm


def mla_body(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    mla, d, t, M = model.mla, model.hidden_size, layout.tp, batch.tokens
    h = mla.num_heads / t
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    lat = mla.kv_lora_rank + mla.qk_rope_head_dim
    shard = 1 if layout.replicated_down_proj else t
    dt = linear_dtype(model, "mla")
    if mla.q_lora_rank is None:
        yield gemm("mla_q_proj", M, h * qk, d, dt)
        down = lat
    else:
        down = mla.q_lora_rank + lat
    yield gemm("mla_qkv_a_proj", M, down / shard, d, dt)
    if shard > 1:  # column-sharded down-projection: every rank needs the whole latent
        yield collective("mla_qkv_a_all_gather", "all_gather", M * down / shard * BF16, shard)
    if mla.q_lora_rank is not None:
        yield rmsnorm("mla_q_a_norm", M, mla.q_lora_rank)
        yield gemm("mla_q_b_proj", M, h * qk, mla.q_lora_rank, dt)
    yield rmsnorm("mla_kv_a_norm", M, mla.kv_lora_rank)
    yield Call("mla_kv_cache_write", "kv_cache_write", {"T": M, "D": lat}, proxy_bytes=2 * M * lat * BF16)
    for chunk, prefix in batch.prefill:
        yield gemm("mla_kv_b_expand", prefix + chunk, h * (mla.qk_nope_head_dim + mla.v_head_dim),
                   mla.kv_lora_rank, dt)
        # causal attention of `chunk` queries over prefix + chunk keys: c (p + c/2) query-key pairs, the
        # pairs of a causal square of side sqrt(c (2p + c)) (FLOP-equivalent shape of the measured op)
        side = _c(math.sqrt(chunk * (2 * prefix + chunk)))
        yield Call("mla_prefill_attention", "sdpa_causal_fwd",
                   {"T": side, "H": _c(h), "D": mla_attention_head_dims(mla).kernel_head_dim})
    if batch.num_decode:
        Bt, B, q = batch.decode_tokens, batch.num_decode, batch.tokens_per_decode
        # per-head batched products, as GEMMs of equal FLOP and weight bytes
        yield gemm("mla_q_absorb", Bt, h * mla.kv_lora_rank, mla.qk_nope_head_dim)
        ctx = _c(batch.mean_decode_context + q)
        # the q = 1 + k query tokens of an MTP verification fold into the head axis, so the latent cache is
        # read once per sequence, not once per query token (deepseek-ai/FlashMLA flash_mla_interface.py,
        # get_mla_metadata: num_heads_per_head_k "equals to seq_len_q * num_heads_q // num_heads_k")
        op = "mla_decode_flashmla" if layout.mla_decode_kernel == "flashmla" else "mla_decode"
        yield Call("mla_decode_attention", op, {"B": B, "C": ctx, "H": _c(h) * q},
                   proxy_bytes=B * ctx * lat * BF16)
        yield gemm("mla_v_up", Bt, h * mla.v_head_dim, mla.kv_lora_rank)
    if mla.output_gate:
        yield gemm("mla_out_gate", M, h * mla.v_head_dim, d, dt)
        yield elementwise("mla_out_gate_mul", "sigmoid_mul", M, h * mla.v_head_dim, streams=3)
    yield gemm("mla_o_proj", M, d, h * mla.v_head_dim, dt)


CALLS = MixerCalls("mla", mla_body,
                   core={"mla_decode_attention": "MLA KV cache", "mla_prefill_attention": "MLA prefill attention"},
                   per_chunk=("mla_kv_b_expand", "mla_prefill_attention"), decode_context=("mla_decode_attention",))
