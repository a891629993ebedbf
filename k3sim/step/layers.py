"""What one layer launches for a step's token work, per GPU of the layout: the kernel calls.

Shapes per rank follow the memory planner's sharding (`k3sim.memory.plan`: attention, dense FFN, shared
experts, latent projections and router split over TP; routed experts over EP, then expert-TP when EP < TP),
so the weight bytes a step streams are the bytes the plan places. The sequence of calls is the vLLM-style
decode path of a K3 layer (MISSION sec. 1, 3, 4):

KDA: RMSNorm -> merged q/k/v projection -> short conv (+ conv state) -> decay-gate and beta projections
-> recurrent KDA (decode; `recurrent_kda_decode`, state read+write in the kernel) or chunkwise KDA
from the cached state (prefill; `chunk_kda_fwd`) -> gated output norm -> o_proj -> TP all-reduce.
MLA (absorbed decode): RMSNorm -> q_a/kv_a down-projection (whole, or sharded + all-gathered) -> norms
-> q_b -> q_nope x W_UK absorption -> latent attention over the cache (`mla_decode`) -> x W_UV -> output
gate -> o_proj -> TP all-reduce. Prefill chunks expand the cached latent of prefix + chunk into K/V
(kv_b GEMM) and run causal attention of the chunk's queries against it.
LatentMoE: RMSNorm -> latent down-projection fused with the router in one GEMM (or two GEMMs), its
sharded output all-gathered while the shared experts run -> latent norm -> router top-k -> routed
experts (token-centric MXFP4 streaming, or a tile-centric grouped GEMM) -> latent partial sums
reduce-scattered -> latent up-projection -> TP all-reduce (with the shared experts' partial output).
Block AttnRes in decode: the inter-block step on a side stream, the intra-block step fused into the
all-reduce (MISSION sec. 3): its reads are counted, its time hidden.
"""

from __future__ import annotations

import math
from typing import Iterator

from k3sim.configs.mla import mla_attention_head_dims
from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout

# Small kernels of a step, by the op names the calibration harness measures them under
# (`k3sim/calibration/decode_ops.py`, `k3sim/kernels/ops_decode.py`).
RMSNORM, SILU_MUL, ROUTER_TOPK, RESIDUAL = "rmsnorm", "silu_mul", "router_topk", "residual_add"


def _c(x: float) -> int:
    return max(1, int(math.ceil(x)))


def rmsnorm(component: str, M: int, N: int) -> Call:
    return Call(component, RMSNORM, {"T": M, "D": _c(N)}, proxy_bytes=2 * M * N * BF16)


def swiglu(component: str, M: int, N: int) -> Call:
    """silu(gate) * up over N outputs: reads 2N, writes N per token."""
    return Call(component, SILU_MUL, {"T": M, "N": _c(N)}, proxy_bytes=3 * M * N * BF16)


def residual(component: str, M: int, d: int) -> Call:
    return Call(component, RESIDUAL, {"T": M, "D": d}, proxy_bytes=3 * M * d * BF16)


def elementwise(component: str, op: str, M: int, N: float, streams: float = 2.0) -> Call:
    """An elementwise kernel over M x N bf16 values reading and writing `streams` tensors in all."""
    return Call(component, op, {"T": M, "D": _c(N)}, proxy_bytes=streams * M * N * BF16)


def gemm(component: str, M: int, N: int, K: int, dtype: str = "bf16") -> Call:
    return Call(component, f"gemm_{dtype}", {"M": M, "N": _c(N), "K": _c(K)})


def collective(component: str, op: str, nbytes: float, gpus: int, **kw) -> Call:
    return Call(component, op, {"bytes": _c(nbytes), "gpus": gpus}, **kw)


# vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py: CustomAllreduce,
# _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8], max_size = 8192 * 1024 bytes) takes a serving step's TP
# all-reduce inside one NVLink domain; larger buffers and other group sizes go to NCCL.
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_AR_MAX_BYTES = 8192 * 1024


def tp_all_reduce(M: int, d: int, t: int) -> Call:
    nbytes = M * d * BF16
    if t in CUSTOM_AR_WORLD_SIZES and nbytes <= CUSTOM_AR_MAX_BYTES:
        return collective("tp_all_reduce", "custom_all_reduce", nbytes, t)
    return collective("tp_all_reduce", "all_reduce", nbytes, t)


def _low_rank_or_full(prefix: str, M: int, out: float, d: int, rank: int | None) -> list[Call]:
    """A gate projection d -> out: one GEMM (full rank) or d -> rank (replicated) then rank -> out."""
    if rank is None:
        return [gemm(prefix, M, out, d)]
    return [gemm(prefix + "_a", M, rank, d), gemm(prefix + "_b", M, out, rank)]


def kda_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    """vLLM's KimiDeltaAttention path: merged q/k/v projection, decay gate (low rank a/b or full), beta,
    short conv, the KDA kernel, sigmoid-gated output RMSNorm, o_proj."""
    kda, d, t, M = model.kda, model.hidden_size, layout.tp, batch.tokens
    h = kda.num_heads / t
    dk, dv = kda.head_dim_k, kda.head_dim_v
    H = _c(h)
    yield rmsnorm("attn_norm", M, d)
    yield gemm("kda_qkv_proj", M, h * (2 * dk + dv), d)
    channels = _c(h * (2 * dk + dv))
    w = kda.conv_kernel_size
    if batch.num_decode:
        B = batch.num_decode
        state = B * (w - 1) * channels * BF16 * 2  # read + write
        yield Call("kda_short_conv", "conv1d_update", {"B": B, "D": channels, "W": w},
                   proxy_bytes=2 * batch.decode_tokens * channels * BF16 + state)
    for chunk, _prefix in batch.prefill:
        yield Call("kda_short_conv", "causal_conv1d_fwd", {"B": 1, "T": chunk, "D": channels, "W": w},
                   proxy_bytes=2 * chunk * channels * BF16)
    yield from _low_rank_or_full("kda_decay_gate", M, h * dk, d, kda.alpha_gate_rank)
    yield gemm("kda_beta_proj", M, h, d)
    if batch.num_decode:
        yield Call("kda_recurrent", "recurrent_kda_decode",
                   {"B": batch.num_decode, "T": batch.tokens_per_decode, "H": H})
    for chunk, _prefix in batch.prefill:
        yield Call("kda_chunk_prefill", "chunk_kda_fwd", {"T": chunk, "H": H})
    yield from _low_rank_or_full("kda_out_gate", M, h * dv, d, kda.output_gate_rank)
    yield Call("kda_out_norm", "gated_rmsnorm", {"T": M * H, "D": dv}, proxy_bytes=3 * M * h * dv * BF16)
    yield gemm("kda_o_proj", M, d, h * dv)
    yield residual("attn_residual", M, d)
    if t > 1:
        yield tp_all_reduce(M, d, t)


def mla_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    """DeepSeek-V3-style MLA as vLLM serves it: q_a/kv_a down-projection (whole on every rank, or sharded
    and all-gathered), latent norms, q_b, then absorbed decode (q_nope x W_UK, attention over the latent
    cache, x W_UV) or expanded prefill (kv_b over prefix + chunk, causal attention); K3's sigmoid output
    gate; o_proj."""
    mla, d, t, M = model.mla, model.hidden_size, layout.tp, batch.tokens
    h = mla.num_heads / t
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    lat = mla.kv_lora_rank + mla.qk_rope_head_dim
    yield rmsnorm("attn_norm", M, d)
    shard = 1 if layout.replicated_down_proj else t
    if mla.q_lora_rank is None:
        yield gemm("mla_q_proj", M, h * qk, d)
        down = lat
    else:
        down = mla.q_lora_rank + lat
    yield gemm("mla_qkv_a_proj", M, down / shard, d)
    if shard > 1:  # column-sharded down-projection: every rank needs the whole latent
        yield collective("mla_qkv_a_all_gather", "all_gather", M * down / shard * BF16, shard)
    if mla.q_lora_rank is not None:
        yield rmsnorm("mla_q_a_norm", M, mla.q_lora_rank)
        yield gemm("mla_q_b_proj", M, h * qk, mla.q_lora_rank)
    yield rmsnorm("mla_kv_a_norm", M, mla.kv_lora_rank)
    yield Call("mla_kv_cache_write", "kv_cache_write", {"T": M, "D": lat}, proxy_bytes=2 * M * lat * BF16)
    for chunk, prefix in batch.prefill:
        yield gemm("mla_kv_b_expand", prefix + chunk, h * (mla.qk_nope_head_dim + mla.v_head_dim),
                   mla.kv_lora_rank)
        # causal attention of `chunk` queries over prefix + chunk keys: c (p + c/2) query-key pairs, the
        # pairs of a causal square of side sqrt(c (2p + c)) (FLOP-equivalent shape of the measured op)
        side = _c(math.sqrt(chunk * (2 * prefix + chunk)))
        yield Call("mla_prefill_attention", "sdpa_causal_fwd",
                   {"T": side, "H": _c(h), "D": mla_attention_head_dims(mla).kernel_head_dim})
    if batch.num_decode:
        Bt = batch.decode_tokens
        # per-head batched products, as GEMMs of equal FLOP and weight bytes
        yield gemm("mla_q_absorb", Bt, h * mla.kv_lora_rank, mla.qk_nope_head_dim)
        ctx = _c(batch.mean_decode_context + batch.tokens_per_decode)
        yield Call("mla_decode_attention", "mla_decode", {"B": Bt, "C": ctx, "H": _c(h)},
                   proxy_bytes=Bt * ctx * lat * BF16)
        yield gemm("mla_v_up", Bt, h * mla.v_head_dim, mla.kv_lora_rank)
    if mla.output_gate:
        yield gemm("mla_out_gate", M, h * mla.v_head_dim, d)
        yield elementwise("mla_out_gate_mul", "sigmoid_mul", M, h * mla.v_head_dim, streams=3)
    yield gemm("mla_o_proj", M, d, h * mla.v_head_dim)
    yield residual("attn_residual", M, d)
    if t > 1:
        yield tp_all_reduce(M, d, t)


def dense_ffn_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    d, t, M, w = model.hidden_size, layout.tp, batch.tokens, model.dense_ffn_width
    yield rmsnorm("ffn_norm", M, d)
    yield gemm("dense_gate_up", M, 2 * w / t, d)
    yield swiglu("dense_swiglu", M, _c(w / t))
    yield gemm("dense_down", M, d, w / t)
    yield residual("ffn_residual", M, d)
    if t > 1:
        yield tp_all_reduce(M, d, t)


def expert_tp(layout: StepLayout) -> int:
    """Experts split over tp/ep ranks when EP is narrower than TP (the memory planner's rule)."""
    from k3sim.memory.layout import expert_tp as etp

    return etp(layout.parallelism())


def routed_expert_shape(model: ModelConfig, layout: StepLayout, batch: Batch) -> dict[str, int]:
    """The routed-expert work of one rank: B tokens reaching it, E local experts, topk local picks per
    token, K input width, N expert width (per expert-TP shard).

    With attention DP the EP group gathers the tokens of all DP ranks. Local picks: k/ep of a token's k
    experts are local in expectation; when ep does not divide k, each (token, expert) pair is one local
    pick (topk 1) and the token count is scaled to keep the pairs (B k / ep)."""
    moe = model.moe
    ep = layout.ep
    E = moe.num_routed_experts // ep
    k = moe.num_active_experts
    B = batch.tokens * layout.attention_dp
    if k % ep == 0:
        tokens, topk = B, k // ep
    else:
        tokens, topk = _c(B * k / ep), 1
    return {"B": tokens, "E": E, "K": moe.latent_width or model.hidden_size,
            "N": _c(moe.expert_ffn_width / expert_tp(layout)), "topk": topk}


def expert_calls(model: ModelConfig, layout: StepLayout, batch: Batch, kernel: str) -> Iterator[Call]:
    """Routed experts of one MoE layer on one rank.

    mxfp4_token: the token-centric MXFP4 kernel (gate/up + SwiGLU + down + weighted combine, one op);
    grouped_fp8: the tile-centric fp8 grouped GEMMs as one measured FFN op (tokens sorted by expert);
    grouped_bf16: as the measured whole-step model runs it: sort the (token, expert) pairs by local expert
    and gather rows, a grouped GEMM for gate/up, SwiGLU, a grouped GEMM for down, weighted scatter-sum."""
    s = routed_expert_shape(model, layout, batch)
    B, E, K, N, k = s["B"], s["E"], s["K"], s["N"], s["topk"]
    if kernel == "mxfp4_token":
        yield Call("routed_experts", "moe_mxfp4_decode", s)
        return
    if kernel == "grouped_fp8":
        yield Call("routed_experts", "moe_ffn_grouped_fp8", s)
        return
    yield Call("routed_experts_permute", "moe_permute", {"T": B, "topk": k, "D": K},
               proxy_bytes=2 * B * k * K * BF16)
    yield Call("routed_experts_gate_up", "moe_grouped_bf16", {"B": B, "E": E, "K": K, "N": 2 * N, "topk": k})
    yield swiglu("routed_experts_swiglu", B * k, N)
    yield Call("routed_experts_down", "moe_grouped_bf16", {"B": B, "E": E, "K": N, "N": K, "topk": k})
    yield Call("routed_experts_combine", "moe_combine", {"T": B, "topk": k, "D": K},
               proxy_bytes=2 * B * k * K * BF16)


def moe_calls(model: ModelConfig, layout: StepLayout, batch: Batch, expert_kernel: str) -> Iterator[Call]:
    moe, d, t, M = model.moe, model.hidden_size, layout.tp, batch.tokens
    E, L = moe.num_routed_experts, moe.latent_width
    yield rmsnorm("ffn_norm", M, d)
    shared_w = (moe.shared_expert_ffn_width or moe.expert_ffn_width) * moe.num_shared_experts
    shared: list[Call] = []
    if shared_w:
        shared = [gemm("shared_experts_gate_up", M, 2 * shared_w / t, d),
                  swiglu("shared_experts_swiglu", M, _c(shared_w / t)),
                  gemm("shared_experts_down", M, d, shared_w / t)]
    shard = 1 if layout.replicated_down_proj else t
    if L:
        if layout.fuse_router:
            yield gemm("moe_latent_down+router", M, (L + E) / shard, d)
        else:
            yield gemm("moe_latent_down", M, L / shard, d)
            yield gemm("moe_router", M, E / shard, d)
        yield from shared
        if shard > 1:  # sharded latent + logits gathered while the shared experts run
            yield collective("moe_latent_all_gather", "all_gather", M * (L + E) / t * BF16, t,
                             overlap_with="shared_experts")
        if moe.latent_norm:
            yield rmsnorm("moe_latent_norm", M, L)
    else:
        yield gemm("moe_router", M, E / t, d)
        yield from shared
    yield Call("moe_router_topk", ROUTER_TOPK, {"T": M, "E": E, "topk": moe.num_active_experts},
               proxy_bytes=M * E * 4)
    width = L or d
    if layout.attention_dp > 1:  # tokens of every DP rank meet in the experts
        a2a = M * moe.num_active_experts * width * BF16
        yield collective("ep_dispatch_all_to_all", "all_to_all", a2a, layout.stage_gpus)
    yield from expert_calls(model, layout, batch, expert_kernel)
    if layout.attention_dp > 1:
        yield collective("ep_combine_all_to_all", "all_to_all", a2a, layout.stage_gpus)
    if L:
        if shard > 1:  # each rank summed its local experts in latent space; the up-projection is sharded
            yield collective("moe_latent_reduce_scatter", "reduce_scatter", M * L / shard * BF16, shard)
        yield gemm("moe_latent_up", M, d, L / shard)
    yield residual("ffn_residual", M, d)
    if t > 1:
        yield tp_all_reduce(M, d, t)


def attn_res_calls(model: ModelConfig, batch: Batch, layer: int) -> Iterator[Call]:
    """Block AttnRes reads the block representatives finished so far, once per sublayer (2 per layer).
    Decode: side stream / fused into the all-reduce (hidden); prefill tokens: on the main stream."""
    if not model.attn_res_block_size:
        return
    blocks = layer // model.attn_res_block_size + 1
    d = model.hidden_size
    if batch.decode_tokens:
        yield Call("attn_res_decode", "attn_res_read", {}, count=2, hidden=True,
                   proxy_bytes=blocks * batch.decode_tokens * d * BF16)
    if batch.prefill_tokens:
        yield Call("attn_res_prefill", "attn_res_read", {}, count=2,
                   proxy_bytes=blocks * batch.prefill_tokens * d * BF16)


def layer_calls(model: ModelConfig, layer: int, layout: StepLayout, batch: Batch,
                expert_kernel: str) -> list[Call]:
    """All calls of layer `layer` (0-based) for `batch` on one GPU of `layout`."""
    calls = list(kda_calls(model, layout, batch) if model.layer_kinds[layer] == "kda"
                 else mla_calls(model, layout, batch))
    calls += list(dense_ffn_calls(model, layout, batch) if model.ffn_kinds[layer] == "dense"
                  else moe_calls(model, layout, batch, expert_kernel))
    calls += list(attn_res_calls(model, batch, layer))
    return calls


def embedding_calls(model: ModelConfig, batch: Batch) -> list[Call]:
    M, d = batch.tokens, model.hidden_size
    return [Call("embedding", "embedding", {"T": M, "D": d}, proxy_bytes=2 * M * d * BF16)]


def lm_head_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> list[Call]:
    """Final norm, vocab-parallel LM head over the tokens that need logits (every decode token, the last
    token of each prefill chunk), the TP all-gather of logits and sampling over the vocabulary."""
    d, V, t = model.hidden_size, model.vocab_size, layout.tp
    m = batch.decode_tokens + len(batch.prefill)
    calls = [rmsnorm("final_norm", batch.tokens, d), gemm("lm_head", m, V / t, d)]
    if t > 1:
        calls.append(collective("logits_all_gather", "all_gather", m * V / t * BF16, t))
    calls.append(Call("sampling", "sampling", {}, proxy_bytes=m * V * 4))
    return calls


def layer_signature(model: ModelConfig, layer: int) -> tuple:
    """Layers with equal signatures launch identical calls (memoisation key)."""
    blocks = layer // model.attn_res_block_size + 1 if model.attn_res_block_size else 0
    return (model.layer_kinds[layer], model.ffn_kinds[layer], blocks)
