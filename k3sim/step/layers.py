"""What one layer launches for a step's token work, per GPU of the layout: the kernel calls.

Shapes per rank follow the memory planner's sharding (`k3sim.memory.plan`: attention, dense FFN, shared
experts, latent projections and router split over TP; routed experts over EP, then expert-TP when EP < TP),
so the weight bytes a step streams are the bytes the plan places. A layer (`configs.kinds.Layer`) is its mixer
sublayer (none, one or several mixers in parallel: `step.mixers`, one call builder per mixer kind, e.g. KDA:
RMSNorm -> merged q/k/v projection -> short conv -> decay-gate and beta projections -> recurrent KDA (decode) or
chunkwise KDA from the cached state (prefill) -> gated output norm -> o_proj -> TP all-reduce), then its FFN
(dense, MoE or none), then Block AttnRes's reads. The sequence of calls is the vLLM-style path of a layer
(MISSION sec. 1, 3, 4):

Dense FFN: RMSNorm -> gate/up GEMM (up alone for a plain MLP, `ffn_gated: false`) -> SwiGLU (squared ReLU)
-> down -> TP all-reduce.
(Latent)MoE: RMSNorm -> latent down-projection fused with the router in one GEMM (or two GEMMs), its
sharded output all-gathered while the shared experts run -> latent norm -> router top-k (sigmoid scores, or
softmax: `moe.router_score`) -> [attention DP: EP dispatch, `k3sim.comm.ep`] -> routed experts (token-centric
MXFP4 streaming, or a tile-centric grouped GEMM) on the busiest expert GPU's load (`expert_load`) -> [EP
combine] -> latent partial sums reduce-scattered -> latent up-projection -> TP all-reduce (with the shared
experts' partial output, scaled by their sigmoid gate where `moe.shared_expert_gate`). Without LatentMoE the
router reads the hidden state and the experts run at the hidden width.
Block AttnRes in decode: the inter-block step on a side stream, the intra-block step fused into the
all-reduce (MISSION sec. 3): its reads are counted, its time hidden.
"""

from __future__ import annotations

from typing import Iterator

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers import (CORE, DECODE_CONTEXT, MIXER_CALLS, PER_CHUNK, PROXY_NOTES,  # noqa: F401 - re-exported
                               mixer_calls)
from k3sim.step.mixers.common import (  # noqa: F401 - re-exported: the call primitives' old home
    CUSTOM_AR_MAX_BYTES, CUSTOM_AR_WORLD_SIZES, RESIDUAL, RMSNORM, ROUTER_SOFTMAX_TOPK, ROUTER_TOPK,
    SHARED_EXPERT_GATE, SILU_MUL, _c, all_reduce, collective, elementwise, ffn_activation, ffn_in_proj, gemm,
    linear_dtype, low_rank_or_full, residual, rmsnorm, swiglu, tp_all_reduce)

def kind_calls(model: ModelConfig, kind: str, layout: StepLayout, batch: Batch) -> list[Call]:
    """The body of one mixer of kind `kind` (`step.mixers.MIXER_CALLS`): its calls between the layer's input
    norm and its residual, for `batch` on one GPU of `layout` (what a per-kind sum over layers multiplies)."""
    return list(MIXER_CALLS[kind].body(model, layout, batch))


def kda_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    """A KDA layer's mixer sublayer (norm, `step.mixers.kda`, residual, TP all-reduce)."""
    return mixer_calls(model, ("kda",), layout, batch)


def mla_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    """An MLA layer's mixer sublayer (norm, `step.mixers.mla`, residual, TP all-reduce)."""
    return mixer_calls(model, ("mla",), layout, batch)


def dense_ffn_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    d, t, M, w = model.hidden_size, layout.tp, batch.tokens, model.dense_ffn_width
    yield rmsnorm("ffn_norm", M, d)
    dt = linear_dtype(model, "dense_ffn")
    yield ffn_in_proj(model, "dense", M, w / t, d, dt)
    yield ffn_activation(model, "dense", M, _c(w / t))
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
    if kernel in ("mxfp4_token", "grouped_fp8"):
        op = "moe_mxfp4_decode" if kernel == "mxfp4_token" else "moe_ffn_grouped_fp8"
        yield Call("routed_experts", op, s if model.ffn_gated else _plain_mlp_shape(s))
        return
    if kernel == "deepgemm_fp8":
        yield from _deepgemm_calls(model, layout, batch, B, E, K, N, k)
        return
    yield Call("routed_experts_permute", "moe_permute", {"T": B, "topk": k, "D": K},
               proxy_bytes=2 * B * k * K * BF16)
    up = "routed_experts_gate_up" if model.ffn_gated else "routed_experts_up"
    yield Call(up, "moe_grouped_bf16", {"B": B, "E": E, "K": K, "N": _up_width(model, N), "topk": k})
    yield ffn_activation(model, "routed_experts", B * k, N)
    yield Call("routed_experts_down", "moe_grouped_bf16", {"B": B, "E": E, "K": N, "N": K, "topk": k})
    yield Call("routed_experts_combine", "moe_combine", {"T": B, "topk": k, "D": K},
               proxy_bytes=2 * B * k * K * BF16)


def _up_width(model: ModelConfig, N: int) -> int:
    """Outputs of the experts' input GEMM: gate and up (2N) for a GLU, up alone (N) for a plain MLP."""
    return 2 * N if model.ffn_gated else N


def _plain_mlp_shape(s: dict[str, int]) -> dict[str, int]:
    """A plain (up, down) expert MLP as the one-op GLU expert kernels' shape of equal weight bytes and FLOP: their
    formulas count three K x N matrices (`kernels.ops_decode.expert_ffn_flop`), a plain MLP has two, so N x 2/3
    (modelling choice: the measured kernels run a GLU; no plain-MLP expert kernel is measured)."""
    return dict(s, N=_c(2 * s["N"] / 3))


def _deepgemm_calls(model: ModelConfig, layout: StepLayout, batch: Batch, B: int, E: int, K: int, N: int,
                    k: int) -> Iterator[Call]:
    """The routed experts as SGLang runs DeepSeek-V3 on DeepEP + DeepGEMM (lmsys.org 2025-05-05, "DeepGEMM
    integration"): FP8 grouped GEMMs (`moe_grouped_fp8`, measured alone) for gate/up and down, SwiGLU and the
    per-128-channel FP8 quantisation of its output (`fp8_quant_128`) between them. The dispatched tokens are
    FP8 already (no quantisation before gate/up). Low-latency dispatch lands tokens in per-expert buffers and
    its combine takes the weighted sum ("masked layout"): no permute; otherwise ("contiguous layout", normal
    kernels or no dispatch) the rows are permuted into expert order and un-permuted with the weighted sum."""
    masked = dispatches(layout) and ep_kernel(layout, batch) == "low_latency"
    if not masked:
        yield Call("routed_experts_permute", "ep_permute", {"T": B, "topk": k, "D": K})
    up = "routed_experts_gate_up" if model.ffn_gated else "routed_experts_up"
    yield Call(up, "moe_grouped_fp8", {"B": B, "E": E, "K": K, "N": _up_width(model, N), "topk": k})
    yield ffn_activation(model, "routed_experts", B * k, N)
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
    shared = shared_expert_calls(model, layout, batch)
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
    yield router_topk(model, M)
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


def shared_expert_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> list[Call]:
    """The shared experts of a MoE layer (one FFN of their summed width, TP-sharded as a dense FFN), then, where
    `moe.shared_expert_gate`, their sigmoid gate (Qwen3-Next's `shared_expert_gate`: Linear(hidden, 1), the
    output times its sigmoid; op `shared_expert_gate` {T, D = hidden}, the d -> 1 product and the multiply)."""
    moe, d, t, M = model.moe, model.hidden_size, layout.tp, batch.tokens
    shared_w = (moe.shared_expert_ffn_width or moe.expert_ffn_width) * moe.num_shared_experts
    if not shared_w:
        return []
    sdt = linear_dtype(model, "shared_experts")
    calls = [ffn_in_proj(model, "shared_experts", M, shared_w / t, d, sdt),
             ffn_activation(model, "shared_experts", M, _c(shared_w / t)),
             gemm("shared_experts_down", M, d, shared_w / t, sdt)]
    if moe.shared_expert_gate:
        calls.append(Call("shared_expert_gate", SHARED_EXPERT_GATE, {"T": M, "D": d},
                          proxy_bytes=(3 * M * d + d) * BF16))
    return calls


def router_topk(model: ModelConfig, M: int) -> Call:
    """Top-k over the router's logits: sigmoid scores with the bias correction (`router_topk`: DeepSeek-V3, Kimi,
    Nemotron 3) or a softmax with the top-k renormalised (`router_softmax_topk`: Qwen, Jamba, Granite, MiniMax),
    as `moe.router_score` says."""
    moe = model.moe
    p = {"T": M, "E": moe.num_routed_experts, "topk": moe.num_active_experts}
    if moe.router_score == "softmax":
        return Call("moe_router_topk", ROUTER_SOFTMAX_TOPK, p, proxy_bytes=M * moe.num_routed_experts * BF16)
    return Call("moe_router_topk", ROUTER_TOPK, p, proxy_bytes=M * moe.num_routed_experts * 4)


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
    """All calls of layer `layer` (0-based) for `batch` on one GPU of `layout`: its mixer sublayer (its mixer kinds
    through `step.mixers`; none for an FFN-only layer), its FFN (dense, MoE or none) and Block AttnRes's reads."""
    spec = model.layers[layer]
    calls = list(mixer_calls(model, spec.mixers, layout, batch))
    if spec.ffn == "dense":
        calls += dense_ffn_calls(model, layout, batch)
    elif spec.ffn == "moe":
        calls += moe_calls(model, layout, batch, expert_kernel)
    calls += attn_res_calls(model, batch, layer)
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
    """Layers with equal signatures launch identical calls (memoisation key): the mixer kinds, the FFN kind and
    the AttnRes blocks read."""
    spec = model.layers[layer]
    blocks = layer // model.attn_res_block_size + 1 if model.attn_res_block_size else 0
    return (spec.mixers, spec.ffn, blocks)
