"""Op registry: each measured kernel's parameters, allowed ranges, FLOP and minimal-byte counts.

The counts are the roofline's speed-of-light inputs (`t >= flop/peak`, `t >= bytes/bandwidth`); the
fitted efficiencies absorb everything the formulas leave out. Shapes follow the harness in
`k3sim/calibration/` (batch 1 for KDA and SDPA, K = V = 128 for KDA, bf16 activations).
"""

from __future__ import annotations

import math
from typing import Mapping

from k3sim.configs.bounds import BOUNDS
from k3sim.errors import InputError, shorten
from k3sim.kernels.ops_decode import DECODE_OPS
from k3sim.kernels.opspec import (BF16, FP32, OpSpec, ParamRange, Params, _topk_le_e,  # noqa: F401 - re-exported
                                  expected_distinct_experts, moe_flop)

KDA_HEAD_DIM = 128  # the measured head dim (K = V = 128: K3 and Kimi-Linear); other K, V scale from it
KDA_CHUNK = 64  # fla chunk_kda chunk size
# ---- formulas -------------------------------------------------------------------------------------

def gemm_flop(p: Params) -> float:
    return 2.0 * p["M"] * p["N"] * p["K"]


def gemm_bytes(p: Params, in_bytes: float = BF16, out_bytes: float = BF16) -> float:
    """A [M, K], B [K, N] read once, C [M, N] written once."""
    return in_bytes * (p["M"] * p["K"] + p["K"] * p["N"]) + out_bytes * p["M"] * p["N"]


FP8_BLOCK = 128  # DeepSeek-V3's fine-grained FP8 tiles: 1 x 128 activations, 128 x 128 weights (sec. 3.3.1)


def gemm_fp8_block_bytes(p: Params) -> float:
    """gemm_fp8_block: e4m3 A [M, K] and W [N, K] read once with their fp32 scales (one per 1 x 128 tile of A,
    one per 128 x 128 block of W; a partial tile has one too), bf16 C [M, N] written once."""
    kb = -(-p["K"] // FP8_BLOCK)
    return gemm_bytes(p, in_bytes=1, out_bytes=BF16) + FP32 * (p["M"] * kb + -(-p["N"] // FP8_BLOCK) * kb)


def moe_bytes(p: Params) -> float:
    """Weights of the experts touched (each read once) plus routed activations in and out."""
    distinct = expected_distinct_experts(p["B"], p["E"], p["topk"])
    return BF16 * (distinct * p["K"] * p["N"] + p["B"] * p["topk"] * (p["K"] + p["N"]))


def kda_fwd_flop_terms(C: int = KDA_CHUNK, K: int = KDA_HEAD_DIM, V: int | None = None) -> dict[str, float]:
    """Chunkwise KDA forward (fla chunk_kda), FLOP per chunk of C tokens and per head, split into the
    parallel (intra-chunk) and serial (chunk-to-chunk state) parts. The one chunk-KDA FLOP formula:
    `kda_fwd_flop_per_token_head` and `cp/flops.py` derive from it.

    Parallel: A_kk = K diag K^T and A_qk = Q diag K^T (2C^2K each), W = T beta K Gamma (2C^2K),
    U~ = T beta V (2C^2V), o_intra = A_qk U (2C^2V), the triangular inverse (I + beta A)^-1 (C^3/3).
    Serial: U = U~ - W S, S += K^T U, o_inter = Q Gamma S: three C x K x V products (2CKV each).
    """
    V = K if V is None else V
    parallel = 2.0 * C * C * (3 * K + 2 * V) + C ** 3 / 3.0
    serial = 3 * 2.0 * C * K * V
    return {"parallel": parallel, "serial": serial, "total": parallel + serial}


def kda_fwd_flop_per_token_head(C: int = KDA_CHUNK, D: int = KDA_HEAD_DIM, V: int | None = None) -> float:
    """Chunkwise KDA forward FLOP per token and head (K = D, V = D unless given): with K = V = D,
    5 * 2CD + 3 * 2D^2 + C^2/3."""
    return kda_fwd_flop_terms(C, D, V)["total"] / C


KDA_FWD_BWD_FLOP_FACTOR = 3.0  # backward: two gradient products per forward product


def kda_padded_tokens(T: int, docs: int = 1, C: int = KDA_CHUNK) -> float:
    """Tokens the chunked kernel processes: each packed document is padded to whole chunks."""
    per_doc = T / docs
    return docs * math.ceil(per_doc / C) * C


def _kv(p: Params) -> tuple[int, int]:
    """Head dims of a KDA op's parameters (K, V; 128 when absent: the measured K3 layer)."""
    return int(p.get("K", KDA_HEAD_DIM)), int(p.get("V", KDA_HEAD_DIM))


def kda_fwd_bytes(T: float, H: float, D: int = KDA_HEAD_DIM, V: int | None = None) -> float:
    """q, k, g (bf16, K = D each), v (V), beta (bf16) read and o (bf16, V) written per token-head, plus
    the final state (fp32 K x V per head) written once."""
    V = D if V is None else V
    return T * H * ((3 * D + 2 * V) * BF16 + BF16) + H * D * V * FP32


def kda_fwd_bwd_bytes(T: float, H: float, D: int = KDA_HEAD_DIM, V: int | None = None) -> float:
    """Forward, then the backward reads q, k, v, g, beta, do and writes dq, dk, dv, dg, dbeta."""
    V = D if V is None else V
    bwd = T * H * ((3 * D + 2 * V) * BF16 + BF16 + (3 * D + V) * BF16 + BF16)
    return kda_fwd_bytes(T, H, D, V) + bwd


def chunk_kda_flop(p: Params) -> float:
    K, V = _kv(p)
    return kda_padded_tokens(p["T"]) * p["H"] * kda_fwd_flop_per_token_head(D=K, V=V)


def recurrent_flop(p: Params) -> float:
    """Per token and head: decay KV, S^T k 2KV, rank-1 update 2KV, S^T q 2KV -> 7 KV."""
    K, V = _kv(p)
    return 7.0 * K * V * p["B"] * p["T"] * p["H"]


def recurrent_bytes(p: Params) -> float:
    """Dominated by the fp32 state read and written once per step: B H K V 4 bytes x 2; plus
    q, k, g (K), v, o (V) in bf16 and beta per token."""
    K, V = _kv(p)
    state = p["B"] * p["H"] * K * V * FP32 * 2
    return state + p["B"] * p["T"] * p["H"] * ((3 * K + 2 * V) * BF16 + BF16)


# ---- Gated DeltaNet and Mamba2's SSD (issue 23; harness k3sim/calibration/hybrid_ops.py) ----------------------

def _gdn_token_bytes(p: Params) -> float:
    """Per token of a GDN call: q, k (Hk key heads of K) and v, o (H value heads of V) in bf16, the decay g (fp32:
    Qwen3-Next computes it in fp32) and beta (bf16) per value head. With grouped value heads (H > Hk) the key
    heads are shared, so q and k are counted once per key head."""
    K, V = _kv(p)
    return 2 * p["Hk"] * K * BF16 + p["H"] * (2 * V * BF16 + FP32 + BF16)


def chunk_gdn_flop(p: Params) -> float:
    """fla chunk_gated_delta_rule forward: the chunkwise WY form of the gated delta rule (Yang et al. 2024, Gated
    Delta Networks, arXiv 2412.06464, sec. 3.3), KDA's chunk products with a scalar gate (`kda_fwd_flop_terms`),
    once per value head: beta and g are per value head, so every chunk product is (fla's kernels run on the H
    value heads and read key head h // (H / Hk))."""
    K, V = _kv(p)
    return kda_padded_tokens(p["T"]) * p["H"] * kda_fwd_flop_per_token_head(D=K, V=V)


def chunk_gdn_bytes(p: Params) -> float:
    """The forward's inputs read and o written once (`_gdn_token_bytes`), the final state (fp32 K x V per value
    head) written: a prefill keeps it."""
    K, V = _kv(p)
    return p["T"] * _gdn_token_bytes(p) + p["H"] * K * V * FP32


def chunk_gdn_fwd_bwd_bytes(p: Params) -> float:
    """Forward without a final state (training), then the backward reads q, k, v, g, beta and do and writes dq, dk,
    dv, dg and dbeta (the same sizes per token less one V-wide tensor)."""
    K, V = _kv(p)
    return p["T"] * (2 * _gdn_token_bytes(p) + _gdn_token_bytes(p) - p["H"] * V * BF16)


def recurrent_gdn_flop(p: Params) -> float:
    """One decode token per request and value head: decay K V, S^T k 2KV, rank-1 update 2KV, S^T q 2KV -> 7 KV
    (as `recurrent_flop`)."""
    K, V = _kv(p)
    return 7.0 * K * V * p["B"] * p["H"]


def recurrent_gdn_bytes(p: Params) -> float:
    """The fp32 state read and written once per step (in place: B H K V 4 bytes x 2) plus one token's inputs and
    output (`_gdn_token_bytes`) per request."""
    K, V = _kv(p)
    return p["B"] * (p["H"] * K * V * FP32 * 2 + _gdn_token_bytes(p))


def _heads_divide(value: str, key: str):
    """`check` of a grouped-heads op: the `value` heads are a whole multiple of the `key` heads."""
    def check(p: Params) -> tuple[str, str] | None:
        if p[value] % p[key]:
            return key, f"{value}={p[value]} is not a multiple of {key}={p[key]} (each {key} head serves H/{key} " \
                        f"{value} heads): give {key} dividing {value}"
        return None
    return check


MAMBA2_D_STATE, MAMBA2_HEAD_DIM = 128, 64  # the measured Mamba2 shape: fla's K = d_state N, V = head_dim P


def _mamba_kv(p: Params) -> tuple[int, int]:
    return int(p.get("K", MAMBA2_D_STATE)), int(p.get("V", MAMBA2_HEAD_DIM))


def ssd_flop_per_token_head(C: int = KDA_CHUNK, K: int = MAMBA2_D_STATE, V: int = MAMBA2_HEAD_DIM) -> float:
    """Mamba2's chunked scan as fla chunk_simple_gla, per token and head, K = d_state, V = head_dim: per chunk of C
    tokens A = Q K^T under the decay mask (2C^2 K), o_intra = A V (2C^2 V), o_inter = Q S (2CKV), S <- decay S +
    K^T V (2CKV); per token 2C (K + V) + 4KV. The block decomposition of SSD (Dao & Gu 2024, arXiv 2405.21060,
    sec. 6: diagonal blocks, chunk states, state passing, outputs from the states)."""
    return 2.0 * C * (K + V) + 4.0 * K * V


def mamba2_chunk_flop(p: Params) -> float:
    K, V = _mamba_kv(p)
    return kda_padded_tokens(p["T"]) * p["H"] * ssd_flop_per_token_head(K=K, V=V)


def mamba2_chunk_bytes(p: Params, fwd_bwd: bool = False) -> float:
    """As fla reads it: q = C and k = B per head (the groups' B and C expanded, K each), v = dt x and o (V each) in
    bf16, g = dt A (fp32) per token and head; the forward writes the final state (fp32 K x V per head); the
    backward reads q, k, v, g, do and writes dq, dk, dv, dg."""
    K, V = _mamba_kv(p)
    tok = (2 * K + 2 * V) * BF16 + FP32
    if not fwd_bwd:
        return p["T"] * p["H"] * tok + p["H"] * K * V * FP32
    return p["T"] * p["H"] * (2 * tok + tok - V * BF16)


SDPA_FWD_BWD_FLOP_FACTOR = 3.5  # FlashAttention-2 convention: backward = 2.5 x forward


def sdpa_flop(p: Params) -> float:
    """Causal: 4 T^2 H D / 2 (QK^T and PV, half the score matrix)."""
    return 4.0 * p["T"] ** 2 * p["H"] * p["D"] / 2.0


def sdpa_bytes(p: Params, fwd_bwd: bool = False) -> float:
    """q, k, v read and o written (bf16); the backward reads q, k, v, o, do and writes dq, dk, dv."""
    n = 12 if fwd_bwd else 4
    return n * p["T"] * p["H"] * p["D"] * BF16


def window_pairs(T: float, W: float) -> float:
    """(query, key) pairs of causal attention in which a query sees at most W keys (itself and W - 1 before it):
    sum over t of min(t + 1, W) = W (W + 1) / 2 + (T - W) W; W = T is full causal attention, T (T + 1) / 2."""
    W = min(W, T)
    return W * (W + 1) / 2.0 + (T - W) * W


def gqa_prefill_flop(p: Params) -> float:
    """QK^T and PV over the visible pairs: 4 D per (query head, pair)."""
    return 4.0 * p["D"] * p["Hq"] * window_pairs(p["T"], p["window"])


def gqa_prefill_bytes(p: Params) -> float:
    """q and o (Hq heads), k and v (Hkv heads) of T tokens, bf16, each once."""
    return BF16 * p["T"] * p["D"] * 2 * (p["Hq"] + p["Hkv"])


def _gqa_prefill_check(p: Params) -> tuple[str, str] | None:
    if p["window"] > p["T"]:
        return "window", (f"window={p['window']} exceeds T={p['T']}: a window of T or more is full causal attention, "
                          "give window = min(window, T)")
    return _heads_divide("Hq", "Hkv")(p)


# nccl-tests bus-bandwidth factors, applied to the per-rank shard `bytes`: bytes each rank puts on the
# wire (nccl-tests doc/PERFORMANCE.md; all_gather/reduce_scatter size there is the full buffer n*shard).
def wire_bytes(op: str, nbytes: float, n: int) -> float:
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * nbytes
    if op in ("all_reduce", "custom_all_reduce"):
        return 2.0 * (n - 1) / n * nbytes
    if op == "all_to_all":
        return (n - 1) / n * nbytes
    if op == "send_recv":
        return float(nbytes)
    raise KeyError(op)


# ---- registry -------------------------------------------------------------------------------------

# Allowed ranges are sanity bounds on input (a typo, a unit slip), not claims about accuracy: past the
# measured range the answer is the fitted model and says so. Each is a kind of the bounds table
# (`ParamRange`), which says why its upper end sits where it does (kernel_dim: 16 M per GEMM dimension).
_DIM = ParamRange("kernel_dim")
_GEMM_RANGES = {"M": _DIM, "N": _DIM, "K": _DIM}


# fla's KDA kernels take head dims up to 256 (`chunk_delta_h.py`: "K <= 256")
_HEAD_DIMS = {"K": ParamRange("head_dim"), "V": ParamRange("head_dim")}
_KV_DEFAULT = {"K": KDA_HEAD_DIM, "V": KDA_HEAD_DIM}
_HEADS = ParamRange("heads")
_SDPA_RANGES = {"T": _DIM, "H": _HEADS, "D": ParamRange("head_dim")}


def _collective(name: str) -> OpSpec:
    return OpSpec(name, "collective", ("bytes", "gpus"),
                  {"bytes": ParamRange("kernel_bytes"), "gpus": ParamRange("collective_gpus"),
                   "gpus_per_node": ParamRange("collective_gpus", lo=0)},
                  flop=lambda p: 0.0, bytes=lambda p, _n=name: wire_bytes(_n, p["bytes"], p["gpus"]),
                  kind="collective", categorical=("gpus",), optional={"gpus_per_node": 0})


BASE_OPS: dict[str, OpSpec] = {s.name: s for s in [
    OpSpec("gemm_bf16", "gemm", ("M", "N", "K"), _GEMM_RANGES, gemm_flop, gemm_bytes, shape_params=("N", "K")),
    OpSpec("gemm_fp8", "gemm", ("M", "N", "K"), _GEMM_RANGES, gemm_flop,
           lambda p: gemm_bytes(p, in_bytes=1, out_bytes=BF16), dtype="fp8", shape_params=("N", "K")),
    # the training linears' FP8 GEMM with DeepSeek-V3's block scales (forward, input and weight gradient at their
    # shapes; harness k3sim/calibration/train_fp8.py, torch._scaled_mm blockwise through cuBLAS)
    OpSpec("gemm_fp8_block", "gemm", ("M", "N", "K"), _GEMM_RANGES, gemm_flop, gemm_fp8_block_bytes, dtype="fp8",
           shape_params=("N", "K")),
    OpSpec("hbm_copy", "hbm", ("bytes",), {"bytes": ParamRange("kernel_bytes")}, lambda p: 0.0,
           lambda p: 2.0 * p["bytes"]),
    OpSpec("hbm_read", "hbm", ("bytes",), {"bytes": ParamRange("kernel_bytes")}, lambda p: 0.0,
           lambda p: float(p["bytes"])),
    OpSpec("moe_grouped_bf16", "moe", ("B", "E", "K", "N", "topk"),
           {"B": _DIM, "E": ParamRange("experts"), "K": ParamRange("width"), "N": ParamRange("width"),
            "topk": ParamRange("topk")},
           moe_flop, moe_bytes, check=_topk_le_e, shape_params=("E", "K", "N", "topk")),
    OpSpec("chunk_kda_fwd", "kda", ("T", "H"), {"T": ParamRange("kda_call_tokens"), "H": _HEADS, **_HEAD_DIMS},
           chunk_kda_flop, lambda p: kda_fwd_bytes(p["T"], p["H"], *_kv(p)), shape_params=("H",),
           eff_params={"H": 96}, optional=_KV_DEFAULT),
    OpSpec("chunk_kda_fwd_bwd", "kda", ("T", "H"), {"T": ParamRange("kda_call_tokens"), "H": _HEADS,
                                                    **_HEAD_DIMS},
           lambda p: KDA_FWD_BWD_FLOP_FACTOR * chunk_kda_flop(p),
           lambda p: kda_fwd_bwd_bytes(p["T"], p["H"], *_kv(p)),
           shape_params=("H",), eff_params={"H": 96}, optional=_KV_DEFAULT),
    OpSpec("recurrent_kda_decode", "kda", ("B", "T", "H"),
           {"B": ParamRange("batch"), "T": ParamRange("decode_tokens"), "H": _HEADS, **_HEAD_DIMS},
           recurrent_flop, recurrent_bytes, shape_params=("H",),
           serial_steps=lambda p: float(p["T"]),  # fla's fused_recurrent_kda loops over the T tokens in-kernel
           optional=_KV_DEFAULT),
    # Gated DeltaNet with grouped value heads (H value heads over Hk key heads; issue 23, hybrid_ops.py): fla's chunk
    # kernels and its fused recurrent kernel updating the state in place
    OpSpec("chunk_gdn_fwd", "kda", ("T", "H", "Hk"), {"T": ParamRange("kda_call_tokens"), "H": _HEADS, "Hk": _HEADS,
                                                     **_HEAD_DIMS},
           chunk_gdn_flop, chunk_gdn_bytes, shape_params=("H", "Hk"), eff_params={"H": 32}, optional=_KV_DEFAULT,
           check=_heads_divide("H", "Hk")),
    OpSpec("chunk_gdn_fwd_bwd", "kda", ("T", "H", "Hk"), {"T": ParamRange("kda_call_tokens"), "H": _HEADS,
                                                         "Hk": _HEADS, **_HEAD_DIMS},
           lambda p: KDA_FWD_BWD_FLOP_FACTOR * chunk_gdn_flop(p), chunk_gdn_fwd_bwd_bytes, shape_params=("H", "Hk"),
           eff_params={"H": 32}, optional=_KV_DEFAULT, check=_heads_divide("H", "Hk")),
    OpSpec("recurrent_gdn_decode", "kda", ("B", "H", "Hk"),
           {"B": ParamRange("batch"), "H": _HEADS, "Hk": _HEADS, **_HEAD_DIMS},
           recurrent_gdn_flop, recurrent_gdn_bytes, shape_params=("H", "Hk"), optional=_KV_DEFAULT,
           check=_heads_divide("H", "Hk")),
    # Mamba2's chunked scan (SSD) as fla chunk_simple_gla: K = d_state (128 measured), V = head_dim (64 measured)
    OpSpec("mamba2_chunk_fwd", "kda", ("T", "H"), {"T": ParamRange("kda_call_tokens"), "H": _HEADS, **_HEAD_DIMS},
           mamba2_chunk_flop, mamba2_chunk_bytes, shape_params=("H",), eff_params={"H": 64},
           optional={"K": MAMBA2_D_STATE, "V": MAMBA2_HEAD_DIM}),
    OpSpec("mamba2_chunk_fwd_bwd", "kda", ("T", "H"), {"T": ParamRange("kda_call_tokens"), "H": _HEADS,
                                                      **_HEAD_DIMS},
           lambda p: KDA_FWD_BWD_FLOP_FACTOR * mamba2_chunk_flop(p), lambda p: mamba2_chunk_bytes(p, True),
           shape_params=("H",), eff_params={"H": 64}, optional={"K": MAMBA2_D_STATE, "V": MAMBA2_HEAD_DIM}),
    OpSpec("sdpa_causal_fwd", "attention", ("T", "H", "D"), _SDPA_RANGES,
           sdpa_flop, sdpa_bytes, eff_params={"D": 128}, shape_params=("H", "D")),
    OpSpec("sdpa_causal_fwd_bwd", "attention", ("T", "H", "D"),
           _SDPA_RANGES,
           lambda p: SDPA_FWD_BWD_FLOP_FACTOR * sdpa_flop(p), lambda p: sdpa_bytes(p, True), eff_params={"D": 128},
           shape_params=("H", "D")),
    # GQA / sliding-window prefill through torch's FlashAttention-2 (issue 23, hybrid_ops.py): window = keys a query
    # sees at most, T for full causal attention (the store takes positive parameters only, so no 0 = full)
    OpSpec("gqa_prefill_fwd", "attention", ("T", "Hq", "Hkv", "D", "window"),
           {"T": _DIM, "Hq": _HEADS, "Hkv": _HEADS, "D": ParamRange("head_dim"), "window": _DIM},
           gqa_prefill_flop, gqa_prefill_bytes, eff_params={"D": 128}, shape_params=("Hq", "Hkv", "D"),
           check=_gqa_prefill_check),
    *[_collective(n) for n in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")],
    # vLLM's custom all-reduce (IPC buffers over NVLink, one-shot below ~512 KB, two-shot above; the TP
    # all-reduce of a CUDA-graph decode step up to its 8 MiB buffer): measured rows come from
    # NVIDIA AIConfigurator's H200 tables (scripts/import_aiconfigurator_comm.py)
    _collective("custom_all_reduce"),
]}

FAMILIES = ("gemm", "hbm", "moe", "kda", "attention", "collective")

# Measured calls that are not kernel-time ops: one answer per quantity. fla's KCP measured on two GPUs
# (`chunk_kda_cp_fwd[_bwd].csv`) is the validation data of the KCP parts model (`k3sim.cp.kcp_parts`,
# read by `k3sim.cp.validate.load_op`); a roofline fit of the whole call (9+ free parameters on 6 points)
# answered differently from `k3sim cp`, which prices KCP from its parts. The store lists these files as
# ignored; `k3sim kernel-time` refuses them with the `k3sim cp` command that answers.
PRICED_BY_CP = {"chunk_kda_cp_fwd": "forward", "chunk_kda_cp_fwd_bwd": "forward+backward"}


def get_op(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        if name in PRICED_BY_CP:
            raise InputError(f"{name} is not a kernel op: KCP is priced from its parts by `k3sim cp --strategy "
                             "kcp` (k3sim.cp.kcp_parts.kcp_time)", field="op") from None
        raise InputError(f"unknown op '{name}' (known: {', '.join(OPS)})", field="op") from None


def _as_int(name: str, value: object) -> int:
    """An integer parameter from a number or its text ("64", "1e6", 64.0); anything else is refused."""
    bad = f"parameter {name}={shorten(repr(value), 40)} is not an integer; write a whole number such as 64 or 1e6"
    if isinstance(value, bool):
        raise InputError(bad, field=name)
    if isinstance(value, int):
        return value
    try:
        f = float(value)  # accepts "64", "1e6", 64.0
    except (TypeError, ValueError, OverflowError):
        raise InputError(bad, field=name) from None
    if not math.isfinite(f) or f != int(f):
        raise InputError(bad, field=name)
    return int(f)


def _range_text(r: tuple[int, int]) -> str:
    """`[lo, hi] unit (why)` of a parameter's range, from its bounds-table kind (`ParamRange`)."""
    kind = getattr(r, "kind", None)
    if kind is None:
        return f"[{r[0]:,}, {r[1]:,}]"
    return f"[{r[0]:,}, {r[1]:,}] {BOUNDS[kind].unit} ({BOUNDS[kind].why})"


def validate_params(spec: OpSpec, params: Mapping[str, object]) -> dict[str, int]:
    """Exact parameter set (optional ones filled with their defaults), integers, inside the op's
    allowed ranges (the bounds table's kinds); returns them as ints. Every refusal names the parameter
    (`field`) so a caller can say how the user wrote it. A failed cross-check names the parameter it is about."""
    known = ", ".join(spec.params) + (f"; optional {', '.join(spec.optional)}" if spec.optional else "")
    unknown = sorted(set(params) - set(spec.params) - set(spec.optional))
    if unknown:
        raise InputError(f"unknown parameter(s) {', '.join(unknown)} for {spec.name} (known: {known})",
                         field=unknown[0])
    missing = [p for p in spec.params if p not in params]
    if missing:
        raise InputError(f"missing parameter(s) {', '.join(missing)} for {spec.name} "
                         f"(expects {', '.join(spec.params)})", field=missing[0])
    out = {}
    for name in (*spec.params, *spec.optional):
        v = _as_int(name, params[name]) if name in params else spec.optional[name]
        lo, hi = spec.ranges[name]
        if not lo <= v <= hi:
            shown = f"{v}" if abs(v) < 10 ** 18 else f"{v:.3e}" if abs(v) < 10 ** 300 else "(300+ digits)"
            raise InputError(f"{spec.name}: {name}={shown} outside the allowed range "
                             f"{_range_text(spec.ranges[name])}", field=name)
        out[name] = v
    bad = spec.check(out)
    if bad:
        name, reason = bad
        raise InputError(f"{spec.name}: {reason}", field=name)
    return out

# ---- expert-parallel dispatch / combine (issue 21): DeepEP-class all-to-all kernels, kind "ep" --------------
# Answered by k3sim.comm.ep.ep_time through the facade (k3sim/predict.py), not by the kernel predictor and not a
# plain collective (COLLECTIVE_OPS below keeps the nccl-tests collectives only). Integer parameters, all required:
# T tokens per EP rank entering dispatch, D width sent per token copy, topk, E routed (logical) experts,
# R redundant expert slots in all, ep EP ranks, G GPUs per node, nodes_max node-limited routing (0 = unlimited),
# kernel (k3sim.comm.ep.KERNEL_CODES: 0 normal, 1 low_latency, 2 nccl), dtype_bytes (1 fp8, 2 bf16; combine is
# always bf16), zipf_milli (Zipf exponent x 1000, 0 = uniform routing), seed (of the Zipf ranking).
EP_PARAMS = ("T", "D", "topk", "E", "R", "ep", "G", "nodes_max", "kernel", "dtype_bytes", "zipf_milli", "seed")
# one fp32 scale per 128 channels of an fp8 token (DeepEP per_token_cast_to_fp8; DeepSeek-V3's 1x128 tiles)
EP_SCALE_CHANNELS = 128


def ep_copy_bytes(phase: str, D: int, dtype_bytes: int) -> int:
    """Bytes of one token copy on the wire: fp8 dispatch D + 4 ceil(D/128) (e4m3 values and their fp32 scales,
    DeepEP's fp8 format: tests/legacy/test_internode.py counts hidden x (1 + 4/128)), bf16 2 D; combine always
    sends bf16 (DeepEP V1: "FP8 dispatching and BF16 combining")."""
    if phase == "dispatch" and dtype_bytes == 1:
        return D + FP32 * math.ceil(D / EP_SCALE_CHANNELS)
    return BF16 * D


def _ep_op(name: str, phase: str) -> OpSpec:
    r = {"T": ParamRange("kernel_dim"), "D": ParamRange("width"), "topk": ParamRange("topk"),
         "E": ParamRange("experts"), "R": ParamRange("experts", lo=0), "ep": ParamRange("parallel"),
         "G": ParamRange("parallel"), "nodes_max": ParamRange("parallel", lo=0), "kernel": ParamRange("ep_kernel_code"),
         "dtype_bytes": ParamRange("dispatch_dtype_bytes"), "zipf_milli": ParamRange("zipf_milli"),
         "seed": ParamRange("seed")}
    # bytes: the (token, expert) copies one rank sends before any deduplication (what a plain all-to-all moves)
    return OpSpec(name, "ep", EP_PARAMS, r, flop=lambda p: 0.0,
                  bytes=lambda p, _ph=phase: float(p["T"] * p["topk"] * ep_copy_bytes(_ph, p["D"], p["dtype_bytes"])),
                  kind="ep", categorical=EP_PARAMS, check=_topk_le_e)


EP_SPECS: dict[str, OpSpec] = {s.name: s for s in (_ep_op("ep_dispatch", "dispatch"), _ep_op("ep_combine", "combine"))}
EP_OPS = {"ep_dispatch": "dispatch", "ep_combine": "combine"}  # op -> phase


# ---- the registry ----------------------------------------------------------------------------------------------
# The tables that define ops, in registry order (the order `OPS` lists them, which the store and `k3sim
# kernel-time`'s list follow): this module's, then the decode-step kernels of `ops_decode.py` (issue 10).
REGISTRY_TABLES = (("k3sim.kernels.ops.BASE_OPS", BASE_OPS), ("k3sim.kernels.ops.EP_SPECS", EP_SPECS),
                   ("k3sim.kernels.ops_decode.DECODE_OPS", DECODE_OPS))


def build_registry(tables=REGISTRY_TABLES) -> dict[str, OpSpec]:
    """The op registry, assembled explicitly from `tables` ((where, {name: OpSpec}) in order): no module adds ops
    to another's by being imported. An op keyed under another name than its own, or one name in two tables, is
    a programming error (ValueError naming both places), not a silent override."""
    out: dict[str, OpSpec] = {}
    where: dict[str, str] = {}
    for place, table in tables:
        for name, spec in table.items():
            if spec.name != name:
                raise ValueError(f"{place}: op {spec.name!r} is keyed as {name!r}")
            if name in out:
                raise ValueError(f"op {name!r} is defined twice: {where[name]} and {place}")
            out[name], where[name] = spec, place
    return out


OPS: dict[str, OpSpec] = build_registry()

# The one list of collective ops: the registry's kind (every other module derives its list from this)
COLLECTIVE_OPS: tuple[str, ...] = tuple(name for name, spec in OPS.items() if spec.kind == "collective")
