"""Graph-replay timing and the decode-sized measurements made with it (issue 10, items 1-3).

Why a second timer: a serving engine runs a decode step as one CUDA graph, kernels back to back with
no host launch between them. `timing.time_cuda` brackets one call between CUDA events (with launch
headroom): it sees the kernel alone but still pays the event and launch latency of a lone kernel and
an L2 flushed by a 256 MiB write. `time_graph` captures N calls into one graph after warm-up, replays
it, and divides by N: the per-kernel cost as a graph sees it. Rows carry `timer=graph`; the older
rows have no timer column and are `events` rows.

L2: N back-to-back calls on one set of operands would read them from the 60 MB L2 after the first
call. The calls rotate among enough copies of the operands (`operand_sets`) that one pass over them
touches at least L2_MULTIPLE times the L2 (METHOD.md: "rotate among several input sets"); huge
operands shared by all sets (expert weights, an embedding table) are read at different places by each
set instead (different routings, token ids).

Parts (each with a time budget; rows written as measured):
  gemm_bf16, gemm_fp8   M <= 1024 on grids.GEMM_NK
  moe                   one grouped bf16 GEMM (op moe_grouped_bf16), B <= 256 on grids.MOE_CONFIGS
  kda_decode            fla fused_recurrent_kda as kda_ops.recurrent_decode calls it
  hbm                   device copies 1 MiB - 256 MiB
  decode_ops            the small kernels of decode_ops over T = 1..1024
  moe_ffn               routed experts gate/up + SwiGLU + down: the MXFP4 token-centric Triton kernel
                        (moe_mxfp4_decode) and the tile-centric grouped GEMMs in bf16 and fp8
                        (moe_ffn_grouped_bf16, moe_ffn_grouped_fp8), after a numerical check
  mla                   the split-K absorbed-MLA decode kernel (mla_decode), after a numerical check,
                        and plain torch on a subset (mla_decode_torch.csv, not a fitted op)

Run: python3 -m k3sim.calibration.graph_parts --out DIR --parts moe_ffn,mla --budget-s 300
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

from k3sim.calibration import grids
from k3sim.calibration.records import OpWriter
from k3sim.calibration.timing import Timing, _quantile

L2_MULTIPLE = 3  # harness choice: one pass over the operand sets touches >= 3x the L2
MAX_SETS = 256  # harness choice: bounds set-up time for tiny kernels (their operands then stay in L2)
SET_BYTES_CAP = 6 * 2 ** 30  # harness choice: operand copies of one shape stay under 6 GiB
TARGET_REPLAY_S = 2e-3  # harness choice: one replay long enough that its own launch (~10 us) is < 1 %
MAX_CALLS = 1000  # harness choice: calls captured into one graph at most
MIN_REPLAYS, MAX_REPLAYS = 5, 15
GRAPH_EXTRAS = ["timer", "calls_per_graph", "operand_sets"]

# Sweep orders put a coarse pass first, so a part cut short by its time box still spans its range.
GRAPH_GEMM_M = [1, 4, 16, 64, 256, 1024, 2, 8, 32, 128, 512]
GRAPH_MOE_B = [1, 4, 16, 64, 256, 2, 8, 32, 128]
GRAPH_TOKENS = [1, 4, 16, 64, 256, 1024]  # decode_ops token counts (a coarse pass of decode_ops.TOKENS)
GRAPH_HBM_BYTES = sorted(b for b in grids.HBM_BYTES if b <= 256 * 2 ** 20)
# K3 routed experts (models/kimi-k3.yaml): latent 3584, width 3072, 896 experts, 16 per token.
K3_LATENT, K3_WIDTH, K3_EXPERTS, K3_TOPK = 3584, 3072, 896, 16
FFN_B = [1, 4, 16, 64, 256, 2, 8, 32, 128]
FFN_EP = [8, 1, 16, 2, 4]  # EP8 (the reference layout) first
MLA_H = [12, 32, 96, 8, 16]  # heads per rank: K3 96/TP8 = 12, Kimi-Linear 32, K3 at TP1 96
MLA_B = [1, 4, 16, 64, 256]
MLA_C = [1024, 4096, 16384, 65536, 131072]
MLA_MAX_POSITIONS = 2 ** 21  # harness choice: B x C <= 2M cached positions (2.4 GB of bf16 latent cache)


def l2_bytes() -> int:
    import torch

    if torch.cuda.is_available():
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 * 2 ** 20))
    return 60 * 2 ** 20  # H200 (KINDS.md: PyTorch reported 60 MB)


def operand_sets(bytes_per_call: float, cap: int = MAX_SETS) -> int:
    """Copies of a call's operands so that one pass touches >= L2_MULTIPLE x L2 (at least 1, at most
    `cap`, and their total under SET_BYTES_CAP)."""
    want = math.ceil(L2_MULTIPLE * l2_bytes() / max(1.0, bytes_per_call))
    fit = max(1, int(SET_BYTES_CAP // max(1.0, bytes_per_call)))
    return max(1, min(want, cap, fit))


def time_graph(fns: list[Callable[[], object]], budget_s: float = 1.0) -> tuple[Timing, dict]:
    """Per-call GPU time of `fns` (one closure per operand set) replayed from one CUDA graph.

    Warm-up runs every set once (compiles, autotunes, cuBLAS workspaces) on a side stream; the host
    time of one eager call is recorded (`host_s`). N calls cycling through the sets are captured into
    one graph (N >= len(fns), the replay about TARGET_REPLAY_S); replays are timed with CUDA events;
    seconds = median replay / N, p20/p80 likewise."""
    import torch

    if not torch.cuda.is_available():
        return _time_host(fns, budget_s)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    h0 = time.perf_counter()
    fns[0]()
    host_s = time.perf_counter() - h0
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for f in fns:
        f()
    e1.record()
    torch.cuda.synchronize()
    est = max(1e-7, e0.elapsed_time(e1) * 1e-3 / len(fns))  # eager: an upper bound of the GPU time
    n = max(len(fns), min(MAX_CALLS, math.ceil(TARGET_REPLAY_S / est)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    reps = max(MIN_REPLAYS, min(MAX_REPLAYS, int(budget_s / max(one, 1e-6))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        g.replay()
        ends[i].record()
    torch.cuda.synchronize()
    xs = [s.elapsed_time(e) * 1e-3 / n for s, e in zip(starts, ends)]
    del g
    return (Timing(statistics.median(xs), _quantile(xs, 0.2), _quantile(xs, 0.8), reps, host_s),
            {"timer": "graph", "calls_per_graph": n, "operand_sets": len(fns)})


def _time_host(fns, budget_s):
    """CPU stand-in (tests of the sweep code on a machine without a GPU): wall time per call."""
    for f in fns:
        f()
    xs = []
    for i in range(max(3, min(10, len(fns)))):
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        xs.append(time.perf_counter() - t0)
    return (Timing(statistics.median(xs), _quantile(xs, 0.2), _quantile(xs, 0.8), len(xs), xs[0]),
            {"timer": "host", "calls_per_graph": 1, "operand_sets": len(fns)})


def _device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _rand(shape, dtype, gen=None):
    import torch

    return torch.randn(shape, device=_device(), dtype=torch.float32, generator=gen).to(dtype)


def _sweep(writer: OpWriter, cases: list[dict], measure, deadline: float) -> int:
    from k3sim.calibration.torch_ops import sweep

    return sweep(writer, cases, measure, deadline)


def _free():
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- single-GPU families re-measured under graph replay -----------------------------------------

def gemm(out_dir: Path, deadline: float, fp8: bool) -> int:
    import torch

    op = "gemm_fp8" if fp8 else "gemm_bf16"
    w = OpWriter(out_dir, op, ["M", "N", "K"], GRAPH_EXTRAS)
    one = torch.ones((), device=_device())

    def measure(M, N, K):
        from k3sim.kernels.ops import OPS

        nbytes = int(OPS[op].bytes({"M": M, "N": N, "K": K}))  # the predictor's traffic: one formula
        fns = []
        for _ in range(operand_sets(nbytes, cap=64)):
            if fp8:
                a = _rand((M, K), torch.bfloat16).to(torch.float8_e4m3fn)
                b = _rand((N, K), torch.bfloat16).to(torch.float8_e4m3fn).t()
                fns.append(lambda a=a, b=b: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            else:
                a, b = _rand((M, K), torch.bfloat16), _rand((K, N), torch.bfloat16)
                fns.append(lambda a=a, b=b: a @ b)
        t, ex = time_graph(fns, budget_s=0.3)
        del fns
        return t, ex

    ms = [m for m in GRAPH_GEMM_M if not fp8 or m >= 16]
    cases = [dict(M=m, N=n, K=k) for (n, k) in grids.GEMM_NK for m in ms]
    return _sweep(w, cases, measure, deadline)


def moe_grouped(out_dir: Path, deadline: float) -> int:
    """The existing op moe_grouped_bf16 (one grouped GEMM, routing untimed) under graph replay."""
    import torch

    from k3sim.calibration import mxfp4

    w = OpWriter(out_dir, "moe_grouped_bf16", ["B", "E", "K", "N", "topk"], ["distinct_experts"] + GRAPH_EXTRAS)
    weights: dict = {}

    def measure(B, E, K, N, topk):
        key = (E, K, N)
        if key not in weights:
            weights.clear()
            _free()
            weights[key] = torch.empty((E, N, K), device=_device(), dtype=torch.bfloat16).normal_().transpose(-2, -1)
        wt = weights[key]
        expected = mxfp4_expected(B, E, topk)
        sets = operand_sets(expected * K * N * 2, cap=32)
        fns, distinct = [], []
        for s in range(sets):
            ids, _ = mxfp4.random_routing(B, E, topk, _device(), seed=1000 * s + B)
            meta = mxfp4.route(ids, torch.ones_like(ids, dtype=torch.float32), E)
            x = _rand((B * topk, K), torch.bfloat16)
            distinct.append(int((meta["expert_counts"] > 0).sum()))
            fns.append(lambda x=x, offs=meta["offs"]: torch._grouped_mm(x, wt, offs=offs, out_dtype=torch.bfloat16))
        t, ex = time_graph(fns, budget_s=0.3)
        return t, dict(ex, distinct_experts=statistics.mean(distinct))

    cases = [dict(B=b, E=e, K=k, N=n, topk=tk) for (e, tk, k, n) in grids.MOE_CONFIGS for b in GRAPH_MOE_B]
    n = _sweep(w, cases, measure, deadline)
    weights.clear()
    _free()
    return n


def mxfp4_expected(B: int, E: int, topk: int) -> float:
    from k3sim.kernels.ops import expected_distinct_experts

    return expected_distinct_experts(B, E, topk)


def kda_decode(out_dir: Path, deadline: float, heads: list[int]) -> int:
    import torch

    from k3sim.calibration import kda_ops

    _, fused_recurrent_kda = kda_ops._fla()
    w = OpWriter(out_dir, "recurrent_kda_decode", ["B", "T", "H"], GRAPH_EXTRAS)
    D = kda_ops.HEAD_DIM

    def measure(B, T, H):
        nbytes = 2 * B * H * D * D * 4
        fns = []
        for s in range(operand_sets(nbytes)):
            x = kda_ops.kda_inputs(T, H, B=B, seed=s)
            h0 = torch.randn((B, H, D, D), device="cuda", dtype=torch.float32)
            fns.append(lambda x=x, h0=h0: fused_recurrent_kda(
                **x, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, lower_bound=kda_ops.K3_GATE_LOWER_BOUND))
        with torch.no_grad():
            return time_graph(fns, budget_s=0.3)

    cases = [dict(B=b, T=t, H=h) for t in grids.KDA_DECODE_T for h in heads for b in grids.KDA_DECODE_B]
    return _sweep(w, cases, measure, deadline)


def hbm(out_dir: Path, deadline: float) -> int:
    import torch

    w = OpWriter(out_dir, "hbm_copy", ["bytes"], GRAPH_EXTRAS)

    def measure(bytes):  # noqa: A002 - the column name
        fns = []
        for _ in range(operand_sets(2 * bytes, cap=64)):
            src = torch.empty(bytes, dtype=torch.uint8, device=_device()).random_(0, 255)
            dst = torch.empty_like(src)
            fns.append(lambda s=src, d=dst: d.copy_(s))
        return time_graph(fns, budget_s=0.3)

    return _sweep(w, [dict(bytes=b) for b in GRAPH_HBM_BYTES], measure, deadline)


def decode_small(out_dir: Path, deadline: float, tokens: list[int] | None = None) -> int:
    from k3sim.calibration import decode_ops

    n = 0
    per_op = {}
    for op, names in decode_ops.OPS.items():
        per_op[op] = OpWriter(out_dir, op, list(names), GRAPH_EXTRAS)
    shared: dict = {}
    start = time.monotonic()
    ops = list(decode_ops.OPS)
    for i, op in enumerate(ops):
        # equal shares of what is left, so a slow op cannot starve the later ones
        op_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(ops) - i)

        def measure(op=op, **params):
            _, nbytes = decode_ops.make_case(op, params, _device(), 0, shared)
            fns = [decode_ops.make_case(op, params, _device(), s, shared)[0] for s in range(operand_sets(nbytes))]
            return time_graph(fns, budget_s=0.15)

        cases = [dict(T=t, **shape) for shape in decode_ops.SHAPES[op] for t in (tokens or GRAPH_TOKENS)]
        n += _sweep(per_op[op], cases, measure, op_deadline)
        shared.clear()
    del start
    return n


# ---- routed experts: MXFP4 token-centric vs tile-centric grouped GEMM -------------------------------

def _grouped_ffn_bf16(w_gu, w_d):
    """Tile-centric routed experts: rows sorted by expert, two torch._grouped_mm (gate/up, down)."""
    import torch

    from k3sim.calibration import decode_ops, mxfp4

    def ffn(x, meta, B, topk):
        xs = x[meta["tok"]]
        gu = torch._grouped_mm(xs, w_gu, offs=meta["offs"], out_dtype=torch.bfloat16)
        h = decode_ops.silu_mul(gu)
        y = torch._grouped_mm(h, w_d, offs=meta["offs"], out_dtype=torch.bfloat16)
        return mxfp4.combine((y.float() * meta["wt"][:, None]).to(torch.bfloat16), meta["perm"], B, topk)

    return ffn


FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _rowwise_fp8(x):
    import torch

    s = (x.float().abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    return (x.float() / s).to(torch.float8_e4m3fn), s.squeeze(-1)


def _grouped_ffn_fp8(w_gu, s_gu, w_d, s_d):
    """The same with fp8 e4m3 operands (rowwise scales: per token row, per expert output column)
    through torch._scaled_grouped_mm; activations are quantised inside the timed call."""
    import torch

    from k3sim.calibration import decode_ops, mxfp4

    def ffn(x, meta, B, topk):
        xq, xs = _rowwise_fp8(x[meta["tok"]])
        gu = torch._scaled_grouped_mm(xq, w_gu, xs, s_gu, offs=meta["offs"], out_dtype=torch.bfloat16)
        hq, hs = _rowwise_fp8(decode_ops.silu_mul(gu))
        y = torch._scaled_grouped_mm(hq, w_d, hs, s_d, offs=meta["offs"], out_dtype=torch.bfloat16)
        return mxfp4.combine((y.float() * meta["wt"][:, None]).to(torch.bfloat16), meta["perm"], B, topk)

    return ffn


def moe_ffn_check(out_dir: Path, deadline: float, E: int = 16, topk: int = 4) -> int:
    """The MXFP4 kernel (and the bf16 grouped path) against the dequantise-then-bf16 reference at K3's
    expert shapes, random weights quantised with `mxfp4.quantize`, several B and routings."""
    import torch

    from k3sim.calibration import mxfp4

    w = OpWriter(out_dir, "moe_mxfp4_check", ["B", "E", "K", "N", "topk", "routing"], ["rel_err_mxfp4", "rel_err_grouped_bf16"])
    dev = _device()
    K, N = K3_LATENT, K3_WIDTH
    g = torch.Generator(device=dev).manual_seed(7)
    # weights with trained-like scale (|w| ~ 0.02) so the intermediate stays in bf16's range
    mats = [mxfp4.quantize(torch.randn(s, generator=g, device=dev) * 0.02) for s in ((E, N, K), (E, N, K), (E, K, N))]
    ex = mxfp4.MXFP4Experts(*mats, variant=CHOSEN.get("mxfp4"))
    gate, up, down = ex.dequantized(torch.bfloat16)
    grouped = _grouped_ffn_bf16(torch.cat([gate, up], 1).transpose(-2, -1), down.transpose(-2, -1))
    n = 0
    for B, routing in [(1, "uniform"), (3, "uniform"), (16, "uniform"), (64, "uniform"), (256, "uniform"),
                       (64, "skewed")]:
        if time.monotonic() > deadline:
            break
        ids, wts = mxfp4.random_routing(B, E, topk, dev, seed=B)
        if routing == "skewed":  # every token to experts 0..topk-1: 64 tokens per expert, 4 token tiles
            ids = torch.arange(topk, device=dev, dtype=torch.int32).repeat(B, 1)
        meta = mxfp4.route(ids, wts, E)
        x = (torch.randn((B, K), generator=g, device=dev)).to(torch.bfloat16)
        ref = mxfp4.reference_moe(x, ids, wts, gate, up, down)
        out = ex(x, meta, B, topk)
        err = mxfp4.rel_err(out, ref)
        err_g = mxfp4.rel_err(grouped(x, meta, B, topk), ref) if dev == "cuda" else float("nan")
        w._write(dict(B=B, E=E, K=K, N=N, topk=topk, routing=routing, seconds="", status="ok" if err < 2e-2 else "failed",
                      error="" if err < 2e-2 else f"rel_err {err:.3g} above 2e-2", rel_err_mxfp4=f"{err:.3g}",
                      rel_err_grouped_bf16=f"{err_g:.3g}"))
        print(f"[check] mxfp4 moe B={B} {routing}: rel_err {err:.2e} (grouped bf16 {err_g:.2e})", flush=True)
        n += 1
    w.close()
    del ex, gate, up, down, mats
    _free()
    return n


def moe_ffn(out_dir: Path, deadline: float, eps: list[int] | None = None, batches: list[int] | None = None,
            impls: tuple[str, ...] = ("mxfp4", "bf16", "fp8")) -> int:
    """Routed experts of one K3 layer on one EP rank: E = 896/EP local experts, each token routes to
    16/EP of them (uniform). Each implementation's weights are allocated in turn (bf16 at EP 1 is 59 GB)."""
    import torch

    from k3sim.calibration import mxfp4

    params = ["B", "E", "K", "N", "topk"]
    names = {"mxfp4": "moe_mxfp4_decode", "bf16": "moe_ffn_grouped_bf16", "fp8": "moe_ffn_grouped_fp8"}
    writers = {i: OpWriter(out_dir, names[i], params, ["distinct_experts"] + GRAPH_EXTRAS) for i in impls}
    dev = _device()
    K, N = K3_LATENT, K3_WIDTH
    eps = eps or FFN_EP
    batches = batches or FFN_B
    done = 0
    jobs = [(ep, impl) for ep in eps for impl in impls]
    for j, (ep, impl) in enumerate(jobs):
        E, topk = K3_EXPERTS // ep, K3_TOPK // ep
        job_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(jobs) - j)
        _free()
        try:
            ffn, bytes_per_expert = _make_impl(impl, E, K, N, dev)
        except Exception as err:  # noqa: BLE001 - recorded, the sweep goes on
            for b in batches:
                writers[impl].failed(dict(B=b, E=E, K=K, N=N, topk=topk), err)
            continue

        def measure(B, E, K, N, topk, ffn=ffn, bpe=bytes_per_expert):
            sets = max(2, operand_sets(mxfp4_expected(B, E, topk) * bpe, cap=32))  # >= 2 routings
            fns, distinct = [], []
            for s in range(sets):
                ids, wts = mxfp4.random_routing(B, E, topk, dev, seed=7919 * s + B)
                meta = mxfp4.route(ids, wts, E)
                x = _rand((B, K), torch.bfloat16)
                distinct.append(int((meta["expert_counts"] > 0).sum()))
                fns.append(lambda x=x, meta=meta: ffn(x, meta, B, topk))
            t, ex = time_graph(fns, budget_s=0.25)
            return t, dict(ex, distinct_experts=statistics.mean(distinct))

        for b in batches:  # a writer serves several EPs: sweep() would close it
            p = dict(B=b, E=E, K=K, N=N, topk=topk)
            if time.monotonic() > job_deadline:
                writers[impl].failed(p, "skipped: part time budget exhausted")
                continue
            try:
                t, ex = measure(**p)
                writers[impl].ok(p, t, **ex)
                done += 1
            except Exception as err:  # noqa: BLE001
                writers[impl].failed(p, err)
                _free()
        del ffn, measure  # the next implementation's weights must not sit beside these
    for wr in writers.values():
        wr.close()
    _free()
    return done


def _make_impl(impl: str, E: int, K: int, N: int, dev):
    """(ffn(x, meta, B, topk), weight bytes per expert) with random weights of one implementation."""
    import torch

    from k3sim.calibration import mxfp4

    if impl == "mxfp4":
        ex = mxfp4.MXFP4Experts.random(E, K, N, dev, variant=CHOSEN.get("mxfp4"))
        return (lambda x, meta, B, topk: ex(x, meta, B, topk)), ex.weight_bytes_per_expert()
    if impl == "bf16":
        w_gu = torch.empty((E, 2 * N, K), device=dev, dtype=torch.bfloat16).normal_(0, 0.02).transpose(-2, -1)
        w_d = torch.empty((E, K, N), device=dev, dtype=torch.bfloat16).normal_(0, 0.02).transpose(-2, -1)
        return _grouped_ffn_bf16(w_gu, w_d), 3 * K * N * 2
    if impl == "fp8":
        return _grouped_ffn_fp8(*fp8_expert_weights(E, K, N, dev)), 3 * K * N
    raise KeyError(impl)


def fp8_expert_weights(E: int, K: int, N: int, dev, scale: float = 0.02):
    """Random e4m3 expert weights as `_grouped_ffn_fp8` takes them: w_gu [E, K, 2N] and w_d [E, N, K]
    (column-major per expert), with rowwise scales s_gu [E, 2N], s_d [E, K] (all `scale`: |w| ~ 0.02)."""
    import torch

    def fp8(shape):  # chunked: a bf16 copy of all experts at once would not fit beside the others
        out = torch.empty(shape, device=dev, dtype=torch.float8_e4m3fn)
        for e0 in range(0, shape[0], 32):
            out[e0:e0 + 32] = torch.randn((min(32, shape[0] - e0), *shape[1:]), device=dev).to(torch.float8_e4m3fn)
        return out
    w_gu = fp8((E, 2 * N, K)).transpose(-2, -1)
    w_d = fp8((E, K, N)).transpose(-2, -1)
    return w_gu, torch.full((E, 2 * N), scale, device=dev), w_d, torch.full((E, K), scale, device=dev)


# ---- launch variants: correct on the reference first, then fastest on probe shapes ----------------------

CHOSEN: dict = {}  # "mxfp4" -> mxfp4.Variant; "mla_small" / "mla_large" -> mla_decode.Variant (this run)
MXFP4_PROBES = [dict(B=1), dict(B=16), dict(B=256)]  # at EP8: E = 112, topk = 2
MLA_PROBES = {"mla_small": [dict(B=4, C=16384, H=12), dict(B=1, C=65536, H=12), dict(B=64, C=4096, H=12)],
              "mla_large": [dict(B=16, C=16384, H=96), dict(B=4, C=16384, H=32), dict(B=64, C=4096, H=32)]}


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def moe_ffn_variants(out_dir: Path, deadline: float) -> int:
    """Every `mxfp4.VARIANTS` entry: rel. error against the reference (E = 16, K3 shapes, uniform and
    skewed routing), then graph time at EP8 probes; the fastest correct one (geometric mean) is used
    by the sweep. Rows in moe_mxfp4_variants.csv (not a fitted op)."""
    import torch

    from k3sim.calibration import mxfp4

    w = OpWriter(out_dir, "moe_mxfp4_variants", ["variant", "B", "E", "K", "N", "topk"], ["rel_err"] + GRAPH_EXTRAS)
    dev = _device()
    K, N = K3_LATENT, K3_WIDTH
    g = torch.Generator(device=dev).manual_seed(11)
    mats = [mxfp4.quantize(torch.randn(s, generator=g, device=dev) * 0.02) for s in ((16, N, K), (16, N, K), (16, K, N))]
    gate = up = down = None
    E, topk = K3_EXPERTS // 8, K3_TOPK // 8
    best, n = None, 0
    for v in mxfp4.VARIANTS:
        if time.monotonic() > deadline:
            break
        try:
            small = mxfp4.MXFP4Experts(*mats, variant=v)
            if gate is None:
                gate, up, down = small.dequantized(torch.bfloat16)
            err = 0.0
            for B, skew in ((3, False), (64, True)):
                ids, wts = mxfp4.random_routing(B, 16, 4, dev, seed=B)
                if skew:
                    ids = torch.arange(4, device=dev, dtype=torch.int32).repeat(B, 1)
                x = torch.randn((B, K), generator=g, device=dev).to(torch.bfloat16)
                out = small(x, mxfp4.route(ids, wts, 16), B, 4)
                err = max(err, mxfp4.rel_err(out, mxfp4.reference_moe(x, ids, wts, gate, up, down)))
            del small
            if not err < 2e-2:
                w.failed(dict(variant=v.name, B=0, E=16, K=K, N=N, topk=4), f"rel_err {err:.3g} above 2e-2")
                print(f"[variants] mxfp4 {v.name}: rel_err {err:.2e} FAILED", flush=True)
                continue
            big = mxfp4.MXFP4Experts.random(E, K, N, dev, variant=v)
            times = []
            for p in MXFP4_PROBES:
                B = p["B"]
                fns = []
                for s in range(max(2, operand_sets(mxfp4_expected(B, E, topk) * big.weight_bytes_per_expert(), cap=32))):
                    ids, wts = mxfp4.random_routing(B, E, topk, dev, seed=7919 * s + B)
                    meta, x = mxfp4.route(ids, wts, E), _rand((B, K), torch.bfloat16)
                    fns.append(lambda x=x, meta=meta, B=B: big(x, meta, B, topk))
                t, ex = time_graph(fns, budget_s=0.2)
                w.ok(dict(variant=v.name, B=B, E=E, K=K, N=N, topk=topk), t, rel_err=f"{err:.3g}", **ex)
                times.append(t.seconds)
                n += 1
            del big, fns
            gm = _geomean(times)
            print(f"[variants] mxfp4 {v.name}: rel_err {err:.2e}, probes "
                  + " ".join(f"{x * 1e6:.0f}us" for x in times) + f" (geomean {gm * 1e6:.0f}us)", flush=True)
            if best is None or gm < best[0]:
                best = (gm, v)
        except Exception as err:  # noqa: BLE001 - a variant that does not compile or run is recorded
            w.failed(dict(variant=v.name, B=0, E=16, K=K, N=N, topk=4), err)
            print(f"[variants] mxfp4 {v.name}: FAILED {type(err).__name__}: {str(err)[:200]}", flush=True)
        _free()
    w.close()
    if best is not None:
        CHOSEN["mxfp4"] = best[1]
        print(f"[variants] mxfp4 chosen: {best[1].name}", flush=True)
    return n


def mla_variants(out_dir: Path, deadline: float) -> int:
    """Every `mla_decode.VARIANTS` entry: checked against the reference, then timed on the probes of
    each head class (H <= 16: one 16-head tile; larger H); the fastest correct one per class is used."""
    import torch

    from k3sim.calibration import mla_decode as mla_mod
    from k3sim.calibration.mxfp4 import rel_err

    w = OpWriter(out_dir, "mla_decode_variants", ["variant", "B", "C", "H"], ["rel_err", "splits"] + GRAPH_EXTRAS)
    dev = _device()
    best: dict = {}
    n = 0
    for v in mla_mod.VARIANTS:
        if time.monotonic() > deadline:
            break
        try:
            err = 0.0
            for B, C, H in ((2, 3000, 12), (2, 3000, 96)):
                g = torch.Generator(device=dev).manual_seed(C + H)
                ql = torch.randn((B, H, 512), generator=g, device=dev).to(torch.bfloat16)
                qr = torch.randn((B, H, 64), generator=g, device=dev).to(torch.bfloat16)
                cache = torch.randn((B, C, 576), generator=g, device=dev).to(torch.bfloat16)
                lens = torch.tensor([C, C - 1001], device=dev, dtype=torch.int32)
                out = mla_mod.MLADecode(B, C, H, dev, variant=v)(ql, qr, cache, lens)
                err = max(err, rel_err(out, mla_mod.reference(ql, qr, cache, lens)))
            if not err < 1e-2:
                w.failed(dict(variant=v.name, B=0, C=0, H=0), f"rel_err {err:.3g} above 1e-2")
                continue
            for cls, probes in MLA_PROBES.items():
                times = []
                for p in probes:
                    t, ex = _time_mla(p["B"], p["C"], p["H"], v)
                    w.ok(dict(variant=v.name, **p), t, rel_err=f"{err:.3g}", **ex)
                    times.append(t.seconds)
                    n += 1
                gm = _geomean(times)
                print(f"[variants] mla {v.name} {cls}: rel_err {err:.2e}, probes "
                      + " ".join(f"{x * 1e6:.0f}us" for x in times), flush=True)
                if cls not in best or gm < best[cls][0]:
                    best[cls] = (gm, v)
        except Exception as err:  # noqa: BLE001
            w.failed(dict(variant=v.name, B=0, C=0, H=0), err)
            print(f"[variants] mla {v.name}: FAILED {type(err).__name__}: {str(err)[:200]}", flush=True)
        _free()
    w.close()
    for cls, (gm, v) in best.items():
        CHOSEN[cls] = v
        print(f"[variants] {cls} chosen: {v.name}", flush=True)
    return n


def mla_variant_for(H: int):
    return CHOSEN.get("mla_small" if H <= 16 else "mla_large")


def _time_mla(B, C, H, variant=None):
    import torch

    from k3sim.calibration import mla_decode as mla_mod

    dev = _device()
    sets = operand_sets(mla_mod.decode_bytes(B, C, H), cap=160)
    fns, splits = [], 0
    for s in range(sets):
        g = torch.Generator(device=dev).manual_seed(s)
        ql = torch.randn((B, H, 512), generator=g, device=dev).to(torch.bfloat16)
        qr = torch.randn((B, H, 64), generator=g, device=dev).to(torch.bfloat16)
        cache = torch.randn((B, C, 576), generator=g, device=dev).to(torch.bfloat16)
        lens = torch.full((B,), C, device=dev, dtype=torch.int32)
        k = mla_mod.MLADecode(B, C, H, dev, variant=variant)
        splits = k.splits
        fns.append(lambda k=k, a=(ql, qr, cache, lens): k(*a))
    t, ex = time_graph(fns, budget_s=0.25)
    return t, dict(ex, splits=splits)


# ---- MLA decode -------------------------------------------------------------------------------------

def mla_check(out_dir: Path, deadline: float) -> int:
    import torch

    from k3sim.calibration import mla_decode as mla
    from k3sim.calibration.mxfp4 import rel_err

    w = OpWriter(out_dir, "mla_decode_check", ["B", "C", "H", "splits"], ["rel_err", "rel_err_torch"])
    dev = _device()
    n = 0
    cases = [(1, 1000, 12, None), (3, 4096, 8, None), (8, 777, 96, None), (2, 20000, 32, None), (4, 5000, 16, 1)]
    if dev == "cpu":
        cases = [(2, 100, 12, None), (1, 300, 33, 2)]
    for B, C, H, splits in cases:
        if time.monotonic() > deadline:
            break
        g = torch.Generator(device=dev).manual_seed(B * C + H)
        ql = torch.randn((B, H, 512), generator=g, device=dev).to(torch.bfloat16)
        qr = torch.randn((B, H, 64), generator=g, device=dev).to(torch.bfloat16)
        cache = torch.randn((B, C, 576), generator=g, device=dev).to(torch.bfloat16)
        lens = torch.tensor([max(1, C - 97 * i) for i in range(B)], device=dev, dtype=torch.int32)
        k = mla.MLADecode(B, C, H, dev, splits=splits, variant=mla_variant_for(H))
        out = k(ql, qr, cache, lens)
        ref = mla.reference(ql, qr, cache, lens)
        err = rel_err(out, ref)
        full = torch.full_like(lens, C)
        err_t = rel_err(mla.torch_decode(ql, qr, cache), mla.reference(ql, qr, cache, full))
        w._write(dict(B=B, C=C, H=H, splits=k.splits, seconds="", status="ok" if err < 1e-2 else "failed",
                      error="" if err < 1e-2 else f"rel_err {err:.3g} above 1e-2", rel_err=f"{err:.3g}",
                      rel_err_torch=f"{err_t:.3g}"))
        print(f"[check] mla B={B} C={C} H={H} splits={k.splits}: rel_err {err:.2e} (torch {err_t:.2e})", flush=True)
        n += 1
    w.close()
    return n


def mla(out_dir: Path, deadline: float, heads: list[int] | None = None) -> int:
    import torch

    from k3sim.calibration import mla_decode as mla_mod

    w = OpWriter(out_dir, "mla_decode", ["B", "C", "H"], ["splits"] + GRAPH_EXTRAS)
    wt = OpWriter(out_dir, "mla_decode_torch", ["B", "C", "H"], GRAPH_EXTRAS)
    dev = _device()

    def inputs(B, C, H, s):
        g = torch.Generator(device=dev).manual_seed(s)
        return (torch.randn((B, H, 512), generator=g, device=dev).to(torch.bfloat16),
                torch.randn((B, H, 64), generator=g, device=dev).to(torch.bfloat16),
                torch.randn((B, C, 576), generator=g, device=dev).to(torch.bfloat16),
                torch.full((B,), C, device=dev, dtype=torch.int32))

    def measure(B, C, H):
        return _time_mla(B, C, H, mla_variant_for(H))

    def measure_torch(B, C, H):
        sets = operand_sets(mla_mod.decode_bytes(B, C, H), cap=64)
        fns = []
        for s in range(sets):
            ql, qr, cache, _ = inputs(B, C, H, s)
            fns.append(lambda a=(ql, qr, cache): mla_mod.torch_decode(*a))
        return time_graph(fns, budget_s=0.25)

    hs = heads or MLA_H
    cases = [dict(B=b, C=c, H=h) for h in hs for b in MLA_B for c in MLA_C if b * c <= MLA_MAX_POSITIONS]
    # the torch baseline on a subset (K3 TP8 and TP1 head counts, up to 512K positions), after the kernel
    tcases = [dict(B=b, C=c, H=h) for h in (12, 96) for b in (1, 8, 64) for c in (4096, 32768) if b * c <= 2 ** 19]
    main_deadline = deadline - 0.15 * max(0.0, deadline - time.monotonic())
    n = _sweep(w, cases, measure, main_deadline)
    return n + _sweep(wt, tcases, measure_torch, deadline)


# ---- driver -------------------------------------------------------------------------------------------

PARTS = ["moe_ffn_variants", "moe_ffn_check", "moe_ffn", "moe_mxfp4", "mla_variants", "mla_check", "mla",
         "decode_ops", "decode_ops_fill", "gemm_bf16", "gemm_fp8", "kda_decode", "moe", "hbm"]


GRAPH_TIMING = ("CUDA-graph replay (graph_parts.time_graph): N calls captured into one graph after warm-up, "
                "cycling through operand copies that together touch >= 3x the L2; median over replays of "
                "replay time / N; no L2 flush; host_s = host time of one eager call; rows timer=graph")


def run_parts(tag: str, out_dir: Path, parts: list[str], budget_s: float, shares: Callable[[str, float, int], float],
              part_fn: Callable[[str, Path, float], int], *, free: bool = False,
              extra: Callable[[], dict] | None = None) -> None:
    """The one driver of a time-boxed harness (graph_parts, deployed, train_fp8): provenance first, then each part
    until its deadline (`shares(part, seconds left, index)`), a failing part logged without losing the others,
    rows written by the parts as they go, the elapsed time (and `extra()`) in the provenance at the end."""
    from k3sim.calibration.records import provenance, write_provenance

    out_dir.mkdir(parents=True, exist_ok=True)
    info = provenance(" ".join(shlex.quote(a) for a in sys.argv), 1, parts)
    info["timing"] = GRAPH_TIMING
    write_provenance(out_dir, info)
    start = time.monotonic()
    for i, part in enumerate(parts):
        left = budget_s - (time.monotonic() - start)
        if left <= 0:
            print(f"[{tag}] {part}: skipped, run budget spent", flush=True)
            continue
        deadline = time.monotonic() + min(left, shares(part, left, i))
        t0 = time.monotonic()
        try:
            n = part_fn(part, out_dir, deadline)
        except Exception as err:  # noqa: BLE001 - one part failing must not lose the others
            print(f"[{tag}] {part}: FAILED {type(err).__name__}: {err}", flush=True)
            n = 0
        if free:
            _free()
        print(f"[{tag}] {part}: {n} rows in {time.monotonic() - t0:.0f}s", flush=True)
    info.update(extra() if extra else {})
    info["elapsed_s"] = round(time.monotonic() - start, 1)
    write_provenance(out_dir, info)


def run(out_dir: Path, parts: list[str], budget_s: float, budgets: dict[str, float], heads: list[int]) -> None:
    run_parts("graph", out_dir, parts, budget_s, lambda part, left, i: budgets.get(part, left / (len(parts) - i)),
              lambda part, d, deadline: _part(part, d, deadline, heads))


def decode_ops_tokens() -> list[int]:
    from k3sim.calibration import decode_ops

    return decode_ops.TOKENS


def _part(part, out_dir, deadline, heads):
    if part == "moe_ffn_check":
        return moe_ffn_check(out_dir, deadline)
    if part == "moe_ffn":
        return moe_ffn(out_dir, deadline)
    if part == "moe_mxfp4":  # the MXFP4 kernel alone (the grouped baselines measured in an earlier run)
        return moe_ffn(out_dir, deadline, impls=("mxfp4",))
    if part == "moe_ffn_variants":
        return moe_ffn_variants(out_dir, deadline)
    if part == "mla_variants":
        return mla_variants(out_dir, deadline)
    if part == "decode_ops_fill":  # the token counts between the coarse pass's
        return decode_small(out_dir, deadline, tokens=[t for t in decode_ops_tokens() if t not in GRAPH_TOKENS])
    if part == "mla_check":
        return mla_check(out_dir, deadline)
    if part == "mla":
        return mla(out_dir, deadline)
    if part == "decode_ops":
        return decode_small(out_dir, deadline)
    if part in ("gemm_bf16", "gemm_fp8"):
        return gemm(out_dir, deadline, fp8=part == "gemm_fp8")
    if part == "kda_decode":
        return kda_decode(out_dir, deadline, heads)
    if part == "moe":
        return moe_grouped(out_dir, deadline)
    if part == "hbm":
        return hbm(out_dir, deadline)
    raise ValueError(part)


def main(argv: list[str] | None = None) -> None:
    from k3sim.calibration.runner import _budgets, _int_list
    from k3sim.errors import InputError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--part-budgets", default="")
    ap.add_argument("--heads", default=",".join(map(str, grids.KDA_HEADS)))
    a = ap.parse_args(argv)
    try:
        parts = [p for p in a.parts.split(",") if p]
        bad = [p for p in parts if p not in PARTS]
        if bad:
            raise InputError(f"unknown part(s) {bad}; choose from {PARTS}", source="--parts")
        if not 0 < a.budget_s < float("inf"):
            raise InputError(f"must be a positive number of seconds, got {a.budget_s}", source="--budget-s")
        run(a.out, parts, a.budget_s, _budgets(a.part_budgets), _int_list(a.heads, "--heads"))
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
