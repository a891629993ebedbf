"""OpSpecs of the decode-step kernels measured under CUDA-graph replay (issue 10; harness
`k3sim/calibration/graph_parts.py`): the routed experts as one op per implementation, absorbed-MLA
decode attention, the small kernels of `k3sim/calibration/decode_ops.py`, and the kernels around an
expert-parallel dispatch of `k3sim/calibration/dispatch_ops.py` (`fp8_quant_128`, `ep_permute`,
`ep_unpermute`) with one grouped fp8 GEMM alone (`moe_grouped_fp8`; harness `k3sim/calibration/deployed.py`).

The table `DECODE_OPS` is built over the ops' vocabulary (`k3sim.kernels.opspec`) and registers nothing:
`k3sim.kernels.ops.build_registry` puts it into `OPS` after the ops of ops.py.

Routed-expert ops cover one MoE layer's routed experts on one rank, gate/up + SwiGLU + down +
weighted combine together (routing metadata untimed): B tokens, E local experts, each token routed
uniformly to `topk` of them, K = the experts' input width (K3: the 3584 latent), N = the expert width.
- moe_mxfp4_decode: the token-centric MXFP4 Triton kernel (`k3sim/calibration/mxfp4.py`);
- moe_ffn_grouped_bf16 / moe_ffn_grouped_fp8: tile-centric `torch._grouped_mm` /
  `torch._scaled_grouped_mm` (rowwise fp8 scales) over tokens sorted by expert.
(`moe_grouped_bf16` in ops.py is a single grouped GEMM, the older measurement.)
"""

from __future__ import annotations

from k3sim.kernels.opspec import BF16, FP32, OpSpec, ParamRange, Params, _topk_le_e, expected_distinct_experts, moe_flop

MXFP4_BYTES = 4.25 / 8  # e2m1 (4 bits) + one e8m0 scale per 32 elements (OCP MX v1.0)
FP8 = 1
MLA_LATENT, MLA_ROPE = 512, 64  # kv_lora_rank, qk_rope_head_dim of K3 / Kimi-Linear


def expert_ffn_flop(p: Params) -> float:
    """gate, up (K -> N each) and down (N -> K) for every routed (token, expert) pair."""
    return 2.0 * p["B"] * p["topk"] * 3 * p["K"] * p["N"]


def expert_ffn_bytes(p: Params, weight_bytes: float) -> float:
    """Weights of the experts touched (expected distinct under uniform routing, each read once) plus the
    activations: x read and the combined output written (B K each), the intermediate h written and read
    (2 B topk N) and the per-pair outputs written and read before the combine (2 B topk K), bf16."""
    distinct = expected_distinct_experts(p["B"], p["E"], p["topk"])
    acts = 2 * p["B"] * p["K"] + 2 * p["B"] * p["topk"] * (p["N"] + p["K"])
    return distinct * 3 * p["K"] * p["N"] * weight_bytes + BF16 * acts


def grouped_fp8_bytes(p: Params) -> float:
    """One grouped fp8 GEMM (moe_grouped_fp8): e4m3 weights of the experts touched (read once) and their fp32
    column scales, e4m3 rows in with one fp32 scale each, bf16 rows out."""
    distinct = expected_distinct_experts(p["B"], p["E"], p["topk"])
    rows = p["B"] * p["topk"]
    return distinct * p["N"] * (p["K"] * FP8 + 4) + rows * (p["K"] * FP8 + 4 + p["N"] * BF16)


def mla_decode_flop(p: Params) -> float:
    """Scores over latent + rope (576 per head and position) and the weighted sum over the latent (512)."""
    return 2.0 * p["B"] * p["H"] * p["C"] * (MLA_LATENT + MLA_ROPE + MLA_LATENT)


def mla_decode_bytes(p: Params) -> float:
    """The latent cache read once (576 bf16 per position; all heads share it), q read, output written."""
    return BF16 * (p["B"] * p["C"] * (MLA_LATENT + MLA_ROPE) + p["B"] * p["H"] * (2 * MLA_LATENT + MLA_ROPE))


# Small kernels: bytes each must move (bf16 activations); FLOP are rough per-element operation counts
# (modelling choice: these kernels are bound by memory or launch latency, FLOP never set their time).
def _rmsnorm(p):
    return 4.0 * p["T"] * p["D"], BF16 * (2 * p["T"] * p["D"] + p["D"])


def _silu_mul(p):
    return 5.0 * p["T"] * p["N"], BF16 * 3 * p["T"] * p["N"]


def _rope(p):
    # x read and written, cos/sin (fp32, D/2 each) gathered per token
    return 3.0 * p["T"] * p["H"] * p["D"], BF16 * 2 * p["T"] * p["H"] * p["D"] + 4 * p["T"] * p["D"]


def _router(p):
    # fp32 logits read, sigmoid + bias, top-k; ids (int64) and weights (fp32) written
    return 4.0 * p["T"] * p["E"], 4 * p["T"] * p["E"] + 4 * p["E"] + 12 * p["T"] * p["topk"]


def _residual(p):
    return 1.0 * p["T"] * p["D"], BF16 * 3 * p["T"] * p["D"]


def _embedding(p):
    return 0.0, BF16 * 2 * p["T"] * p["D"] + 8 * p["T"]


# Around an expert-parallel dispatch (k3sim/calibration/dispatch_ops.py: DeepSeek-V3's 1x128 FP8 activation
# tiles, arXiv 2412.19437 sec. 3.3.2; the permute into expert-contiguous rows and its inverse)
FP8_GROUP = 128  # channels per fp32 scale


def _fp8_quant(p):
    # bf16 read, e4m3 written, one fp32 scale per 128 channels (a last partial group has one too); abs, max and
    # divide per element
    return 3.0 * p["T"] * p["D"], (BF16 + FP8) * p["T"] * p["D"] + 4 * p["T"] * -(-p["D"] // FP8_GROUP)


def _ep_rows(p, flop_per_pick_element: float = 0.0):
    # T token rows on one side, T topk pick rows on the other (bf16), the int32 pick ids / fp32 weights
    # and int64 order of each pick; the unpermute's multiply-add per pick element is its FLOP
    picks = p["T"] * p["topk"]
    return flop_per_pick_element * picks * p["D"], BF16 * (p["T"] + picks) * p["D"] + 12 * picks


def _fp8_quant_t(p):
    # fp8_quant_128_t: bf16 [T, D] read, e4m3 [D, T] written, one fp32 scale per (128 tokens, channel)
    return 3.0 * p["T"] * p["D"], (BF16 + FP8) * p["T"] * p["D"] + 4 * p["D"] * -(-p["T"] // FP8_GROUP)


def _unpermute_bwd_rows(p):
    # dy [T, D] read, each pick's forward row read and its gradient written (bf16), the weight, inverse index
    # and weight gradient of each pick; FLOP: w dy (1) and the dot <row, dy> (2) per pick element
    picks = p["T"] * p["topk"]
    return 3.0 * picks * p["D"], BF16 * (p["T"] + 2 * picks) * p["D"] + 12 * picks


# Hybrid models' decode-step kernels (issue 23; harness k3sim/calibration/hybrid_ops.py)
def _mamba2_decode(p):
    # our Triton kernel of Mamba2's selective state update, per request and head: the fp32 state [P, N] read and
    # written in place, x, z read and y written (bf16, P each), dt (bf16); B and C (bf16, N each) at least once per
    # request (one group); FLOP: decay, the dt x B^T update (2) and the contraction with C (2) per state element
    return (5.0 * p["B"] * p["H"] * p["P"] * p["N"],
            p["B"] * (p["H"] * (2 * FP32 * p["P"] * p["N"] + 3 * BF16 * p["P"] + BF16) + 2 * BF16 * p["N"]))


def gqa_decode_flop(p: Params) -> float:
    """One query token per request over C cached positions: QK^T and PV, 4 D per (query head, position)."""
    return 4.0 * p["B"] * p["Hq"] * p["C"] * p["D"]


def gqa_decode_bytes(p: Params) -> float:
    """The bf16 K and V cache (Hkv heads, C positions) read once per request; q read and o written (Hq heads)."""
    return BF16 * p["B"] * (2 * p["C"] * p["Hkv"] * p["D"] + 2 * p["Hq"] * p["D"])


def _gqa_heads(p: Params) -> tuple[str, str] | None:
    if p["Hq"] % p["Hkv"]:
        return "Hkv", f"Hq={p['Hq']} is not a multiple of Hkv={p['Hkv']}: give kv heads dividing the query heads"
    return None


def _router_softmax(p):
    # bf16 logits read; softmax (exp, sum, divide), top-k and renormalising ~5 operations per logit; fp32 weights and
    # int64 ids written (torch.topk's outputs)
    return 5.0 * p["T"] * p["E"], BF16 * p["T"] * p["E"] + 12 * p["T"] * p["topk"]


def _shared_gate(p):
    # sigmoid(x w_gate) * y: x and y read, the gated output written (bf16), w_gate read; the dot product (2) and the
    # multiply per element
    return 3.0 * p["T"] * p["D"], BF16 * (3 * p["T"] * p["D"] + p["D"])


# ranges: kinds of the bounds table (`ParamRange`; k3sim/configs/bounds.py says why each ends where it does)
_T = ParamRange("kernel_dim")
_W = ParamRange("width")
_MOE_RANGES = {"B": _T, "E": ParamRange("experts"), "K": _W, "N": _W, "topk": ParamRange("topk")}
_HEADS = ParamRange("heads")


def _small(name: str, params: tuple[str, ...], ranges: dict, fn, shape: tuple[str, ...], check=None) -> OpSpec:
    return OpSpec(name, "hbm", params, ranges, lambda p, f=fn: f(p)[0], lambda p, f=fn: f(p)[1],
                  shape_params=shape, check=check or (lambda p: None))


DECODE_OPS: dict[str, OpSpec] = {s.name: s for s in [
    OpSpec("moe_mxfp4_decode", "moe", ("B", "E", "K", "N", "topk"), dict(_MOE_RANGES), expert_ffn_flop,
           lambda p: expert_ffn_bytes(p, MXFP4_BYTES), check=_topk_le_e, shape_params=("E", "topk")),
    OpSpec("moe_ffn_grouped_bf16", "moe", ("B", "E", "K", "N", "topk"), dict(_MOE_RANGES), expert_ffn_flop,
           lambda p: expert_ffn_bytes(p, BF16), check=_topk_le_e, shape_params=("E", "topk")),
    OpSpec("moe_ffn_grouped_fp8", "moe", ("B", "E", "K", "N", "topk"), dict(_MOE_RANGES), expert_ffn_flop,
           lambda p: expert_ffn_bytes(p, FP8), dtype="fp8", check=_topk_le_e, shape_params=("E", "topk")),
    # one grouped fp8 GEMM alone, rows pre-quantised and sorted by expert (the fp8 analogue of moe_grouped_bf16;
    # k3sim/calibration/deployed.py): the GEMMs of a DeepGEMM-style expert stack, glue measured as its own ops
    OpSpec("moe_grouped_fp8", "moe", ("B", "E", "K", "N", "topk"), dict(_MOE_RANGES), moe_flop, grouped_fp8_bytes,
           dtype="fp8", check=_topk_le_e, shape_params=("E", "K", "N", "topk")),
    OpSpec("mla_decode", "attention", ("B", "C", "H"), {"B": ParamRange("batch"), "C": _T, "H": _HEADS},
           mla_decode_flop, mla_decode_bytes, shape_params=("H",), eff_params={"H": 12}),
    # FlashMLA (the deployed stacks' absorbed MLA decode), kind "published": k3sim.kernels.published
    OpSpec("mla_decode_flashmla", "attention", ("B", "C", "H"), {"B": ParamRange("batch"), "C": _T, "H": _HEADS},
           mla_decode_flop, mla_decode_bytes, kind="published", shape_params=("H",)),
    _small("rmsnorm", ("T", "D"), {"T": _T, "D": _W}, _rmsnorm, ("D",)),
    _small("silu_mul", ("T", "N"), {"T": _T, "N": _W}, _silu_mul, ("N",)),
    _small("rope", ("T", "H", "D"), {"T": _T, "H": _HEADS, "D": ParamRange("rotary_dim")}, _rope,
           ("H", "D")),
    _small("router_topk", ("T", "E", "topk"), {"T": _T, "E": ParamRange("experts"), "topk": ParamRange("topk")},
           _router, ("E", "topk"), check=_topk_le_e),
    _small("residual_add", ("T", "D"), {"T": _T, "D": _W}, _residual, ("D",)),
    _small("embedding", ("T", "D"), {"T": _T, "D": _W}, _embedding, ("D",)),
    _small("fp8_quant_128", ("T", "D"), {"T": _T, "D": _W}, _fp8_quant, ("D",)),
    _small("ep_permute", ("T", "topk", "D"), {"T": _T, "topk": ParamRange("topk"), "D": _W}, _ep_rows,
           ("topk", "D")),
    _small("ep_unpermute", ("T", "topk", "D"), {"T": _T, "topk": ParamRange("topk"), "D": _W},
           lambda p: _ep_rows(p, 2.0), ("topk", "D")),
    # hybrid models (issue 23, k3sim/calibration/hybrid_ops.py): Mamba2's single-step state update (our Triton kernel),
    # GQA decode attention (torch's FlashAttention-2 through SDPA over each request's cache), the softmax router with
    # renormalised top-k and the sigmoid gate of a shared expert (torch)
    OpSpec("mamba2_decode", "kda", ("B", "H", "P", "N"),
           {"B": ParamRange("batch"), "H": _HEADS, "P": ParamRange("head_dim"), "N": ParamRange("head_dim")},
           lambda p: _mamba2_decode(p)[0], lambda p: _mamba2_decode(p)[1], shape_params=("H", "P", "N")),
    OpSpec("gqa_decode", "attention", ("B", "C", "Hq", "Hkv", "D"),
           {"B": ParamRange("batch"), "C": _T, "Hq": _HEADS, "Hkv": _HEADS, "D": ParamRange("head_dim")},
           gqa_decode_flop, gqa_decode_bytes, shape_params=("Hq", "Hkv", "D"), check=_gqa_heads),
    # the same attention over a paged cache read through a block table (our Triton split-KV kernel, 64-token pages,
    # hybrid_ops.paged_decode_call); the table's 4 bytes per page are left out of the bytes (< 0.01 % of the cache)
    OpSpec("gqa_decode_paged", "attention", ("B", "C", "Hq", "Hkv", "D"),
           {"B": ParamRange("batch"), "C": _T, "Hq": _HEADS, "Hkv": _HEADS, "D": ParamRange("head_dim")},
           gqa_decode_flop, gqa_decode_bytes, shape_params=("Hq", "Hkv", "D"), check=_gqa_heads),
    _small("router_softmax_topk", ("T", "E", "topk"), {"T": _T, "E": ParamRange("experts"), "topk": ParamRange("topk")},
           _router_softmax, ("E", "topk"), check=_topk_le_e),
    _small("shared_expert_gate", ("T", "D"), {"T": _T, "D": _W}, _shared_gate, ("D",)),
    # training's fused routing glue and the weight gradient's FP8 operand (issue 22; harness
    # k3sim/calibration/train_fp8.py, kernels k3sim/calibration/permute_fused.py and dispatch_ops.quant_128_t)
    _small("fp8_quant_128_t", ("T", "D"), {"T": _T, "D": _W}, _fp8_quant_t, ("D",)),
    _small("moe_permute_fused", ("T", "topk", "D"), {"T": _T, "topk": ParamRange("topk"), "D": _W}, _ep_rows,
           ("topk", "D")),
    _small("moe_permute_fused_bwd", ("T", "topk", "D"), {"T": _T, "topk": ParamRange("topk"), "D": _W},
           lambda p: _ep_rows(p, 1.0), ("topk", "D")),
    _small("moe_unpermute_fused", ("T", "topk", "D"), {"T": _T, "topk": ParamRange("topk"), "D": _W},
           lambda p: _ep_rows(p, 2.0), ("topk", "D")),
    _small("moe_unpermute_fused_bwd", ("T", "topk", "D"), {"T": _T, "topk": ParamRange("topk"), "D": _W},
           _unpermute_bwd_rows, ("topk", "D")),
]}
