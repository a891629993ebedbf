"""Kernels at the shapes attention-DP / wide-EP deployments run (issue 21, item 5), under CUDA-graph replay.

Why: a deployment that runs attention data-parallel puts every head of a layer on one GPU (DeepSeek-V3's
128, Kimi K2's 64, times the MTP query tokens), so MLA decode runs at 16-512 query rows per sequence, where
the runs of issue 10 stopped at 96; its routed experts sit 2-12 to a GPU at K 7168, N 2048, and FP8 tokens
with 1x128 scales cross the dispatch. Every timing is `graph_parts.time_graph` (rows `timer=graph`).

Parts (each with a time box; rows written as they are measured):
  mla_variants   the split-K kernel's launch variants (`mla_decode.Variant`), each checked against the fp32
                 reference, timed on probes of three head classes (H <= 16, H = 32, H >= 64); the fastest
                 correct one per class, then its grid order (head tiles innermost) and split waves
  mla_check      the chosen variants against the reference at H 16-512, ragged lengths
  mla            mla_decode over grids.DEPLOYED_MLA_* (B x C x 576 x 2 bytes <= 60 GiB), each shape under the
                 split plans of SPLIT_WAVES, the fastest kept
  fp8_check      the fp8 grouped experts against an fp32 reference with the same e4m3 weights
  fp8_scaling    what torch offers for DeepGEMM's block scales (1x128 activations, 128x128 weights):
                 dense torch._scaled_mm blockwise vs rowwise (timed, checked) and a grouped blockwise call
                 (gemm_fp8_scaling.csv, not a fitted op)
  moe_fp8        moe_ffn_grouped_fp8 (rowwise scales) at grids.DEPLOYED_EXPERTS, K 7168, N 2048
  moe_grouped_fp8  one grouped fp8 GEMM alone (moe_grouped_fp8), both GEMMs of those experts
  dispatch_check fp8_quant_128 against its torch reference, permute / unpermute against closed forms
  dispatch       fp8_quant_128, ep_permute, ep_unpermute over grids.DEPLOYED_DISPATCH_*

Run: python3 -m k3sim.calibration.deployed --out DIR --budget-s 420
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from k3sim.calibration import grids
from k3sim.calibration.graph_parts import GRAPH_EXTRAS, _device, _free, _geomean, _sweep, operand_sets, time_graph
from k3sim.calibration.records import OpWriter

MLA_REL_ERR = 1e-2  # the bar graph_parts uses (the committed checks reach 1.7-1.9e-3)
FP8_REL_ERR = 8e-2  # e4m3 keeps 3 mantissa bits: x and h are each rounded by up to 2^-4 (RMS ~1.8 %)
MLA_CLASSES = {  # head class -> probes (B, C, H) the variants are chosen on; the deployed class first
    "h64+": [(64, 32768, 128), (8, 16384, 512), (128, 4096, 64)],
    "h16": [(64, 16384, 16), (8, 65536, 16), (256, 4096, 16)],
    "h32": [(64, 16384, 32), (8, 65536, 32), (256, 4096, 32)],
}
# Share of the variant part's time box per class (harness choice): H >= 64 tries 6 variants of 2 tile sizes
CLASS_SHARE = {"h64+": 0.5, "h16": 0.25, "h32": 0.25}
CHOSEN: dict = {}  # head class -> mla_decode.Variant (this run)


def mla_class(H: int) -> str:
    return "h16" if H <= 16 else "h32" if H <= 32 else "h64+"


def class_variants(cls: str) -> list:
    """Base launch variants tried per class: the issue-10 set (32-head tiles) for the small classes; for
    H >= 64 also 64-head tiles at 8 warps (Triton's Hopper wgmma needs 64 rows; 8 warps keep the
    [64, 512] fp32 accumulator at 128 registers a thread)."""
    from k3sim.calibration.mla_decode import DEFAULT, VARIANTS, Variant

    small = [v for v in VARIANTS if v.max_block_h == 32]
    if cls != "h64+":
        return small
    wide = [Variant(64, 8, 2, 64), Variant(32, 8, 2, 64), Variant(64, 8, 1, 64), Variant(32, 8, 3, 64)]
    return wide + [DEFAULT, Variant(64, 8, 2, 32)]


def mla_cases(heads=None, batches=None, contexts=None) -> list[dict]:
    """The deployed MLA grid, pruned to calls whose latent cache stays under DEPLOYED_MLA_MAX_CACHE_BYTES, in
    two passes: the first half of the (coarse-first) B and C lists for every H, then the rest, so a sweep
    cut short by its time box still spans every head count."""
    from k3sim.calibration.mla_decode import D_LATENT, D_ROPE

    hs, bs, cs = heads or grids.DEPLOYED_MLA_H, batches or grids.DEPLOYED_MLA_B, contexts or grids.DEPLOYED_MLA_C
    coarse = [dict(B=b, C=c, H=h) for h in hs for b in bs[:(len(bs) + 1) // 2] for c in cs[:(len(cs) + 1) // 2]]
    rest = [dict(B=b, C=c, H=h) for h in hs for b in bs for c in cs if dict(B=b, C=c, H=h) not in coarse]
    return [p for p in coarse + rest if p["B"] * p["C"] * (D_LATENT + D_ROPE) * 2 <= grids.DEPLOYED_MLA_MAX_CACHE_BYTES]


# ---- MLA decode ----------------------------------------------------------------------------------------

def mla_inputs(B: int, C: int, H: int, seed: int, dev, ragged: bool = False):
    """(q_latent, q_rope, cache, lens), drawn in bf16 directly (an fp32 draw of a 36 GiB cache would need
    twice that again); `ragged`: sequence i is 97 i positions shorter (at least 1)."""
    import torch

    g = torch.Generator(device=dev).manual_seed(seed)

    def r(*shape):
        return torch.empty(shape, device=dev, dtype=torch.bfloat16).normal_(generator=g)

    lens = [max(1, C - 97 * i) if ragged else C for i in range(B)]
    return r(B, H, 512), r(B, H, 64), r(B, C, 576), torch.tensor(lens, device=dev, dtype=torch.int32)


def time_mla(B: int, C: int, H: int, variant):
    """Graph time of one (B, C, H) call with `variant`, operands rotated over >= 3x the L2."""
    from k3sim.calibration import mla_decode as mla

    dev = _device()
    fns, splits = [], 0
    for s in range(operand_sets(mla.decode_bytes(B, C, H), cap=160)):
        args = mla_inputs(B, C, H, s, dev)
        k = mla.MLADecode(B, C, H, dev, variant=variant)
        splits = k.splits
        fns.append(lambda k=k, a=args: k(*a))
    t, ex = time_graph(fns, budget_s=0.25)
    del fns
    _free()
    return t, dict(ex, splits=splits, variant=variant.name)


def mla_rel_err(variant, B: int, C: int, H: int, seed: int = 0) -> float:
    from k3sim.calibration import mla_decode as mla
    from k3sim.calibration.mxfp4 import rel_err

    ql, qr, cache, lens = mla_inputs(B, C, H, seed, _device(), ragged=True)
    out = mla.MLADecode(B, C, H, _device(), variant=variant)(ql, qr, cache, lens)
    return rel_err(out, mla.reference(ql, qr, cache, lens))


def _try_variant(w: OpWriter, cls: str, v, deadline: float):
    """(geomean seconds over the class probes, rows) of one variant, or (None, 0) when it fails the check,
    does not compile or the time box ends."""
    probes = MLA_CLASSES[cls]
    if time.monotonic() > deadline:
        return None, 0
    try:
        err = mla_rel_err(v, 2, 3000, probes[0][2])
        if not err < MLA_REL_ERR:
            w.failed(dict(variant=v.name, B=0, C=0, H=probes[0][2]), f"rel_err {err:.3g} above {MLA_REL_ERR}")
            return None, 0
        times = []
        for B, C, H in probes:
            if time.monotonic() > deadline:
                return None, len(times)
            t, ex = time_mla(B, C, H, v)
            w.ok(dict(variant=v.name, B=B, C=C, H=H), t, rel_err=f"{err:.3g}", **ex)
            times.append(t.seconds)
        gm = _geomean(times)
        print(f"[variants] {cls} {v.name}: rel_err {err:.2e}, probes "
              + " ".join(f"{x * 1e6:.0f}us" for x in times) + f" (geomean {gm * 1e6:.0f}us)", flush=True)
        return gm, len(times)
    except Exception as err:  # noqa: BLE001 - a variant that does not compile or run is recorded
        w.failed(dict(variant=v.name, B=0, C=0, H=probes[0][2]), err)
        print(f"[variants] {cls} {v.name}: FAILED {type(err).__name__}: {str(err)[:200]}", flush=True)
        _free()
        return None, 0


def mla_variants(out_dir: Path, deadline: float) -> int:
    """Per head class: every base variant, then the winner with head tiles innermost, then the best so far
    with 1 and with 4 split waves, with fused and with lazy accumulation, and (H >= 64) with other cache
    tiles; the fastest correct one (geometric mean over the probes) goes into CHOSEN."""
    from dataclasses import replace

    w = OpWriter(out_dir, "mla_decode_variants", ["variant", "B", "C", "H"], ["rel_err", "splits"] + GRAPH_EXTRAS)
    n = 0
    classes = [c for c in MLA_CLASSES if c not in CHOSEN]  # a class given by --variants is not searched
    for i, cls in enumerate(classes):
        share = CLASS_SHARE.get(cls, 1.0) / sum(CLASS_SHARE.get(c, 1.0) for c in classes[i:])
        cls_deadline = time.monotonic() + (deadline - time.monotonic()) * share
        best = None

        def consider(v):
            nonlocal best, n
            gm, rows = _try_variant(w, cls, v, cls_deadline)
            n += rows
            if gm is not None and (best is None or gm < best[0]):
                best = (gm, v)

        for v in class_variants(cls):
            consider(v)
        if best is None:
            continue
        consider(replace(best[1], head_fastest=True))
        base = best[1]
        for waves in (1, 4):
            consider(replace(base, waves=waves))
        base = best[1]
        for acc in (dict(fused=True), dict(lazy=True)):
            consider(replace(base, **acc))
        if cls == "h64+":  # longer or deeper-pipelined cache tiles, in the best accumulation mode
            base = best[1]
            for block_c, stages in ((128, 1), (64, 3), (32, 3)):
                if (block_c, stages) != (base.block_c, base.num_stages):
                    consider(replace(base, block_c=block_c, num_stages=stages))
        CHOSEN[cls] = best[1]
        print(f"[variants] {cls} chosen: {best[1].name} ({best[0] * 1e6:.0f}us geomean)", flush=True)
    w.close()
    return n


def chosen_variant(H: int):
    from k3sim.calibration.mla_decode import DEFAULT

    return CHOSEN.get(mla_class(H), DEFAULT)


MLA_CHECK_CASES = [(2, 4096, 16), (8, 777, 32), (2, 2500, 48), (2, 3000, 64), (3, 3000, 96), (3, 5000, 128),
                   (1, 70000, 128), (4, 1500, 256), (2, 2000, 512)]


def mla_check(out_dir: Path, deadline: float) -> int:
    w = OpWriter(out_dir, "mla_decode_check", ["B", "C", "H", "splits"], ["rel_err", "variant"])
    n = 0
    for B, C, H in MLA_CHECK_CASES if _device() == "cuda" else [(2, 100, 16), (1, 300, 64)]:
        if time.monotonic() > deadline:
            break
        from k3sim.calibration import mla_decode as mla

        v = chosen_variant(H)
        err = mla_rel_err(v, B, C, H, seed=B * C + H)
        ok = err < MLA_REL_ERR
        w._write(dict(B=B, C=C, H=H, splits=mla.num_splits(B, C, H, v.max_block_h, v.waves), seconds="",
                      status="ok" if ok else "failed", error="" if ok else f"rel_err {err:.3g} above {MLA_REL_ERR}",
                      rel_err=f"{err:.3g}", variant=v.name))
        print(f"[check] mla B={B} C={C} H={H} {v.name}: rel_err {err:.2e}", flush=True)
        n += 1
    w.close()
    _free()
    return n


SPLIT_WAVES = (2, 4, 1)  # split plans tried per shape (mla_decode.num_splits); the first is the default


def time_mla_best_split(B: int, C: int, H: int, variant):
    """The class's variant under each split plan of SPLIT_WAVES that gives a distinct split count; the fastest
    (an engine plans its splits per shape, as FlashMLA's get_mla_metadata does). Run 20261202-1gpu-deployed-b,
    one plan per class, was 0.73-2.7x run a at the same shapes: 4 waves help B = 8-32 and hurt B = 1."""
    from dataclasses import replace

    from k3sim.calibration import mla_decode as mla

    best, seen = None, set()
    for waves in SPLIT_WAVES:
        v = replace(variant, waves=waves)
        splits = mla.num_splits(B, C, H, v.max_block_h, waves)
        if splits in seen:
            continue
        seen.add(splits)
        t, ex = time_mla(B, C, H, v)
        if best is None or t.seconds < best[0].seconds:
            best = (t, ex)
    return best


MLA_GRID: dict = {}  # --mla-heads / --mla-batches / --mla-contexts: mla_cases keyword arguments (this run)


def mla(out_dir: Path, deadline: float) -> int:
    w = OpWriter(out_dir, "mla_decode", ["B", "C", "H"], ["splits", "variant"] + GRAPH_EXTRAS)
    return _sweep(w, mla_cases(**MLA_GRID), lambda B, C, H: time_mla_best_split(B, C, H, chosen_variant(H)),
                  deadline)


# ---- FP8 routed experts --------------------------------------------------------------------------------

def fp8_reference(x, ids, wts, w_gu, s_gu, w_d, s_d):
    """The routed experts in fp32 from the same e4m3 weights (dequantised with their rowwise scales),
    expert by expert: sum_j w_j down_e(silu(gate_e x) * up_e x); the fp8 path's only other error is its
    rowwise e4m3 rounding of x and of h."""
    import torch
    import torch.nn.functional as F

    B, k = ids.shape
    N = w_d.shape[1]
    out = torch.zeros((B, x.shape[1]), dtype=torch.float32, device=x.device)
    for e in range(w_gu.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x[tok].float() @ (w_gu[e].float() * s_gu[e][None, :])
        y = (F.silu(gu[:, :N]) * gu[:, N:]) @ (w_d[e].float() * s_d[e][None, :])
        out.index_add_(0, tok, y * wts[tok, slot][:, None].float())
    return out


def fp8_check(out_dir: Path, deadline: float) -> int:
    """The fp8 grouped FFN (graph_parts._grouped_ffn_fp8) at K 7168, N 2048, E 8 against fp8_reference."""
    import torch

    from k3sim.calibration import graph_parts as gp
    from k3sim.calibration import mxfp4

    K, N = grids.DEPLOYED_EXPERT_K, grids.DEPLOYED_EXPERT_N
    w = OpWriter(out_dir, "moe_fp8_check", ["B", "E", "K", "N", "topk"], ["rel_err"])
    dev = _device()
    E = 8
    weights = gp.fp8_expert_weights(E, K, N, dev)
    ffn = gp._grouped_ffn_fp8(*weights)
    n = 0
    for B, topk in ((1, 1), (64, 2), (256, 1), (1024, 1)):
        if time.monotonic() > deadline:
            break
        ids, wts = mxfp4.random_routing(B, E, topk, dev, seed=B + topk)
        x = torch.randn((B, K), device=dev).to(torch.bfloat16)
        err = mxfp4.rel_err(ffn(x, mxfp4.route(ids, wts, E), B, topk), fp8_reference(x, ids, wts, *weights))
        ok = err < FP8_REL_ERR
        w._write(dict(B=B, E=E, K=K, N=N, topk=topk, seconds="", status="ok" if ok else "failed",
                      error="" if ok else f"rel_err {err:.3g} above {FP8_REL_ERR}", rel_err=f"{err:.3g}"))
        print(f"[check] fp8 experts B={B} topk={topk}: rel_err {err:.2e}", flush=True)
        n += 1
    w.close()
    del weights, ffn
    _free()
    return n


def sweep_tokens(w, measure, shape: dict, deadline: float, tokens=None, free=None) -> int:
    """One expert shape over the token counts (`grids.DEPLOYED_EXPERT_B`): each point measured and written,
    or recorded as failed (the sweep goes on) or skipped once `deadline` (time.monotonic) has passed; the
    number measured."""
    done = 0
    for b in grids.DEPLOYED_EXPERT_B if tokens is None else tokens:
        p = dict(B=b, **shape)
        if time.monotonic() > deadline:
            w.failed(p, "skipped: part time budget exhausted")
            continue
        try:
            t, ex = measure(**p)
            w.ok(p, t, **ex)
            done += 1
        except Exception as err:  # noqa: BLE001 - recorded, the sweep goes on
            w.failed(p, err)
        (free or _free)()
    return done


def moe_fp8(out_dir: Path, deadline: float) -> int:
    """moe_ffn_grouped_fp8 at the deployed (E, B): topk 1 (8 % EP != 0 at EP 32 and 128: each (token,
    expert) pair is one local pick, step/layers.py), uniform routing, weights allocated once per E."""
    import torch

    from k3sim.calibration import graph_parts as gp
    from k3sim.calibration import mxfp4

    K, N, topk = grids.DEPLOYED_EXPERT_K, grids.DEPLOYED_EXPERT_N, 1
    w = OpWriter(out_dir, "moe_ffn_grouped_fp8", ["B", "E", "K", "N", "topk"], ["distinct_experts"] + GRAPH_EXTRAS)
    dev = _device()
    done = 0
    for j, (E, _why) in enumerate(grids.DEPLOYED_EXPERTS):
        e_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(grids.DEPLOYED_EXPERTS) - j)
        _free()
        ffn = gp._grouped_ffn_fp8(*gp.fp8_expert_weights(E, K, N, dev))

        def measure(B, E, K, N, topk, ffn=ffn):
            sets = max(2, operand_sets(gp.mxfp4_expected(B, E, topk) * 3 * K * N + B * K * 2, cap=32))
            fns, distinct = [], []
            for s in range(sets):
                ids, wts = mxfp4.random_routing(B, E, topk, dev, seed=7919 * s + B)
                meta = mxfp4.route(ids, wts, E)
                x = torch.empty((B, K), device=dev, dtype=torch.bfloat16).normal_()
                distinct.append(int((meta["expert_counts"] > 0).sum()))
                fns.append(lambda x=x, meta=meta, B=B: ffn(x, meta, B, topk))
            t, ex = time_graph(fns, budget_s=0.25)
            del fns
            return t, dict(ex, distinct_experts=statistics.mean(distinct))

        done += sweep_tokens(w, measure, dict(E=E, K=K, N=N, topk=topk), e_deadline)
        del ffn, measure
    w.close()
    _free()
    return done


def grouped_fp8_gemms() -> list[tuple[int, int]]:
    """(K, N) of the two grouped GEMMs of a deployed expert: gate/up (7168 -> 2 x 2048), down (2048 -> 7168)."""
    K, N = grids.DEPLOYED_EXPERT_K, grids.DEPLOYED_EXPERT_N
    return [(K, 2 * N), (N, K)]


def moe_grouped_fp8(out_dir: Path, deadline: float) -> int:
    """One grouped fp8 GEMM alone (op moe_grouped_fp8: torch._scaled_grouped_mm, rowwise scales): rows already
    quantised and sorted by expert, as a DeepGEMM-style stack runs it between fp8_quant_128, SwiGLU and
    ep_unpermute; the fp8 analogue of moe_grouped_bf16. Shapes: grids.DEPLOYED_EXPERTS x DEPLOYED_EXPERT_B,
    topk 1, both GEMMs of an expert (grouped_fp8_gemms)."""
    import torch

    from k3sim.calibration import graph_parts as gp
    from k3sim.calibration import mxfp4

    w = OpWriter(out_dir, "moe_grouped_fp8", ["B", "E", "K", "N", "topk"], ["distinct_experts"] + GRAPH_EXTRAS)
    dev = _device()
    jobs = [(E, K, N) for (K, N) in grouped_fp8_gemms() for E, _ in grids.DEPLOYED_EXPERTS]
    done = 0
    for j, (E, K, N) in enumerate(jobs):
        job_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(jobs) - j)
        _free()
        wt = torch.empty((E, N, K), device=dev, dtype=torch.bfloat16).normal_().to(torch.float8_e4m3fn)
        wt = wt.transpose(-2, -1)  # [E, K, N], column-major per expert
        sw = torch.full((E, N), 0.02, device=dev)

        def measure(B, E, K, N, topk, wt=wt, sw=sw):
            sets = max(2, operand_sets(gp.mxfp4_expected(B, E, topk) * K * N + B * topk * (K + 2 * N), cap=32))
            fns, distinct = [], []
            for s in range(sets):
                ids, _ = mxfp4.random_routing(B, E, topk, dev, seed=7919 * s + B)
                meta = mxfp4.route(ids, torch.ones_like(ids, dtype=torch.float32), E)
                xq = torch.empty((B * topk, K), device=dev, dtype=torch.bfloat16).normal_().to(torch.float8_e4m3fn)
                xs = torch.rand((B * topk,), device=dev) + 0.5
                distinct.append(int((meta["expert_counts"] > 0).sum()))
                fns.append(lambda xq=xq, xs=xs, offs=meta["offs"]: torch._scaled_grouped_mm(
                    xq, wt, xs, sw, offs=offs, out_dtype=torch.bfloat16))
            t, ex = time_graph(fns, budget_s=0.2)
            del fns
            return t, dict(ex, distinct_experts=statistics.mean(distinct))

        done += sweep_tokens(w, measure, dict(E=E, K=K, N=N, topk=1), job_deadline)
        del wt, sw, measure
    w.close()
    _free()
    return done


# ---- what torch offers for block-scaled FP8 -------------------------------------------------------------

SCALING_SHAPES = [(1024, 4096, 7168), (8192, 4096, 7168), (1024, 7168, 2048), (8192, 7168, 2048), (128, 4096, 7168)]


def block_quant(x, row_block: int, col_block: int = 128):
    """x [R, C] -> (e4m3 [R, C], dequantisation scales [R / row_block, C / col_block] fp32): DeepGEMM's
    1x128 (activations) or 128x128 (weights) blocks, scale = amax / 448."""
    import torch

    R, C = x.shape
    g = x.float().view(R // row_block, row_block, C // col_block, col_block)
    s = (g.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-10)
    return (g / s[:, None, :, None]).view(R, C).to(torch.float8_e4m3fn), s


def _scaled_pair(M: int, N: int, K: int, scaling: str, dev, seed: int):
    """(call, fp32 reference) of one dense fp8 GEMM [M, K] x [N, K]^T with rowwise or 1x128 / 128x128
    block scales, in the layouts torch's tests pass them (1x128 scales outer-dim major)."""
    import torch

    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn((M, K), generator=g, device=dev)
    b = torch.randn((N, K), generator=g, device=dev) * 0.02
    if scaling == "rowwise":
        aq, sa = block_quant(a, 1, K)
        bq, sb = block_quant(b, 1, K)
        ref = (aq.float() * sa) @ (bq.float() * sb).t()
        sa, sb = sa.contiguous(), sb.t().contiguous()  # [M, 1], [1, N]
    else:
        aq, sa = block_quant(a, 1)
        bq, sb = block_quant(b, 128)
        ref = (aq.float() * sa.repeat_interleave(128, 1)) @ (bq.float() * sb.repeat_interleave(128, 0)
                                                              .repeat_interleave(128, 1)).t()
        sa, sb = sa.t().contiguous().t(), sb.t()
    return (lambda: torch._scaled_mm(aq, bq.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)), ref


def _grouped_blockwise_attempt(dev) -> str:
    """'' when torch runs a grouped GEMM with 1x128 / 128x128 block scales here, else why not (each form tried)."""
    import torch
    import torch.nn.functional as F

    E, R, K, N = 2, 256, 512, 256
    xq, sx = block_quant(torch.randn((R, K), device=dev), 1)
    wq = torch.randn((E, N, K), device=dev).to(torch.float8_e4m3fn)
    sw = torch.ones((E, N // 128, K // 128), device=dev)
    offs = torch.tensor([128, 256], device=dev, dtype=torch.int32)
    errors = []
    try:
        torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sx.t().contiguous().t(), sw.transpose(-2, -1), offs=offs,
                                 out_dtype=torch.bfloat16)
        return ""
    except Exception as err:  # noqa: BLE001 - the answer is the error
        errors.append(f"torch._scaled_grouped_mm: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
    st = getattr(F, "ScalingType", None)
    fn = getattr(F, "scaled_grouped_mm", None)
    if st is None or fn is None:
        errors.append("torch.nn.functional has no scaled_grouped_mm / ScalingType")
        return "; ".join(errors)
    try:
        fn(xq, wq.transpose(-2, -1), sx.t().contiguous().t(), st.BlockWise1x128, sw.transpose(-2, -1),
           st.BlockWise128x128, offs=offs, output_dtype=torch.bfloat16)
        return ""
    except Exception as err:  # noqa: BLE001
        errors.append(f"F.scaled_grouped_mm: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
    return "; ".join(errors)


def fp8_scaling(out_dir: Path, deadline: float) -> int:
    """Rows of gemm_fp8_scaling.csv (not a fitted op): dense fp8 GEMM time and error, rowwise against
    DeepGEMM-style block scales, at expert shapes; one row for the grouped blockwise call."""
    from k3sim.calibration.mxfp4 import rel_err

    w = OpWriter(out_dir, "gemm_fp8_scaling", ["M", "N", "K", "scaling"], ["rel_err"] + GRAPH_EXTRAS)
    dev = _device()
    n = 0
    why = _grouped_blockwise_attempt(dev)
    p = dict(M=256, N=256, K=512, scaling="grouped-1x128-128x128")
    w._write(dict(p, seconds="", status="ok" if not why else "failed", error=why[:300]))
    print(f"[fp8 scaling] grouped blockwise: {'runs' if not why else why}", flush=True)
    for M, N, K in SCALING_SHAPES:
        for scaling in ("rowwise", "blockwise-1x128-128x128"):
            p = dict(M=M, N=N, K=K, scaling=scaling)
            if time.monotonic() > deadline:
                w.failed(p, "skipped: part time budget exhausted")
                continue
            try:
                call, ref = _scaled_pair(M, N, K, scaling, dev, seed=M + N)
                err = rel_err(call(), ref)
                del ref
                fns = [call] + [_scaled_pair(M, N, K, scaling, dev, seed=s)[0]
                                for s in range(1, operand_sets(M * K + N * K + 2 * M * N, cap=16))]
                t, ex = time_graph(fns, budget_s=0.2)
                w.ok(p, t, rel_err=f"{err:.3g}", **ex)
                print(f"[fp8 scaling] {M}x{N}x{K} {scaling}: {t.seconds * 1e6:.1f}us rel_err {err:.2e}", flush=True)
                n += 1
            except Exception as err:  # noqa: BLE001
                w.failed(p, err)
                print(f"[fp8 scaling] {M}x{N}x{K} {scaling}: FAILED {type(err).__name__}: {str(err)[:160]}",
                      flush=True)
            _free()
    w.close()
    return n


# ---- around the dispatch -------------------------------------------------------------------------------

def _dispatch_case(op: str, p: dict, dev, seed: int):
    """(call with no arguments, its input tensors) for one shape of fp8_quant_128 / ep_permute / ep_unpermute."""
    import torch

    from k3sim.calibration import dispatch_ops as d

    g = torch.Generator(device=dev).manual_seed(seed)
    T, D = p["T"], p["D"]
    if op == "fp8_quant_128":
        x = torch.empty((T, D), device=dev, dtype=torch.bfloat16).normal_(generator=g)
        q = torch.empty((T, D), device=dev, dtype=torch.float8_e4m3fn)
        s = torch.empty((T, D // d.GROUP), device=dev, dtype=torch.float32)
        return lambda: d.quant_128(x, q, s)
    k = p["topk"]
    ids = torch.rand((T, max(k, 8)), generator=g, device=dev).argsort(-1)[:, :k].to(torch.int32)  # distinct picks
    if op == "ep_permute":
        x = torch.empty((T, D), device=dev, dtype=torch.bfloat16).normal_(generator=g)
        return lambda: d.permute(x, ids)
    rows = torch.empty((T * k, D), device=dev, dtype=torch.bfloat16).normal_(generator=g)
    _, _, inv = d.permute(rows[:T], ids)
    wts = torch.rand((T, k), generator=g, device=dev)
    out = torch.empty((T, D), device=dev, dtype=torch.bfloat16)
    return lambda: d.unpermute(rows, inv, wts, out)


def dispatch_check(out_dir: Path, deadline: float) -> int:
    """fp8_quant_128 against quant_reference (scales, dequantised values), the permute's order, rows and inverse,
    the Triton unpermute against the torch one (unpermute_torch, itself checked by hand in the tests)."""
    import torch

    from k3sim.calibration import dispatch_ops as d
    from k3sim.calibration.mxfp4 import rel_err

    w = OpWriter(out_dir, "dispatch_check", ["op", "T", "topk", "D"], ["rel_err"])
    dev = _device()
    T, D, k = 300, 7168, 8
    x = torch.randn((T, D), device=dev).to(torch.bfloat16)
    x[5, 128:256] = 0  # an all-zero group takes the floor scale
    results = []
    if d.triton is not None and (dev == "cuda" or d.interpreted()):
        q, s = d.quant_128(x)
        qr, sr = d.quant_reference(x)
        results.append(("fp8_quant_128", 1, max(rel_err(s, sr), rel_err(d.dequant(q, s), d.dequant(qr, sr)))))
    ids = torch.rand((T, 32), device=dev).argsort(-1)[:, :k].to(torch.int32)
    rows, perm, inv = d.permute(x, ids)
    order_ok = bool((ids.reshape(-1)[perm].diff() >= 0).all()) and bool((perm[inv] == torch.arange(T * k, device=dev)).all())
    results.append(("ep_permute", k, rel_err(rows, x[perm // k]) if order_ok else float("inf")))
    wts = torch.rand((T, k), device=dev)
    if d.triton is not None and (dev == "cuda" or d.interpreted()):
        rows = torch.randn((T * k, D), device=dev).to(torch.bfloat16)  # distinct rows: each pick's own
        results.append(("ep_unpermute", k, rel_err(d.unpermute(rows, inv, wts), d.unpermute_torch(rows, perm, wts))))
    for op, topk, err in results:
        ok = err < 1e-2
        w._write(dict(op=op, T=T, topk=topk, D=D, seconds="", status="ok" if ok else "failed",
                      error="" if ok else f"rel_err {err:.3g} above 1e-2", rel_err=f"{err:.3g}"))
        print(f"[check] {op}: rel_err {err:.2e}", flush=True)
    w.close()
    return len(results)


def dispatch(out_dir: Path, deadline: float) -> int:
    from k3sim.kernels.ops import OPS

    dev = _device()
    shapes = {"fp8_quant_128": [dict(T=t, D=dd) for dd in grids.DEPLOYED_QUANT_D for t in grids.DEPLOYED_DISPATCH_T],
              "ep_permute": [dict(T=t, topk=k, D=grids.DEPLOYED_DISPATCH_D) for k in grids.DEPLOYED_PERMUTE_TOPK
                             for t in grids.DEPLOYED_DISPATCH_T]}
    shapes["ep_unpermute"] = shapes["ep_permute"]
    n = 0
    for i, (op, cases) in enumerate(shapes.items()):
        op_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(shapes) - i)
        w = OpWriter(out_dir, op, list(OPS[op].params), GRAPH_EXTRAS)

        def measure(op=op, **p):
            sets = operand_sets(OPS[op].bytes(p), cap=64)
            t, ex = time_graph([_dispatch_case(op, p, dev, s) for s in range(sets)], budget_s=0.15)
            _free()
            return t, ex

        n += _sweep(w, cases, measure, op_deadline)
    return n


# ---- driver --------------------------------------------------------------------------------------------

PARTS = ["mla_variants", "mla_check", "mla", "fp8_check", "fp8_scaling", "moe_fp8", "moe_grouped_fp8",
         "dispatch_check", "dispatch"]
# Time boxes (seconds) of a full run: the variant search compiles ~20 kernels; the MLA grid is ~30 s of GPU work
PART_BUDGETS = {"mla_variants": 150, "mla_check": 10, "mla": 150, "fp8_check": 15, "fp8_scaling": 25,
                "moe_fp8": 70, "moe_grouped_fp8": 40, "dispatch_check": 5, "dispatch": 45}
_PART_FUNCS = {"mla_variants": mla_variants, "mla_check": mla_check, "mla": mla, "fp8_check": fp8_check,
               "fp8_scaling": fp8_scaling, "moe_fp8": moe_fp8, "moe_grouped_fp8": moe_grouped_fp8, "dispatch_check": dispatch_check, "dispatch": dispatch}


def run(out_dir: Path, parts: list[str], budget_s: float, budgets: dict[str, float]) -> None:
    from k3sim.calibration.graph_parts import run_parts

    run_parts("deployed", out_dir, parts, budget_s,
              lambda part, left, i: budgets.get(part, PART_BUDGETS.get(part, left / (len(parts) - i))),
              lambda part, d, deadline: _PART_FUNCS[part](d, deadline), free=True,
              extra=lambda: {"mla_variants_chosen": ", ".join(f"{c}: {v.name}" for c, v in CHOSEN.items())
                             or "none (defaults)"})


def parse_variants(text: str) -> dict:
    """'h64+=c64-w8-s2-h64-t,h16=c32-w4-s2-h32' -> {class: Variant}; a bad class or name is one line of bad input."""
    from k3sim.calibration.mla_decode import Variant
    from k3sim.errors import InputError

    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        cls, _, name = item.partition("=")
        if cls not in MLA_CLASSES:
            raise InputError(f"unknown head class {cls!r} in {item!r}; classes: {list(MLA_CLASSES)}", source="--variants")
        try:
            out[cls] = Variant.from_name(name)
        except ValueError as err:
            raise InputError(f"{err} in {item!r}", source="--variants") from None
    return out


def main(argv: list[str] | None = None) -> None:
    from k3sim.calibration.runner import _budgets, _int_list
    from k3sim.errors import InputError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--budget-s", type=float, default=float(sum(PART_BUDGETS.values())))
    ap.add_argument("--part-budgets", default="", help="e.g. mla=100,moe_fp8=60 (defaults: PART_BUDGETS)")
    ap.add_argument("--variants", default="", help="MLA variants per head class, not searched: e.g. "
                    "h64+=c64-w8-s2-h64-t,h16=c32-w4-s2-h32 (names as mla_decode_variants.csv writes them)")
    for name in ("heads", "batches", "contexts"):
        ap.add_argument(f"--mla-{name}", default="", help=f"the mla part's {name} instead of grids.DEPLOYED_MLA_*")
    a = ap.parse_args(argv)
    try:
        parts = [p for p in a.parts.split(",") if p]
        bad = [p for p in parts if p not in PARTS]
        if bad:
            raise InputError(f"unknown part(s) {bad}; choose from {PARTS}", source="--parts")
        if not 0 < a.budget_s < float("inf"):
            raise InputError(f"must be a positive number of seconds, got {a.budget_s}", source="--budget-s")
        CHOSEN.update(parse_variants(a.variants))
        for name in ("heads", "batches", "contexts"):
            values = _int_list(getattr(a, f"mla_{name}"), f"--mla-{name}")
            if values:
                MLA_GRID[name] = values
        budgets = _budgets(a.part_budgets)
        unknown = sorted(set(budgets) - set(parts))
        if unknown:
            raise InputError(f"budgets given for parts not run: {unknown}", source="--part-budgets")
        run(a.out, parts, a.budget_s, budgets)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
