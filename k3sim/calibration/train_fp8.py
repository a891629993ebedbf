"""Training kernels on one GPU under CUDA-graph replay (issue 22 items 2 and 6): block-scaled FP8 GEMMs, the
transposed FP8 quantisation the weight gradient reads, and the fused MoE permute / unpermute with their backwards.

Why: DeepSeek-V3 and K3 train their linears in FP8 with fine-grained scales (arXiv 2412.19437 sec. 3.3.1-3.3.2:
1x128 tiles for activations, 128x128 blocks for weights, FP32 promotion); the forward (M, N, K), input gradient
(M, K, N) and weight gradient (K, N, M) of each linear are that GEMM at three shapes. torch._scaled_mm runs
this scaling on sm90 through cuBLAS (run 20261202-1gpu-deployed, gemm_fp8_scaling.csv), so the op is timed
through it, after a check against an fp32 product of the same e4m3 values. Every timing is
`graph_parts.time_graph` (rows `timer=graph`).

Parts (each with a time box; rows written as they are measured):
  gemm_check      each scaling recipe (1x128 x 128x128, 1x128 x 1x128, rowwise) against the fp32 product of its
                  e4m3 operands, at aligned and unaligned widths (gemm_fp8_block_check.csv)
  permute_check   the fused permute kernels against torch (index exact, rows exact, gradients), the index
                  build's time against torch's stable sort at 8-1024 experts (permute_check.csv,
                  permute_index.csv)
  quant_check     fp8_quant_128_t against its torch reference, and a weight gradient through its outputs
  permute         moe_permute_fused, moe_permute_fused_bwd, moe_unpermute_fused, moe_unpermute_fused_bwd
                  over grids.TRAIN_PERMUTE_*
  quant           fp8_quant_128_t over grids.TRAIN_QUANT_*
  gemm_reference  bf16, fp8 rowwise and both block recipes at REFERENCE_SHAPES, one after the other
                  (gemm_train_reference.csv, not a fitted op): the same-run ratios
  gemm_block      gemm_fp8_block (1x128 x 128x128) at grids.train_gemm_cases

Run: python3 -m k3sim.calibration.train_fp8 --out DIR --budget-s 480
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from k3sim.calibration import grids
from k3sim.calibration.graph_parts import GRAPH_EXTRAS, _device, _free, _sweep, operand_sets, time_graph
from k3sim.calibration.records import OpWriter

GEMM_REL_ERR = 1e-2  # against the fp32 product of the same e4m3 values: bf16 output rounding is ~2e-3
GRAD_REL_ERR = 1e-2  # bf16 outputs of fp32 sums (one bf16 rounding, 2^-9 relative)
DW_REL_ERR = 1e-4  # the routing-weight gradient stays fp32 (summation order only)
RECIPES = ("1x128-128x128", "1x128-1x128", "rowwise")
OP_RECIPE = "1x128-128x128"  # gemm_fp8_block: X 1x128 along K, W 128x128 (DeepSeek-V3 sec. 3.3.1)
CHECK_ROWS = 256  # rows of A checked against the fp32 product in each timed shape (the full check: gemm_check)
LARGE_BYTES = 2 ** 30  # operands above this are freed after their shape (harness choice)
BLOCK = 128


# ---- block-scaled FP8 GEMMs ----------------------------------------------------------------------------

def _why(err: BaseException) -> str:
    """One line of an error for the log."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:160] if lines else ''}"


def _ceil(x: int, b: int = BLOCK) -> int:
    return -(-x // b) * b


def quant_blocks(x, row_block: int):
    """x [R, C] fp32 -> (e4m3 [R, C], dequantisation scales [ceil(R / row_block), ceil(C / 128)]) by
    `deployed.block_quant` on x zero-padded to whole blocks (a last partial block takes its own scale)."""
    import torch.nn.functional as F

    from k3sim.calibration.deployed import block_quant

    R, C = x.shape
    Rp, Cp = _ceil(R, row_block), _ceil(C)
    if (Rp, Cp) == (R, C):
        return block_quant(x, row_block)
    q, s = block_quant(F.pad(x, (0, Cp - C, 0, Rp - R)), row_block)
    return q[:R, :C].contiguous(), s


def dequant_blocks(q, s, row_block: int, col_block: int = BLOCK):
    """The inverse of `quant_blocks` in fp32 (rowwise: row_block 1, col_block = the row's length)."""
    R, C = q.shape
    return q.float() * s.repeat_interleave(row_block, 0)[:R].repeat_interleave(col_block, 1)[:, :C]


def _blocky(rows: int, cols: int, scale: float, dev, g):
    """Normal values times a log-normal factor per 128 x 128 block, so a scale laid out wrongly shows as a
    large error (plain normals give every block nearly the same amax)."""
    import torch

    f = torch.randn((-(-rows // BLOCK), -(-cols // BLOCK)), generator=g, device=dev).exp()
    f = f.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return torch.randn((rows, cols), generator=g, device=dev) * f * scale


class CheckFailed(RuntimeError):
    """A kernel computed something else than its reference: its time is not the op's."""


def gemm_operands(M: int, N: int, K: int, recipe: str, dev, seed: int, check_rows: int = CHECK_ROWS):
    """(call, check) of one fp8 GEMM out [M, N] = A [M, K] W [N, K]^T in bf16 with `recipe`'s scales, laid out
    as torch._scaled_mm takes them (1x128 scales outer-dim major, as torch's own tests pass them); check() is
    the relative error of the first `check_rows` rows against the fp32 product of the same e4m3 values."""
    import torch

    g = torch.Generator(device=dev).manual_seed(seed)
    a, b = _blocky(M, K, 1.0, dev, g), _blocky(N, K, 0.02, dev, g)
    if recipe == "rowwise":
        (aq, sa), (bq, sb) = quant_blocks_rowwise(a), quant_blocks_rowwise(b)
        sa_arg, sb_arg, rb, cb = sa, sb.t().contiguous(), 1, K
    else:
        aq, sa = quant_blocks(a, 1)
        rb, cb = (BLOCK if recipe == "1x128-128x128" else 1), BLOCK
        bq, sb = quant_blocks(b, rb)
        sa_arg = sa.t().contiguous().t()
        sb_arg = sb.t() if rb == BLOCK else sb.t().contiguous()
    del a, b

    def call():
        return torch._scaled_mm(aq, bq.t(), scale_a=sa_arg, scale_b=sb_arg, out_dtype=torch.bfloat16)

    def check() -> float:
        from k3sim.calibration.mxfp4 import rel_err

        r = min(M, check_rows)
        ref = dequant_blocks(aq[:r], sa[:r], 1, cb) @ dequant_blocks(bq, sb, rb, cb).t()
        return rel_err(call()[:r], ref)

    return call, check


def quant_blocks_rowwise(x):
    """One scale per row (amax / 448): the rowwise recipe."""
    from k3sim.calibration.deployed import block_quant

    return block_quant(x, 1, x.shape[1])


# cuBLAS (CUDA 13.0 under torch 2.11 on the H200, run 20261202-1gpu-train-fp8) returns wrong products (rel_err
# 0.9-1e4) for 128x128 weight scales whose leading dimension ceil(K / 128) is not a multiple of 4 floats (16 bytes)
# while the scale matrix has more than one block row; torch's layout check lets them through. Those shapes are run
# at K rounded up to a multiple of 4 x 128 = 512 (zero weight in a real stack; random here), the `pad` column.
SCALE_LD_ALIGN = 4


def needs_k_pad(N: int, K: int, recipe: str = OP_RECIPE) -> bool:
    return recipe == "1x128-128x128" and -(-N // BLOCK) > 1 and (-(-K // BLOCK)) % SCALE_LD_ALIGN != 0


def _padded(M: int, N: int, K: int, recipe: str = OP_RECIPE) -> tuple[int, int, int]:
    if needs_k_pad(N, K, recipe):
        return M, N, _ceil(K, BLOCK * SCALE_LD_ALIGN)
    return M, _ceil(N), _ceil(K)


def time_gemm(M: int, N: int, K: int, recipe: str = OP_RECIPE, pad: bool = False):
    """(timing, extras) of one fp8 GEMM shape, checked on its first operand set; `pad`: run it at N and K
    rounded up to whole 128-blocks (what a stack that pads does), recorded in the `pad` column."""
    dev = _device()
    m, n, k = _padded(M, N, K, recipe) if pad else (M, N, K)
    nbytes = m * k + n * k + 2 * m * n
    sets = operand_sets(nbytes, cap=16)
    call, check = gemm_operands(m, n, k, recipe, dev, seed=M + 7 * N + 13 * K)
    err = check()
    if not err < GEMM_REL_ERR:
        raise CheckFailed(f"rel_err {err:.3g} above {GEMM_REL_ERR}")
    fns = [call] + [gemm_operands(m, n, k, recipe, dev, seed=s)[0] for s in range(1, sets)]
    t, ex = time_graph(fns, budget_s=0.1)
    del fns
    if nbytes * sets > LARGE_BYTES:
        _free()
    return t, dict(ex, rel_err=f"{err:.3g}", recipe=recipe, pad=f"N{n}-K{k}" if pad else "")


def time_gemm_any(M: int, N: int, K: int, recipe: str = OP_RECIPE):
    """`time_gemm` as is, padded where cuBLAS computes wrongly (`needs_k_pad`), or padded to whole blocks where
    torch or cuBLAS refuses a partial one."""
    if needs_k_pad(N, K, recipe):
        return time_gemm(M, N, K, recipe, pad=True)
    try:
        return time_gemm(M, N, K, recipe)
    except CheckFailed:
        raise
    except Exception as err:  # noqa: BLE001 - torch or cuBLAS refused the shape: retried padded
        if N % BLOCK == 0 and K % BLOCK == 0:
            raise
        _free()
        t, ex = time_gemm(M, N, K, recipe, pad=True)
        return t, dict(ex, pad_why=_why(err)[:120])


GEMM_CHECK_SHAPES = [(1024, 4096, 7168), (2048, 7168, 2304), (384, 1536, 512), (1024, 2112, 7168),
                     (1024, 7168, 2112), (512, 7168, 448), (256, 128, 7168), (4096, 3072, 1024)]


def gemm_check(out_dir: Path, deadline: float) -> int:
    """Every recipe at GEMM_CHECK_SHAPES (unaligned N 2112 and K 2112 / 448 among them) against the fp32
    product of its e4m3 operands, over all M rows; rows say whether it ran as is."""
    w = OpWriter(out_dir, "gemm_fp8_block_check", ["M", "N", "K", "recipe"], ["rel_err"])
    n = 0
    for M, N, K in GEMM_CHECK_SHAPES:
        for recipe in RECIPES + (("1x128-128x128-padK",) if needs_k_pad(N, K) else ()):
            p = dict(M=M, N=N, K=K, recipe=recipe)
            if time.monotonic() > deadline:
                w.failed(p, "skipped: part time budget exhausted")
                continue
            try:
                k = _padded(M, N, K)[2] if recipe.endswith("-padK") else K
                err = gemm_operands(M, N, k, recipe.removesuffix("-padK"), _device(), seed=M + N + K, check_rows=M)[1]()
                ok = err < GEMM_REL_ERR
                w._write(dict(p, seconds="", status="ok" if ok else "failed", rel_err=f"{err:.3g}",
                              error="" if ok else f"rel_err {err:.3g} above {GEMM_REL_ERR}"))
                print(f"[check] gemm {M}x{N}x{K} {recipe}: rel_err {err:.2e}", flush=True)
                n += 1
            except Exception as err:  # noqa: BLE001 - an unsupported recipe or layout is the answer
                w.failed(p, err)
                print(f"[check] gemm {M}x{N}x{K} {recipe}: FAILED {_why(err)}",
                      flush=True)
    w.close()
    _free()
    return n


GEMM_TOKENS: list[int] = []  # --gemm-tokens (this run): the token counts of gemm_block, else grids.TRAIN_M
RESUME: dict[str, set] = {}  # --resume-from (this run): op -> parameter tuples already measured ok


def _todo(op: str, params: list[str], cases: list[dict]) -> list[dict]:
    done = RESUME.get(op, set())
    return [c for c in cases if tuple(str(c[k]) for k in params) not in done]


def gemm_block(out_dir: Path, deadline: float) -> int:
    w = OpWriter(out_dir, "gemm_fp8_block", ["M", "N", "K"], ["rel_err", "recipe", "pad", "pad_why"] + GRAPH_EXTRAS)
    cases = _todo("gemm_fp8_block", ["M", "N", "K"], grids.train_gemm_cases(GEMM_TOKENS or None))
    print(f"[gemm_block] {len(cases)} shapes", flush=True)
    count = [0]

    def measure(M, N, K):
        count[0] += 1
        if count[0] % 100 == 0:
            print(f"[gemm_block] {count[0]} of {len(cases)} ({M}x{N}x{K})", flush=True)
        return time_gemm_any(M, N, K)

    return _sweep(w, cases, measure, deadline)


# Same-run reference (gemm_train_reference.csv): forward, input- and weight-gradient shapes of large and small
# linears (K3 KDA q/k/v and output at TP1 / TP8, DeepSeek-V3 FFN down at TP1, q_b at TP8, Kimi-Linear FFN)
REFERENCE_SHAPES = [(4096, 36864, 7168), (16384, 36864, 7168), (4096, 7168, 1536), (16384, 7168, 1536),
                    (4096, 7168, 18432), (16384, 3072, 1536), (4096, 18432, 2304), (1024, 7168, 12288),
                    (4096, 7168, 36864), (7168, 36864, 4096), (7168, 36864, 16384), (1536, 7168, 4096),
                    (1536, 7168, 16384), (18432, 7168, 4096), (2304, 18432, 16384), (1024, 4096, 7168)]
REFERENCE_KERNELS = ("bf16", "fp8-rowwise", "fp8-1x128-128x128", "fp8-1x128-1x128")


def time_bf16(M: int, N: int, K: int):
    import torch

    dev = _device()
    sets = operand_sets(2 * (M * K + N * K + M * N), cap=16)
    fns = []
    for s in range(sets):
        g = torch.Generator(device=dev).manual_seed(s)
        a = torch.randn((M, K), generator=g, device=dev).to(torch.bfloat16)
        b = (torch.randn((N, K), generator=g, device=dev) * 0.02).to(torch.bfloat16)
        fns.append(lambda a=a, b=b: torch.mm(a, b.t()))
    t, ex = time_graph(fns, budget_s=0.1)
    del fns
    _free()
    return t, ex


def gemm_reference(out_dir: Path, deadline: float) -> int:
    w = OpWriter(out_dir, "gemm_train_reference", ["M", "N", "K", "kernel"], ["rel_err", "pad", "pad_why"]
                 + GRAPH_EXTRAS)
    n = 0
    for M, N, K in REFERENCE_SHAPES:
        line = []
        for kernel in REFERENCE_KERNELS:
            p = dict(M=M, N=N, K=K, kernel=kernel)
            if not _todo("gemm_train_reference", ["M", "N", "K", "kernel"], [p]):
                continue
            if time.monotonic() > deadline:
                w.failed(p, "skipped: part time budget exhausted")
                continue
            try:
                t, ex = time_bf16(M, N, K) if kernel == "bf16" else time_gemm_any(M, N, K, kernel[4:])
                ex.pop("recipe", None)
                w.ok(p, t, **ex)
                line.append(f"{kernel} {t.seconds * 1e6:.0f}us")
                n += 1
            except Exception as err:  # noqa: BLE001
                w.failed(p, err)
                line.append(f"{kernel} FAILED {_why(err)[:100]}")
                _free()
        if line:
            print(f"[reference] {M}x{N}x{K}: " + ", ".join(line), flush=True)
    w.close()
    return n


# ---- fp8_quant_128_t -----------------------------------------------------------------------------------

QUANT_CHECK_SHAPES = [(1024, 7168), (4096, 2304), (256, 3584), (384, 100)]
WGRAD_CHECK = (4096, 2048, 7168)  # T, D_in, D_out of the weight gradient run through the quantised operands


def quant_check(out_dir: Path, deadline: float) -> int:
    """fp8_quant_128_t: scales equal the reference's (rtol 1e-6), e4m3 codes equal but for a share of
    rounding-boundary flips (recorded), every output written (outputs poisoned with NaN first); then
    dW = X^T dY through _scaled_mm with both operands from the kernel (1x128 x 1x128) against fp32."""
    import torch

    from k3sim.calibration import dispatch_ops as d
    from k3sim.calibration.mxfp4 import rel_err

    w = OpWriter(out_dir, "quant_check", ["check", "T", "D"], ["rel_err", "mismatch"])
    dev = _device()
    n = 0
    for T, D in QUANT_CHECK_SHAPES:
        if time.monotonic() > deadline:
            break
        x = (torch.randn((T, D), device=dev) * 3).to(torch.bfloat16)
        x[128:256, 3] = 0  # an all-zero group takes the floor scale
        q = torch.full((D, T), float("nan"), device=dev).to(torch.float8_e4m3fn)
        s = torch.full((T // 128, D), float("nan"), device=dev)
        d.quant_128_t(x, q, s)
        qr, sr = d.quant_128_t_reference(x)
        written = not (q.float().isnan().any() or s.isnan().any())
        mismatch = float((q.float() != qr.float()).float().mean())
        err = rel_err(d.dequant_t(q, s), d.dequant_t(qr, sr))
        ok = written and bool(torch.allclose(s, sr, rtol=1e-6, atol=0)) and mismatch < 1e-3 and err < 1e-3
        w._write(dict(check="fp8_quant_128_t", T=T, D=D, seconds="", status="ok" if ok else "failed",
                      error="" if ok else f"written {written}, mismatch {mismatch:.3g}, rel_err {err:.3g}",
                      rel_err=f"{err:.3g}", mismatch=f"{mismatch:.3g}"))
        print(f"[check] fp8_quant_128_t T={T} D={D}: rel_err {err:.2e}, code mismatch {mismatch:.2e}", flush=True)
        n += 1
    n += _wgrad_check(w, dev)
    w.close()
    return n


def _wgrad_check(w, dev) -> int:
    import torch

    from k3sim.calibration import dispatch_ops as d
    from k3sim.calibration.mxfp4 import rel_err

    T, Din, Dout = WGRAD_CHECK
    x = torch.randn((T, Din), device=dev).to(torch.bfloat16)
    dy = torch.randn((T, Dout), device=dev).to(torch.bfloat16)
    (xq, sx), (gq, sg) = d.quant_128_t(x), d.quant_128_t(dy)
    p = dict(check="wgrad_1x128_1x128", T=T, D=Din)
    try:
        dw = torch._scaled_mm(xq, gq.t(), scale_a=sx.t(), scale_b=sg, out_dtype=torch.bfloat16)
    except Exception as err:  # noqa: BLE001
        w.failed(p, err)
        print(f"[check] wgrad through fp8_quant_128_t: FAILED {_why(err)}", flush=True)
        return 0
    same = rel_err(dw, d.dequant_t(xq, sx).t() @ d.dequant_t(gq, sg))
    full = rel_err(dw, x.float().t() @ dy.float())
    ok = same < GEMM_REL_ERR
    w._write(dict(p, seconds="", status="ok" if ok else "failed", rel_err=f"{same:.3g}",
                  error=f"against unquantised fp32: {full:.3g}", mismatch=""))
    print(f"[check] wgrad through fp8_quant_128_t: rel_err {same:.2e} (same e4m3), {full:.2e} (unquantised)",
          flush=True)
    return 1


def quant(out_dir: Path, deadline: float) -> int:
    import torch

    from k3sim.calibration import dispatch_ops as d
    from k3sim.kernels.ops import OPS

    dev = _device()
    w = OpWriter(out_dir, "fp8_quant_128_t", ["T", "D"], GRAPH_EXTRAS)
    cases = _todo("fp8_quant_128_t", ["T", "D"], [dict(T=t, D=dd) for t in grids.TRAIN_QUANT_T
                                                   for dd in grids.TRAIN_QUANT_D])

    def one(T, D, seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        x = torch.empty((T, D), device=dev, dtype=torch.bfloat16).normal_(generator=g)
        q = torch.empty((D, T), device=dev, dtype=torch.float8_e4m3fn)
        s = torch.empty((T // 128, D), device=dev)
        return lambda: d.quant_128_t(x, q, s)

    def measure(T, D):
        sets = operand_sets(OPS["fp8_quant_128_t"].bytes(dict(T=T, D=D)), cap=64)
        t, ex = time_graph([one(T, D, s) for s in range(sets)], budget_s=0.1)
        _free()
        return t, ex

    return _sweep(w, cases, measure, deadline)


# ---- fused permute / unpermute -------------------------------------------------------------------------

PERMUTE_OPS = ("moe_permute_fused", "moe_permute_fused_bwd", "moe_unpermute_fused", "moe_unpermute_fused_bwd")
PERMUTE_SELECTED: list[str] = []  # --permute-ops (this run): the permute part's ops, else PERMUTE_OPS
# The index build moe_permute_fused runs (permute_fused.INDEX_BUILDS): the faster at INDEX_CHOICE_SHAPE in
# permute_check's timing, triton-count when that part did not run
INDEX = {"method": "triton-count"}
INDEX_CHOICE_SHAPE = (16384, 8, grids.TRAIN_PERMUTE_EXPERTS)


def random_ids(T: int, topk: int, E: int, dev, g):
    """[T, topk] int32: distinct experts per token, uniform over E."""
    import torch

    return torch.rand((T, E), generator=g, device=dev).argsort(-1)[:, :topk].to(torch.int32).contiguous()


def _rows(n: int, D: int, dev, g):
    import torch

    return torch.empty((n, D), device=dev, dtype=torch.bfloat16).normal_(generator=g)


def permute_case(op: str, T: int, topk: int, D: int, dev, seed: int, E: int = grids.TRAIN_PERMUTE_EXPERTS):
    """(call, index-only call or None) of one operand set of a permute op; outputs preallocated."""
    import torch

    from k3sim.calibration import permute_fused as pf

    g = torch.Generator(device=dev).manual_seed(seed)
    ids = random_ids(T, topk, E, dev, g)
    if op == "moe_permute_fused":
        x, rows = _rows(T, D, dev, g), torch.empty((T * topk, D), device=dev, dtype=torch.bfloat16)
        method = INDEX["method"]
        return (lambda: pf.permute_fused(x, ids, E, out=rows, index=method)), \
            (lambda: pf.INDEX_BUILDS[method](ids, E))
    inv = pf.index_reference(ids, E)[0].to(torch.int32)
    rows = _rows(T * topk, D, dev, g)
    wts = torch.rand((T, topk), generator=g, device=dev)
    if op == "moe_permute_fused_bwd":
        dx = torch.empty((T, D), device=dev, dtype=torch.bfloat16)
        return (lambda: pf.permute_bwd(rows, inv, topk, out=dx)), None
    if op == "moe_unpermute_fused":
        out = torch.empty((T, D), device=dev, dtype=torch.bfloat16)
        return (lambda: pf.unpermute(rows, inv, wts, out)), None
    dy, dr = _rows(T, D, dev, g), torch.empty_like(rows)
    part = torch.empty((T * topk, -(-D // pf.BLOCK_D)), device=dev)
    return (lambda: pf.unpermute_bwd(dy, rows, inv, wts, d_rows=dr, part=part)), None


def permute_cases() -> list[dict]:
    """T x topk x D, T outermost in its coarse-first order, rows of one copy under TRAIN_PERMUTE_MAX_BYTES."""
    return [dict(T=t, topk=k, D=dd) for t in grids.TRAIN_PERMUTE_T for k in grids.TRAIN_PERMUTE_TOPK
            for dd in grids.TRAIN_PERMUTE_D if 2 * t * k * dd <= grids.TRAIN_PERMUTE_MAX_BYTES]


def permute(out_dir: Path, deadline: float) -> int:
    from k3sim.kernels.ops import OPS

    dev = _device()
    n = 0
    ops = PERMUTE_SELECTED or list(PERMUTE_OPS)
    for i, op in enumerate(ops):
        op_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(ops) - i)
        extras = (["index_seconds", "index_method"] if op == "moe_permute_fused" else []) + GRAPH_EXTRAS
        w = OpWriter(out_dir, op, ["T", "topk", "D"], extras)

        def measure(op=op, **p):
            sets = operand_sets(OPS[op].bytes(p), cap=64)
            pairs = [permute_case(op, p["T"], p["topk"], p["D"], dev, s) for s in range(sets)]
            t, ex = time_graph([c for c, _ in pairs], budget_s=0.1)
            if pairs[0][1] is not None:
                ex["index_seconds"] = time_graph([ix for _, ix in pairs], budget_s=0.1)[0].seconds
                ex["index_method"] = INDEX["method"]
            del pairs
            _free()
            return t, ex

        cases = permute_cases() if op in PERMUTE_SELECTED else _todo(op, ["T", "topk", "D"], permute_cases())
        n += _sweep(w, cases, measure, op_deadline)
    return n


PERMUTE_CHECK_CASES = [(1000, 8, 7168, 128), (4096, 16, 2048, 128), (333, 2, 3584, 8), (2048, 4, 7168, 896)]


def _nan_rows(n: int, D: int, dev):
    import torch

    return torch.full((n, D), float("nan"), device=dev, dtype=torch.bfloat16)


def _permute_errors(T: int, topk: int, D: int, E: int, dev, g) -> dict[str, float]:
    """Each kernel against its torch reference on fresh inputs, outputs poisoned with NaN first (an unwritten
    element stays NaN: rel_err inf); the index and rows must be exact (error 0)."""
    import torch

    from k3sim.calibration import dispatch_ops as dops
    from k3sim.calibration import permute_fused as pf
    from k3sim.calibration.mxfp4 import rel_err

    ids = random_ids(T, topk, E, dev, g)
    inv, perm, offs = pf.build_index(ids, E)
    ri, rp, ro = pf.index_reference(ids, E)
    exact = torch.equal(inv.long(), ri) and torch.equal(perm.long(), rp) and torch.equal(offs.long(), ro)
    x = _rows(T, D, dev, g)
    rows = pf.permute_rows(x, inv, topk, out=_nan_rows(T * topk, D, dev))
    errs = {"index": 0.0 if exact else float("inf"),
            "moe_permute_fused": 0.0 if torch.equal(rows, pf.permute_reference(x, rp, topk)) else float("inf")}
    g_rows, wts, dy = _rows(T * topk, D, dev, g), torch.rand((T, topk), generator=g, device=dev), _rows(T, D, dev, g)
    dx = pf.permute_bwd(g_rows, inv, topk, out=_nan_rows(T, D, dev))
    errs["moe_permute_fused_bwd"] = rel_err(dx, pf.permute_bwd_reference(g_rows, rp, topk))
    un = pf.unpermute(g_rows, inv, wts, _nan_rows(T, D, dev))
    errs["moe_unpermute_fused"] = rel_err(un, dops.unpermute_torch(g_rows, rp, wts))
    dr, dw = pf.unpermute_bwd(dy, g_rows, inv, wts, d_rows=_nan_rows(T * topk, D, dev))
    rr, rw = pf.unpermute_bwd_reference(dy, g_rows, inv, wts)
    errs["moe_unpermute_fused_bwd"] = rel_err(dr, rr)
    errs["moe_unpermute_fused_bwd.dw"] = rel_err(dw, rw)
    return errs


def permute_check(out_dir: Path, deadline: float) -> int:
    import torch

    w = OpWriter(out_dir, "permute_check", ["check", "T", "topk", "D", "E"], ["rel_err"])
    dev = _device()
    n = 0
    for T, topk, D, E in PERMUTE_CHECK_CASES if dev == "cuda" else [(37, 3, 300, 10)]:
        if time.monotonic() > deadline:
            break
        g = torch.Generator(device=dev).manual_seed(T + topk + E)
        for name, err in _permute_errors(T, topk, D, E, dev, g).items():
            bar = DW_REL_ERR if name.endswith(".dw") else GRAD_REL_ERR
            ok = err < bar if name not in ("index", "moe_permute_fused") else err == 0.0
            w._write(dict(check=name, T=T, topk=topk, D=D, E=E, seconds="", status="ok" if ok else "failed",
                          error="" if ok else f"rel_err {err:.3g}", rel_err=f"{err:.3g}"))
            print(f"[check] {name} T={T} topk={topk} D={D} E={E}: rel_err {err:.2e}", flush=True)
            n += 1
    w.close()
    n += _index_timing(out_dir, deadline)
    _free()
    return n


INDEX_TIMING = [(16384, 8, 8), (16384, 8, 128), (16384, 8, 1024), (65536, 16, 128), (1024, 2, 128)]


def _index_timing(out_dir: Path, deadline: float) -> int:
    """permute_index.csv: the counting-sort index build against torch's stable sort + inverse + searchsorted; the
    faster at INDEX_CHOICE_SHAPE becomes INDEX["method"]."""
    import torch

    from k3sim.calibration import permute_fused as pf

    w = OpWriter(out_dir, "permute_index", ["T", "topk", "E", "method"], GRAPH_EXTRAS)
    dev = _device()
    n = 0
    for T, topk, E in INDEX_TIMING:
        best = None
        for method, fn in pf.INDEX_BUILDS.items():
            p = dict(T=T, topk=topk, E=E, method=method)
            if time.monotonic() > deadline:
                w.failed(p, "skipped: part time budget exhausted")
                continue
            try:
                ids = [random_ids(T, topk, E, dev, torch.Generator(device=dev).manual_seed(s)) for s in range(8)]
                t, ex = time_graph([lambda i=i: fn(i, E) for i in ids], budget_s=0.1)
                w.ok(p, t, **ex)
                print(f"[index] T={T} topk={topk} E={E} {method}: {t.seconds * 1e6:.1f}us", flush=True)
                n += 1
                if best is None or t.seconds < best[1]:
                    best = (method, t.seconds)
            except Exception as err:  # noqa: BLE001
                w.failed(p, err)
                print(f"[index] T={T} topk={topk} E={E} {method}: FAILED {_why(err)}", flush=True)
        if (T, topk, E) == INDEX_CHOICE_SHAPE and best is not None:
            INDEX["method"] = best[0]
            print(f"[index] moe_permute_fused builds its index by {best[0]}", flush=True)
    w.close()
    return n


# ---- driver --------------------------------------------------------------------------------------------

PARTS = ["gemm_check", "permute_check", "quant_check", "permute", "quant", "gemm_reference", "gemm_block"]
# Time boxes (seconds) of a full run; gemm_block's ~1,250 shapes at ~0.15 s each
PART_BUDGETS = {"gemm_check": 20, "permute_check": 30, "quant_check": 15, "permute": 90, "quant": 25,
                "gemm_reference": 30, "gemm_block": 300}
_PART_FUNCS = {"gemm_check": gemm_check, "permute_check": permute_check, "quant_check": quant_check,
               "permute": permute, "quant": quant, "gemm_reference": gemm_reference, "gemm_block": gemm_block}
OP_PARAMS = {"gemm_fp8_block": ["M", "N", "K"], "fp8_quant_128_t": ["T", "D"],
             "gemm_train_reference": ["M", "N", "K", "kernel"], **{op: ["T", "topk", "D"] for op in PERMUTE_OPS}}


def select_parts(text: str) -> list[str]:
    """'--parts a,b' -> the parts in the order given; an unknown one is one line of bad input."""
    from k3sim.errors import InputError

    parts = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise InputError(f"unknown part(s) {bad or [text]}; choose from {PARTS}", source="--parts")
    return parts


def select_permute_ops(text: str) -> list[str]:
    """'--permute-ops a,b' -> those ops ([] = all); an unknown one is one line of bad input."""
    from k3sim.errors import InputError

    ops = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in ops if p not in PERMUTE_OPS]
    if bad:
        raise InputError(f"unknown op(s) {bad}; choose from {list(PERMUTE_OPS)}", source="--permute-ops")
    return ops


def read_done(run_dir: Path) -> dict[str, set]:
    """op -> parameter tuples (as text) with an ok row in an earlier run's CSVs (--resume-from): measured already."""
    from k3sim.calibration.records import read_done as done_rows

    return done_rows(run_dir, OP_PARAMS)


def run(out_dir: Path, parts: list[str], budget_s: float, budgets: dict[str, float]) -> None:
    from k3sim.calibration.graph_parts import run_parts

    run_parts("train_fp8", out_dir, parts, budget_s,
              lambda part, left, i: budgets.get(part, PART_BUDGETS.get(part, left / (len(parts) - i))),
              lambda part, d, deadline: _PART_FUNCS[part](d, deadline), free=True)


def main(argv: list[str] | None = None) -> None:
    from k3sim.calibration.runner import _budgets, _int_list
    from k3sim.errors import InputError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--budget-s", type=float, default=float(sum(PART_BUDGETS.values())))
    ap.add_argument("--part-budgets", default="", help="e.g. gemm_block=200,permute=60 (defaults: PART_BUDGETS)")
    ap.add_argument("--gemm-tokens", default="", help="gemm_block's token counts instead of grids.TRAIN_M")
    ap.add_argument("--permute-ops", default="", help=f"the permute part's ops (default: all of {PERMUTE_OPS}); "
                    "those named are measured again whatever --resume-from says")
    ap.add_argument("--resume-from", type=Path, default=None,
                    help="an earlier run directory: shapes it measured ok are not measured again")
    a = ap.parse_args(argv)
    try:
        parts = select_parts(a.parts)
        if not 0 < a.budget_s < float("inf"):
            raise InputError(f"must be a positive number of seconds, got {a.budget_s}", source="--budget-s")
        budgets = _budgets(a.part_budgets)
        unknown = sorted(set(budgets) - set(parts))
        if unknown:
            raise InputError(f"budgets given for parts not run: {unknown}", source="--part-budgets")
        GEMM_TOKENS[:] = _int_list(a.gemm_tokens, "--gemm-tokens")
        PERMUTE_SELECTED[:] = select_permute_ops(a.permute_ops)
        if a.resume_from is not None:
            RESUME.update(read_done(a.resume_from))
        run(a.out, parts, a.budget_s, budgets)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
