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
sharded output all-gathered while the shared experts run -> latent norm -> router top-k -> [attention DP:
EP dispatch, `k3sim.comm.ep`] -> routed experts (token-centric MXFP4 streaming, or a tile-centric grouped
GEMM) on the busiest expert GPU's load (`expert_load`) -> [EP combine] -> latent partial sums
reduce-scattered -> latent up-projection -> TP all-reduce (with the shared experts' partial output).
Block AttnRes in decode: the inter-block step on a side stream, the intra-block step fused into the
all-reduce (MISSION sec. 3): its reads are counted, its time hidden.
"""

from __future__ import annotations

import math
from typing import Iterator

from k3sim.configs.mla import mla_attention_head_dims
from k3sim.configs.model import MODELLED_MIXERS, ModelConfig
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


def linear_dtype(model: ModelConfig, component: str) -> str:
    """The GEMM dtype of a linear layer: FP8 where the memory plan stores its weights in FP8 (block-scaled FP8
    checkpoints such as DeepSeek-V3 and K2 run their projections as FP8 GEMMs in vLLM, SGLang and DeepSeek's own
    stack, arXiv 2412.19437 sec. 3.3), so the bytes a step streams are the bytes the plan places; BF16
    otherwise. The router, the absorbed per-head products and the LM head stay BF16 (DeepSeek-V3 keeps gating
    and the output head in higher precision)."""
    from k3sim.memory.params import stored_format

    return "fp8" if stored_format(model, component) == "fp8" else "bf16"


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


def _low_rank_or_full(prefix: str, M: int, out: float, d: int, rank: int | None, dtype: str = "bf16") -> list[Call]:
    """A gate projection d -> out: one GEMM (full rank) or d -> rank (replicated) then rank -> out."""
    if rank is None:
        return [gemm(prefix, M, out, d, dtype)]
    return [gemm(prefix + "_a", M, rank, d, dtype), gemm(prefix + "_b", M, out, rank, dtype)]


def kda_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    """vLLM's KimiDeltaAttention path: merged q/k/v projection, decay gate (low rank a/b or full), beta,
    short conv, the KDA kernel, sigmoid-gated output RMSNorm, o_proj."""
    kda, d, t, M = model.kda, model.hidden_size, layout.tp, batch.tokens
    h = kda.num_heads / t
    dk, dv = kda.head_dim_k, kda.head_dim_v
    H = _c(h)
    yield rmsnorm("attn_norm", M, d)
    dt = linear_dtype(model, "kda")
    yield gemm("kda_qkv_proj", M, h * (2 * dk + dv), d, dt)
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
    yield from _low_rank_or_full("kda_decay_gate", M, h * dk, d, kda.alpha_gate_rank, dt)
    yield gemm("kda_beta_proj", M, h, d, dt)
    if batch.num_decode:
        yield Call("kda_recurrent", "recurrent_kda_decode",
                   {"B": batch.num_decode, "T": batch.tokens_per_decode, "H": H})
    for chunk, _prefix in batch.prefill:
        yield Call("kda_chunk_prefill", "chunk_kda_fwd", {"T": chunk, "H": H})
    yield from _low_rank_or_full("kda_out_gate", M, h * dv, d, kda.output_gate_rank, dt)
    yield Call("kda_out_norm", "gated_rmsnorm", {"T": M * H, "D": dv}, proxy_bytes=3 * M * h * dv * BF16)
    yield gemm("kda_o_proj", M, d, h * dv, dt)
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
    yield residual("attn_residual", M, d)
    if t > 1:
        yield tp_all_reduce(M, d, t)


def dense_ffn_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    d, t, M, w = model.hidden_size, layout.tp, batch.tokens, model.dense_ffn_width
    yield rmsnorm("ffn_norm", M, d)
    dt = linear_dtype(model, "dense_ffn")
    yield gemm("dense_gate_up", M, 2 * w / t, d, dt)
    yield swiglu("dense_swiglu", M, _c(w / t))
    yield gemm("dense_down", M, d, w / t, dt)
    yield residual("ffn_residual", M, d)
    if t > 1:
        yield tp_all_reduce(M, d, t)


def expert_tp(layout: StepLayout) -> int:
    """Experts split over tp/ep ranks when EP is narrower than TP (the memory planner's rule)."""
    from k3sim.memory.layout import expert_tp as etp

    return etp(layout.parallelism())


def ep_group_tokens(layout: StepLayout, batch: Batch) -> int:
    """Tokens that meet in one EP group's experts: the DP rank's own when EP sits inside its TP group,
    else those of the ep / tp attention-DP ranks the group spans (every rank's batch taken as this one)."""
    return batch.tokens * max(1, min(layout.attention_dp, layout.ep // layout.tp))


def expert_slots_per_gpu(model: ModelConfig, layout: StepLayout) -> int:
    """Expert slots one EP rank holds: (E + R) / ep, the busiest rank's ceil when ep does not divide them
    (DeepSeek-V3's 256 + 32 = 288 slots: 9 per GPU on EP 32, 2 on EP 144)."""
    return -(-(model.moe.num_routed_experts + layout.redundant_experts) // layout.ep)


def routes_by_distribution(layout: StepLayout) -> bool:
    """The expert load is drawn from the routing distribution (`expert_load`) when attention-DP ranks'
    tokens meet in the experts, redundant slots are placed, or the router is skewed; a layout with none of
    these (EP inside one TP group, a uniform router) keeps the expected per-rank load, as the whole-step
    checks measured it (one rank, uniform routing over its local experts)."""
    return layout.attention_dp > 1 or layout.redundant_experts > 0 or layout.routing_zipf > 0


def expert_load(model: ModelConfig, layout: StepLayout, batch: Batch):
    """Busiest EP rank's (token, expert) pairs over the mean (`k3sim.comm.routing.Imbalance`), for the
    layout's routing distribution (Zipf `routing_zipf` over a ranking seeded by `routing_seed`) and EPLB
    placement of its `redundant_experts` slots (`routing.eplb_imbalance`); 1 where `routes_by_distribution`
    is false or there is no EP. Its `max_over_mean` is the step's "expert_load_max_over_mean"."""
    from k3sim.comm.routing import Imbalance, eplb_imbalance

    tokens = ep_group_tokens(layout, batch)
    if model.moe is None or layout.ep <= 1 or not routes_by_distribution(layout):
        return Imbalance(1.0, 0, "expected", 0, tokens, layout.redundant_experts, "eplb")
    moe = model.moe
    return eplb_imbalance(moe.num_routed_experts, layout.ep, moe.num_active_experts, tokens,
                          redundant=layout.redundant_experts, skew=float(layout.routing_zipf),
                          seed=layout.routing_seed)


def routed_expert_shape(model: ModelConfig, layout: StepLayout, batch: Batch,
                        load: float = 1.0) -> dict[str, int]:
    """The routed-expert work of one rank: B tokens reaching it, E local expert slots, topk local picks
    per token, K input width, N expert width (per expert-TP shard).

    The EP group gathers the tokens of the DP ranks it spans (`ep_group_tokens`); the rank holds
    `expert_slots_per_gpu` slots. Local picks: k/ep of a token's k experts are local in expectation; when
    ep does not divide k, each (token, expert) pair is one local pick (topk 1) and the token count is
    scaled to keep the pairs (B k / ep). `load`: the rank's pairs over the mean (`expert_load` for the
    busiest rank; 1 = the mean rank)."""
    moe = model.moe
    ep = layout.ep
    k = moe.num_active_experts
    B = ep_group_tokens(layout, batch)
    if k % ep == 0:
        tokens, topk = (B if load == 1.0 else _c(B * load)), k // ep
    else:
        tokens, topk = _c(B * load * k / ep), 1
    return {"B": tokens, "E": expert_slots_per_gpu(model, layout), "K": moe.latent_width or model.hidden_size,
            "N": _c(moe.expert_ffn_width / expert_tp(layout)), "topk": topk}


def expert_calls(model: ModelConfig, layout: StepLayout, batch: Batch, kernel: str,
                 load: float = 1.0) -> Iterator[Call]:
    """Routed experts of one MoE layer on one rank carrying `load` x the mean rank's pairs.

    mxfp4_token: the token-centric MXFP4 kernel (gate/up + SwiGLU + down + weighted combine, one op);
    grouped_fp8: the tile-centric fp8 grouped GEMMs as one measured FFN op (tokens sorted by expert, torch's
    row-wise quantisation and gather in it);
    deepgemm_fp8: the deployed stacks' FP8 grouped GEMMs around DeepEP (`_deepgemm_calls`);
    grouped_bf16: as the measured whole-step model runs it: sort the (token, expert) pairs by local expert
    and gather rows, a grouped GEMM for gate/up, SwiGLU, a grouped GEMM for down, weighted scatter-sum."""
    s = routed_expert_shape(model, layout, batch, load)
    B, E, K, N, k = s["B"], s["E"], s["K"], s["N"], s["topk"]
    if kernel == "mxfp4_token":
        yield Call("routed_experts", "moe_mxfp4_decode", s)
        return
    if kernel == "grouped_fp8":
        yield Call("routed_experts", "moe_ffn_grouped_fp8", s)
        return
    if kernel == "deepgemm_fp8":
        yield from _deepgemm_calls(layout, batch, B, E, K, N, k)
        return
    yield Call("routed_experts_permute", "moe_permute", {"T": B, "topk": k, "D": K},
               proxy_bytes=2 * B * k * K * BF16)
    yield Call("routed_experts_gate_up", "moe_grouped_bf16", {"B": B, "E": E, "K": K, "N": 2 * N, "topk": k})
    yield swiglu("routed_experts_swiglu", B * k, N)
    yield Call("routed_experts_down", "moe_grouped_bf16", {"B": B, "E": E, "K": N, "N": K, "topk": k})
    yield Call("routed_experts_combine", "moe_combine", {"T": B, "topk": k, "D": K},
               proxy_bytes=2 * B * k * K * BF16)


def _deepgemm_calls(layout: StepLayout, batch: Batch, B: int, E: int, K: int, N: int, k: int) -> Iterator[Call]:
    """The routed experts as SGLang runs DeepSeek-V3 on DeepEP + DeepGEMM (lmsys.org 2025-05-05, "DeepGEMM
    integration"): FP8 grouped GEMMs (`moe_grouped_fp8`, measured alone) for gate/up and down, SwiGLU and the
    per-128-channel FP8 quantisation of its output (`fp8_quant_128`) between them. The dispatched tokens are
    FP8 already (no quantisation before gate/up). Low-latency dispatch lands tokens in per-expert buffers and
    its combine takes the weighted sum ("masked layout"): no permute; otherwise ("contiguous layout", normal
    kernels or no dispatch) the rows are permuted into expert order and un-permuted with the weighted sum."""
    masked = dispatches(layout) and ep_kernel(layout, batch) == "low_latency"
    if not masked:
        yield Call("routed_experts_permute", "ep_permute", {"T": B, "topk": k, "D": K})
    yield Call("routed_experts_gate_up", "moe_grouped_fp8", {"B": B, "E": E, "K": K, "N": 2 * N, "topk": k})
    yield swiglu("routed_experts_swiglu", B * k, N)
    yield Call("routed_experts_quant", "fp8_quant_128", {"T": B * k, "D": N})
    yield Call("routed_experts_down", "moe_grouped_fp8", {"B": B, "E": E, "K": N, "N": K, "topk": k})
    if not masked:
        yield Call("routed_experts_unpermute", "ep_unpermute", {"T": B, "topk": k, "D": K})


# Component names of the expert side of a MoE layer (prefix match): what runs where the DP ranks' tokens
# meet; every other component of a step depends only on its own DP rank's batch (CONTRACTS, issue 21).
EXPERT_SIDE = ("ep_dispatch", "routed_experts", "ep_combine")
DISPATCH_DTYPE_BYTES = {"fp8": 1, "bf16": 2}  # the op's dtype_bytes; fp8 scales: kernels.ops.ep_copy_bytes


def dispatches(layout: StepLayout) -> bool:
    """Tokens leave their rank for the experts: attention DP (each DP rank's tokens, split over its TP
    ranks, meet in the EP group) with experts spread over more than one rank."""
    return layout.attention_dp > 1 and layout.ep > 1


def ep_kernel(layout: StepLayout, batch: Batch) -> str:
    """The EP all-to-all kernel of this batch: the layout's, or for "auto" DeepEP's low-latency kernel for
    a decode-only batch whose tokens per rank fit its buffer, the normal kernel otherwise (SGLang
    `--deepep-mode auto`: low_latency in decode, normal in extend/prefill; a decode batch past the
    low-latency buffer, `k3sim.comm.ep.LL_MAX_TOKENS_PER_RANK`, needs the normal kernel)."""
    if layout.ep_kernel != "auto":
        return layout.ep_kernel
    from k3sim.comm.ep import LL_MAX_TOKENS_PER_RANK

    if batch.prefill or _c(batch.tokens / layout.tp) > LL_MAX_TOKENS_PER_RANK:
        return "normal"
    return "low_latency"


def dispatch_dtype_bytes(layout: StepLayout) -> int:
    """Bytes per dispatched element: 1 (fp8) or 2 (bf16). "auto" is the profile's choice, made by
    `StepLayout.for_hardware` before the step (a layout reaching the layers unresolved is a caller bug)."""
    if layout.dispatch_dtype not in DISPATCH_DTYPE_BYTES:
        raise ValueError(f"dispatch_dtype {layout.dispatch_dtype!r} is not resolved for a profile: "
                         "call StepLayout.for_hardware(hw) before the step")
    return DISPATCH_DTYPE_BYTES[layout.dispatch_dtype]


def ep_params(model: ModelConfig, layout: StepLayout, batch: Batch, phase: str) -> dict[str, int]:
    """The integer params of op "ep_dispatch" / "ep_combine" (k3sim.comm.ep, CONTRACTS): T tokens this
    rank sends (its DP rank's tokens split over the TP ranks inside it), D width per token copy (latent
    under LatentMoE, else hidden), routing (top-k of E logical experts, R redundant slots, Zipf x 1000,
    seed), the EP group (ep ranks, G per node, node-limited routing, 0 = unlimited), the kernel code and
    the element bytes (combine always bf16)."""
    from k3sim.comm.ep import KERNEL_CODES

    moe = model.moe
    return {"T": _c(batch.tokens / layout.tp), "D": moe.latent_width or model.hidden_size,
            "topk": moe.num_active_experts, "E": moe.num_routed_experts, "R": layout.redundant_experts,
            "ep": layout.ep, "G": layout.gpus_per_node, "nodes_max": layout.max_nodes_per_token or 0,
            "kernel": KERNEL_CODES[ep_kernel(layout, batch)],
            "dtype_bytes": dispatch_dtype_bytes(layout) if phase == "dispatch" else BF16,
            "zipf_milli": int(round(layout.routing_zipf * 1000)), "seed": layout.routing_seed}


def ep_call(model: ModelConfig, layout: StepLayout, batch: Batch, phase: str) -> Call:
    """The EP dispatch or combine of one MoE layer on one rank; proxy bytes are the T x topk token copies
    it sends (`kernels.ops.ep_copy_bytes`: fp8 values with their scales, or bf16)."""
    from k3sim.kernels.ops import ep_copy_bytes

    p = ep_params(model, layout, batch, phase)
    return Call(f"ep_{phase}", f"ep_{phase}", p,
                proxy_bytes=p["T"] * p["topk"] * ep_copy_bytes(phase, p["D"], p["dtype_bytes"]))


def moe_calls(model: ModelConfig, layout: StepLayout, batch: Batch, expert_kernel: str) -> Iterator[Call]:
    moe, d, t, M = model.moe, model.hidden_size, layout.tp, batch.tokens
    E, L = moe.num_routed_experts, moe.latent_width
    yield rmsnorm("ffn_norm", M, d)
    shared_w = (moe.shared_expert_ffn_width or moe.expert_ffn_width) * moe.num_shared_experts
    shared: list[Call] = []
    if shared_w:
        sdt = linear_dtype(model, "shared_experts")
        shared = [gemm("shared_experts_gate_up", M, 2 * shared_w / t, d, sdt),
                  swiglu("shared_experts_swiglu", M, _c(shared_w / t)),
                  gemm("shared_experts_down", M, d, shared_w / t, sdt)]
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
    if dispatches(layout):
        yield ep_call(model, layout, batch, "dispatch")
    yield from expert_calls(model, layout, batch, expert_kernel, expert_load(model, layout, batch).max_over_mean)
    if dispatches(layout):
        yield ep_call(model, layout, batch, "combine")
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
    if model.layer_kinds[layer] not in MODELLED_MIXERS:
        model.require_kinds(MODELLED_MIXERS, "the step model (decode, prefill, serving, training)", field="model")
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
