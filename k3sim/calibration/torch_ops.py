"""Dense GEMM, HBM streaming, grouped MoE GEMM and causal SDPA on one GPU."""

from __future__ import annotations

import time
from pathlib import Path

from k3sim.calibration import grids
from k3sim.calibration.records import OpWriter
from k3sim.calibration.timing import time_cuda


def sweep(writer: OpWriter, cases: list[dict], measure, deadline: float) -> int:
    """Measure every case until the deadline; a failing case is recorded and the sweep goes on."""
    import torch

    done = 0
    for params in cases:
        if time.monotonic() > deadline:
            writer.failed(params, "skipped: part time budget exhausted")
            continue
        try:
            timing, extras = measure(**params)
            writer.ok(params, timing, **extras)
            done += 1
        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
            writer.failed(params, err)
            torch.cuda.empty_cache()
    writer.close()
    return done


def _rand(shape, dtype):
    import torch

    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype) if dtype != torch.float32 \
        else torch.randn(shape, device="cuda")


def gemm_bf16(out_dir: Path, deadline: float) -> int:
    import torch

    w = OpWriter(out_dir, "gemm_bf16", ["M", "N", "K"])

    def measure(M, N, K):
        a = _rand((M, K), torch.bfloat16)
        b = _rand((K, N), torch.bfloat16)
        return time_cuda(lambda: a @ b), {}

    cases = [dict(M=m, N=n, K=k) for (n, k) in grids.GEMM_NK for m in grids.GEMM_M]
    return sweep(w, cases, measure, deadline)


def gemm_fp8(out_dir: Path, deadline: float) -> int:
    """FP8 e4m3 GEMM with per-tensor scales through torch._scaled_mm (cuBLASLt), bf16 output."""
    import torch

    w = OpWriter(out_dir, "gemm_fp8", ["M", "N", "K"])
    one = torch.ones((), device="cuda")

    def measure(M, N, K):
        a = _rand((M, K), torch.bfloat16).to(torch.float8_e4m3fn)
        b = _rand((N, K), torch.bfloat16).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt needs
        return time_cuda(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), {}

    cases = [dict(M=m, N=n, K=k) for (n, k) in grids.GEMM_NK for m in grids.GEMM_M if m >= 16]
    return sweep(w, cases, measure, deadline)


def hbm(out_dir: Path, deadline: float) -> int:
    import torch

    wc = OpWriter(out_dir, "hbm_copy", ["bytes"])
    wr = OpWriter(out_dir, "hbm_read", ["bytes"])

    def copy(bytes):  # noqa: A002 - the column name
        src = torch.empty(bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        return time_cuda(lambda: dst.copy_(src), flush=bytes < 2 ** 30), {}

    def read(bytes):  # noqa: A002
        x = torch.empty(bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        return time_cuda(lambda: torch.amax(x), flush=bytes < 2 ** 30), {}

    sizes = sorted(grids.HBM_BYTES)
    n = sweep(wc, [dict(bytes=b) for b in sizes], copy, deadline)
    return n + sweep(wr, [dict(bytes=b) for b in sizes], read, deadline)


def moe_grouped_bf16(out_dir: Path, deadline: float) -> int:
    """Routed-expert GEMM of one step: B tokens, top-k of E experts each (uniform random routing),
    tokens sorted by expert, one torch._grouped_mm over all E groups (empty groups included).
    Routing and permutation are not timed; `distinct_experts` records how many groups had tokens."""
    import torch

    w = OpWriter(out_dir, "moe_grouped_bf16", ["B", "E", "K", "N", "topk"], ["distinct_experts"])
    weights: dict = {}

    def measure(B, E, K, N, topk):
        key = (E, K, N)
        if key not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[key] = torch.empty((E, N, K), device="cuda", dtype=torch.bfloat16).normal_().transpose(-2, -1)
        wt = weights[key]
        g = torch.Generator(device="cuda").manual_seed(B * 131 + E)
        scores = torch.rand((B, E), device="cuda", generator=g)
        expert_of = scores.topk(topk, dim=-1).indices.reshape(-1)
        counts = torch.bincount(expert_of, minlength=E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        x = _rand((B * topk, K), torch.bfloat16)
        t = time_cuda(lambda: torch._grouped_mm(x, wt, offs=offs, out_dtype=torch.bfloat16))
        return t, {"distinct_experts": int((counts > 0).sum().item())}

    cases = [dict(B=b, E=e, K=k, N=n, topk=tk) for (e, tk, k, n) in grids.MOE_CONFIGS for b in grids.MOE_B]
    return sweep(w, cases, measure, deadline)


def sdpa(out_dir: Path, deadline: float) -> int:
    """Causal scaled-dot-product attention (PyTorch SDPA, flash backend where it applies), bf16, B=1."""
    import torch
    import torch.nn.functional as F

    wf = OpWriter(out_dir, "sdpa_causal_fwd", ["T", "H", "D"], ["backend"])
    wb = OpWriter(out_dir, "sdpa_causal_fwd_bwd", ["T", "H", "D"], ["backend"])

    def tensors(T, H, D, grad):
        return [torch.randn((1, H, T, D), device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3)]

    def fwd(T, H, D):
        q, k, v = tensors(T, H, D, False)
        with torch.no_grad():
            return time_cuda(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), budget_s=2.0), {"backend": "sdpa-auto"}

    def fwd_bwd(T, H, D):
        q, k, v = tensors(T, H, D, True)
        do = torch.randn_like(q)

        def step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)

        def reset():
            q.grad = k.grad = v.grad = None

        return time_cuda(step, before_each=reset, budget_s=2.0), {"backend": "sdpa-auto"}

    cases = [dict(T=t, H=h, D=d) for d in grids.SDPA_D for h in grids.SDPA_H for t in grids.SDPA_T]
    n = sweep(wf, cases, fwd, deadline)
    return n + sweep(wb, cases, fwd_bwd, deadline)


def flop_rate_check() -> float:
    """One 8192^3 bf16 product: the achieved TFLOP/s ceiling recorded in the provenance."""
    import torch

    a = _rand((8192, 8192), torch.bfloat16)
    b = _rand((8192, 8192), torch.bfloat16)
    t = time_cuda(lambda: a @ b, reps=10)
    return 2 * 8192 ** 3 / t.seconds / 1e12


__all__ = ["gemm_bf16", "gemm_fp8", "hbm", "moe_grouped_bf16", "sdpa", "flop_rate_check", "sweep"]
