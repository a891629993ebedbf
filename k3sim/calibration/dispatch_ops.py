"""The kernels around an expert-parallel dispatch and combine, as plain torch plus one Triton kernel.

Wide-EP deployments (DeepSeek-V3's inference system, SGLang / vLLM with DeepEP) send FP8 tokens with one
fp32 scale per 128 channels (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.3.2: activations
quantised per 1x128 tile; DeepEP's FP8 dispatch takes exactly that layout), receive them token by token,
permute the (token, local expert) pairs into expert-contiguous rows for the grouped GEMMs, and after the
experts sum each token's weighted expert outputs back into one row (the unpermute) before the combine
sends it home. Op names and parameters (`k3sim/kernels/ops_decode.py`):
- `fp8_quant_128` (T, D): bf16 [T, D] -> e4m3 [T, D] + fp32 scales [T, D/128] (amax / 448 per group);
- `ep_permute` (T, topk, D): each of T tokens to `topk` local experts; rows sorted by expert and gathered
  (bf16 [T topk, D]);
- `ep_unpermute` (T, topk, D): expert-sorted bf16 rows [T topk, D] weighted by their routing weights and
  summed per token (fp32 accumulate) -> bf16 [T, D]: one Triton kernel that gathers each token's picks
  through the permute's inverse (as SGLang's and vLLM's fused unpermute kernels do), not torch's scatter.
The permute and unpermute are what `graph_parts._grouped_ffn_*` do (in plain torch) inside `moe_ffn_grouped_*` (that op
includes them); measured alone they price a stack that runs them as separate kernels.
"""

from __future__ import annotations

FP8_MAX = 448.0  # largest finite float8_e4m3fn
GROUP = 128  # channels per scale (DeepSeek-V3 1x128 activation tiles)
SCALE_FLOOR = 1e-10  # an all-zero group gets this scale (no division by zero); harness choice


def permute(x, ids):
    """x [T, D], ids [T, topk] (local expert of each pick) -> (rows [T topk, D] sorted by expert, perm, inv).

    perm[i] = flat pick index of sorted row i (token perm // topk); inv[f] = sorted row of pick f (the
    unpermute gathers through it); a stable sort keeps token order inside an expert, as the grouped GEMM's
    contiguous layout wants."""
    import torch

    topk = ids.shape[1]
    _, perm = torch.sort(ids.reshape(-1), stable=True)
    inv = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))
    return x.index_select(0, perm // topk), perm, inv


def unpermute_torch(rows, perm, weights):
    """rows [T topk, D] in expert order, perm from `permute`, weights [T, topk] -> [T, D] (bf16):
    sum over a token's picks of weight x row, accumulated in fp32; plain torch (index_copy_, the reference of
    `unpermute`; measured on the H200 at ~0.22 TB/s of minimal traffic, run 20261202-1gpu-deployed)."""
    import torch

    T, topk = weights.shape
    w = weights.reshape(-1).float().index_select(0, perm)
    out = torch.empty((T * topk, rows.shape[1]), dtype=torch.float32, device=rows.device)
    out.index_copy_(0, perm, rows.float() * w[:, None])
    return out.view(T, topk, -1).sum(1).to(rows.dtype)


def quant_reference(x):
    """Per-(token, 128-channel group) e4m3 quantisation in torch: (q [T, D] e4m3, scales [T, D/128] fp32)
    with scale = max(amax / 448, SCALE_FLOOR) and q = x / scale (dequantised: q x scale)."""
    import torch

    T, D = x.shape
    g = x.float().view(T, D // GROUP, GROUP)
    s = (g.abs().amax(-1) / FP8_MAX).clamp_min(SCALE_FLOOR)
    return (g / s[..., None]).view(T, D).to(torch.float8_e4m3fn), s


def dequant(q, s):
    T, D = q.shape
    return (q.float().view(T, D // GROUP, GROUP) * s[..., None]).view(T, D)


def interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


try:  # the kernel needs triton; the torch functions above run without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:
    @triton.jit
    def _quant_kernel(x_ptr, q_ptr, s_ptr, D, G, s_x, s_q, s_s, fp8_max, floor,
                      GROUPS: tl.constexpr, GS: tl.constexpr):
        # one program: GROUPS consecutive 128-channel groups of one token row
        t = tl.program_id(0).to(tl.int64)
        g0 = tl.program_id(1) * GROUPS
        rg = g0 + tl.arange(0, GROUPS)
        rc = tl.arange(0, GS)
        g_mask = rg < G
        cols = rg[:, None] * GS + rc[None, :]
        x = tl.load(x_ptr + t * s_x + cols, mask=g_mask[:, None], other=0.0).to(tl.float32)
        s = tl.maximum(tl.max(tl.abs(x), 1) / fp8_max, floor)
        q = x / s[:, None]
        tl.store(q_ptr + t * s_q + cols, q.to(q_ptr.dtype.element_ty), mask=g_mask[:, None])
        tl.store(s_ptr + t * s_s + rg, s, mask=g_mask)


    @triton.jit
    def _quant_t_kernel(x_ptr, q_ptr, s_ptr, D, s_x, s_q, s_s, fp8_max, floor, GS: tl.constexpr,
                        BLOCK_D: tl.constexpr):
        # one program: one 128-row group of tokens x BLOCK_D channels; one scale per channel, stored transposed
        g = tl.program_id(0)
        rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        rt = (g * GS + tl.arange(0, GS)).to(tl.int64)
        dm = rd < D
        x = tl.load(x_ptr + rt[:, None] * s_x + rd[None, :], mask=dm[None, :], other=0.0).to(tl.float32)
        s = tl.maximum(tl.max(tl.abs(x), 0) / fp8_max, floor)
        q = tl.trans(x / s[None, :])
        tl.store(q_ptr + rd[:, None].to(tl.int64) * s_q + rt[None, :], q.to(q_ptr.dtype.element_ty),
                 mask=dm[:, None])
        tl.store(s_ptr + g * s_s + rd, s, mask=dm)


    @triton.jit
    def _unpermute_kernel(rows_ptr, inv_ptr, w_ptr, out_ptr, D, topk, s_r, s_o, BLOCK_D: tl.constexpr):
        # one program: BLOCK_D channels of one token, its picks gathered through inv (no scatter, no fp32 copy)
        t = tl.program_id(0).to(tl.int64)
        rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_mask = rd < D
        acc = tl.zeros((BLOCK_D,), tl.float32)
        for j in range(0, topk):
            pos = tl.load(inv_ptr + t * topk + j).to(tl.int64)
            w = tl.load(w_ptr + t * topk + j).to(tl.float32)
            acc += w * tl.load(rows_ptr + pos * s_r + rd, mask=d_mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * s_o + rd, acc.to(out_ptr.dtype.element_ty), mask=d_mask)


UNPERMUTE_BLOCK_D = 1024  # kernel choice: 2 KB of bf16 per program and pick
QUANT_GROUPS = 8  # kernel choice: 8 groups (1024 channels, 2 KB of bf16) per program


def unpermute(rows, inv, weights, out=None, block_d: int = UNPERMUTE_BLOCK_D):
    """The Triton unpermute (one kernel, capturable): rows [T topk, D] in expert order, inv from `permute`,
    weights [T, topk] (fp32) -> [T, D] bf16, each token's picks summed in fp32 (= `unpermute_torch`)."""
    import torch

    if triton is None:
        raise RuntimeError("the unpermute kernel needs triton")
    T, topk = weights.shape
    D = rows.shape[1]
    assert rows.stride(-1) == 1 and weights.is_contiguous() and inv.is_contiguous()
    o = out if out is not None else torch.empty((T, D), dtype=rows.dtype, device=rows.device)
    _unpermute_kernel[(T, triton.cdiv(D, block_d))](rows, inv, weights, o, D, topk, rows.stride(0), o.stride(0),
                                                    BLOCK_D=block_d, num_warps=4)
    return o


def quant_128(x, out=None, scales=None, groups: int = QUANT_GROUPS):
    """The Triton form of `quant_reference` (one kernel, capturable): x [T, D] bf16, D a multiple of 128.
    `out` / `scales` are reused when given (a captured graph writes into fixed buffers)."""
    import torch

    if triton is None:
        raise RuntimeError("the fp8 quantisation kernel needs triton")
    T, D = x.shape
    assert D % GROUP == 0 and x.stride(-1) == 1
    G = D // GROUP
    q = out if out is not None else torch.empty((T, D), dtype=torch.float8_e4m3fn, device=x.device)
    s = scales if scales is not None else torch.empty((T, G), dtype=torch.float32, device=x.device)
    # Triton's CPU interpreter rounds fp32 -> e4m3 wrongly (triton 3.9: 124.3 -> 64, ties away from even):
    # there the kernel writes the scaled values in fp32 and torch rounds them (the GPU check covers the cast)
    qk = torch.empty((T, D), dtype=torch.float32, device=x.device) if interpreted() else q
    _quant_kernel[(T, triton.cdiv(G, groups))](x, qk, s, D, G, x.stride(0), qk.stride(0), s.stride(0), FP8_MAX,
                                               SCALE_FLOOR, GROUPS=groups, GS=GROUP, num_warps=4)
    if qk is not q:
        q.copy_(qk.to(torch.float8_e4m3fn))
    return q, s


QUANT_T_BLOCK_D = 64  # kernel choice: a [128, 64] tile (16 KB of bf16) per program


def quant_128_t_reference(x):
    """bf16 x [T, D] quantised in 128-token groups along T, one scale per (group, channel): (q [D, T] e4m3, the
    transpose of x / scale; scales [T/128, D] fp32, amax / 448 floored at SCALE_FLOOR). The operand a weight
    gradient dW = X^T dY reads with 1x128 scales along its reduction (the tokens): DeepSeek-V3 sec. 3.3.1
    quantises the activations of the backward this way; scales [T/128, D] are the [D, T/128] scale matrix in
    the outer-dim-major layout torch._scaled_mm takes for 1x128 blocks."""
    import torch

    T, D = x.shape
    g = x.float().view(T // GROUP, GROUP, D)
    s = (g.abs().amax(1) / FP8_MAX).clamp_min(SCALE_FLOOR)
    return (g / s[:, None, :]).view(T, D).t().contiguous().to(torch.float8_e4m3fn), s


def dequant_t(q, s):
    """[D, T] e4m3 and [T/128, D] scales -> x [T, D] fp32 (the inverse of `quant_128_t_reference`)."""
    D, T = q.shape
    return (q.float().t().reshape(T // GROUP, GROUP, D) * s[:, None, :]).reshape(T, D)


def quant_128_t(x, out=None, scales=None, block_d: int = QUANT_T_BLOCK_D):
    """The Triton form of `quant_128_t_reference` (one kernel, capturable): x [T, D] bf16, T a multiple of 128."""
    import torch

    if triton is None:
        raise RuntimeError("the fp8 quantisation kernel needs triton")
    T, D = x.shape
    assert T % GROUP == 0 and x.stride(-1) == 1
    q = out if out is not None else torch.empty((D, T), dtype=torch.float8_e4m3fn, device=x.device)
    s = scales if scales is not None else torch.empty((T // GROUP, D), dtype=torch.float32, device=x.device)
    qk = torch.empty((D, T), dtype=torch.float32, device=x.device) if interpreted() else q  # as quant_128
    _quant_t_kernel[(T // GROUP, triton.cdiv(D, block_d))](x, qk, s, D, x.stride(0), qk.stride(0), s.stride(0),
                                                           FP8_MAX, SCALE_FLOOR, GS=GROUP, BLOCK_D=block_d,
                                                           num_warps=4)
    if qk is not q:
        q.copy_(qk.to(torch.float8_e4m3fn))
    return q, s
