"""Fused MoE permute / unpermute and their backwards for training: our own Triton kernels (issue 22 item 6).

Why: a training MoE layer sorts its (token, local expert) picks into expert-contiguous rows before the grouped
GEMMs and sums them back after; the backward runs both the other way. Stacks with fused permutation (K3's
MoonEP; Megatron-Core's `moe_permute_fusion`) do each direction as a few fused kernels instead of torch's
sort / index_select / scatter chains, whose cost the glue factors of `step/glue.py` stand in for. These kernels
price that fused path. Op names and parameters (`k3sim/kernels/ops_decode.py`), T tokens, topk local picks
per token, D channels, bf16 activations:
- `moe_permute_fused`: the index build (a stable counting sort of the T topk picks by expert: one Triton
  kernel histograms each block of 128 picks, torch cumulative sums turn the histograms into each block's
  first row per expert, a second Triton kernel ranks every pick inside its block) and one gather kernel
  that reads each token row once and writes its topk copies into expert order;
- `moe_permute_fused_bwd`: dx[t] = sum_j d_rows[inv[t, j]], fp32 accumulation (one kernel);
- `moe_unpermute_fused`: out[t] = sum_j w[t, j] rows[inv[t, j]] (`dispatch_ops.unpermute`, the Triton
  kernel of issue 21);
- `moe_unpermute_fused_bwd`: d_rows[inv[t, j]] = w[t, j] dy[t] and the routing-weight gradient
  dw[t, j] = <rows[inv[t, j]], dy[t]> (one kernel writing per-block partial dots, summed by torch).
`inv[t topk + j]` is the expert-ordered row of pick j of token t; `perm` its inverse (row -> pick), as
`dispatch_ops.permute` returns them. The torch functions `*_reference` are the checks.
"""

from __future__ import annotations

from k3sim.calibration.dispatch_ops import unpermute  # noqa: F401 - the op moe_unpermute_fused

INDEX_BLOCK = 128  # picks per program of the index kernels (kernel choice: a [128, 128] rank comparison)
E_CHUNK = 128  # experts the histogram compares at a time (kernel choice: [128, 128] like the rank)
BLOCK_D = 1024  # channels per program of the row kernels (kernel choice: 2 KB of bf16 per pick, as unpermute)

try:  # the kernels need triton; the references run without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:
    @triton.jit
    def _count_kernel(ids_ptr, counts_ptr, P, nb, BLOCK: tl.constexpr, E_PAD: tl.constexpr, E_CHUNK: tl.constexpr):
        # counts[e, b]: picks of block b routed to expert e, E_CHUNK experts at a time (a [BLOCK, E_CHUNK] compare);
        # expert-major, so one flat prefix sum gives every (expert, block) its first row
        b = tl.program_id(0)
        f = b * BLOCK + tl.arange(0, BLOCK)
        m = f < P
        e = tl.load(ids_ptr + f, mask=m, other=-1)
        for e0 in tl.static_range(0, E_PAD, E_CHUNK):
            ex = e0 + tl.arange(0, E_CHUNK)
            hit = e[:, None] == ex[None, :]
            tl.store(counts_ptr + ex * nb + b, tl.sum(hit.to(tl.int32), 0))

    @triton.jit
    def _rank_kernel(ids_ptr, base_ptr, inv_ptr, perm_ptr, P, nb, BLOCK: tl.constexpr):
        # row of pick f = first row of its expert in this block (base) + picks of that expert before it in the block
        b = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        f = b * BLOCK + i
        m = f < P
        e = tl.load(ids_ptr + f, mask=m, other=-1)
        before = (e[:, None] == e[None, :]) & (i[None, :] < i[:, None])
        rank = tl.sum(before.to(tl.int32), 1)
        dest = tl.load(base_ptr + e * nb + b, mask=m, other=0) + rank
        tl.store(inv_ptr + f, dest, mask=m)
        tl.store(perm_ptr + dest, f, mask=m)

    @triton.jit
    def _permute_kernel(x_ptr, inv_ptr, rows_ptr, D, topk, s_x, s_r, BLOCK_D: tl.constexpr):
        # one program: BLOCK_D channels of one token, read once and written to each of its topk rows
        t = tl.program_id(0).to(tl.int64)
        rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        dm = rd < D
        x = tl.load(x_ptr + t * s_x + rd, mask=dm, other=0.0)
        for j in range(0, topk):
            dest = tl.load(inv_ptr + t * topk + j).to(tl.int64)
            tl.store(rows_ptr + dest * s_r + rd, x, mask=dm)

    @triton.jit
    def _gather_sum_kernel(g_ptr, inv_ptr, out_ptr, D, topk, s_g, s_o, BLOCK_D: tl.constexpr):
        # the permute's backward: a token's topk row gradients summed in fp32
        t = tl.program_id(0).to(tl.int64)
        rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        dm = rd < D
        acc = tl.zeros((BLOCK_D,), tl.float32)
        for j in range(0, topk):
            pos = tl.load(inv_ptr + t * topk + j).to(tl.int64)
            acc += tl.load(g_ptr + pos * s_g + rd, mask=dm, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * s_o + rd, acc.to(out_ptr.dtype.element_ty), mask=dm)

    @triton.jit
    def _unpermute_bwd_kernel(dy_ptr, rows_ptr, inv_ptr, w_ptr, drows_ptr, part_ptr, D, topk, nblk, s_dy, s_r,
                              s_dr, BLOCK_D: tl.constexpr):
        # the unpermute's backward over BLOCK_D channels of one token: each pick's row gradient w dy, and its
        # partial routing-weight gradient <row, dy> over these channels (part[f, block])
        t = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
        rd = blk * BLOCK_D + tl.arange(0, BLOCK_D)
        dm = rd < D
        dy = tl.load(dy_ptr + t * s_dy + rd, mask=dm, other=0.0).to(tl.float32)
        for j in range(0, topk):
            f = t * topk + j
            pos = tl.load(inv_ptr + f).to(tl.int64)
            w = tl.load(w_ptr + f).to(tl.float32)
            r = tl.load(rows_ptr + pos * s_r + rd, mask=dm, other=0.0).to(tl.float32)
            tl.store(drows_ptr + pos * s_dr + rd, (w * dy).to(drows_ptr.dtype.element_ty), mask=dm)
            tl.store(part_ptr + f * nblk + blk, tl.sum(r * dy, 0))


def _need_triton() -> None:
    if triton is None:
        raise RuntimeError("the fused permute kernels need triton")


def _e_pad(num_experts: int) -> int:
    return max(16, triton.next_power_of_2(num_experts))


def build_index(ids, num_experts: int):
    """ids [T, topk] int32 local experts -> (inv [T topk] int32: row of each pick, perm [T topk] int32: pick of
    each row, offsets [E + 1] int32: first row of each expert, then T topk), rows sorted stably by expert (= torch.sort
    stable of the flat ids, `index_reference`). Capturable: no host synchronisation."""
    import torch

    _need_triton()
    flat = ids.reshape(-1)
    assert flat.dtype == torch.int32 and flat.is_contiguous()
    P, e_pad = flat.numel(), _e_pad(num_experts)
    nb = triton.cdiv(P, INDEX_BLOCK)
    counts = torch.empty(e_pad * nb, dtype=torch.int32, device=ids.device)
    _count_kernel[(nb,)](flat, counts, P, nb, BLOCK=INDEX_BLOCK, E_PAD=e_pad, E_CHUNK=min(e_pad, E_CHUNK),
                         num_warps=4)
    # expert-major exclusive prefix sum: row of the first pick of expert e in block b (picks of experts < e,
    # then of expert e in blocks < b)
    base = torch.cumsum(counts, 0, dtype=torch.int32) - counts
    inv = torch.empty(P, dtype=torch.int32, device=ids.device)
    perm = torch.empty(P, dtype=torch.int32, device=ids.device)
    _rank_kernel[(nb,)](flat, base, inv, perm, P, nb, BLOCK=INDEX_BLOCK, num_warps=4)
    offsets = torch.cat([base.view(e_pad, nb)[:num_experts, 0], base.new_full((1,), P)])
    return inv, perm, offsets


def permute_rows(x, inv, topk: int, out=None, block_d: int = BLOCK_D):
    """x [T, D] -> rows [T topk, D] with rows[inv[t topk + j]] = x[t] (one kernel)."""
    import torch

    _need_triton()
    T, D = x.shape
    assert x.stride(-1) == 1 and inv.is_contiguous() and inv.numel() == T * topk
    rows = out if out is not None else torch.empty((T * topk, D), dtype=x.dtype, device=x.device)
    _permute_kernel[(T, triton.cdiv(D, block_d))](x, inv, rows, D, topk, x.stride(0), rows.stride(0),
                                                  BLOCK_D=block_d, num_warps=4)
    return rows


def build_index_sorted(ids, num_experts: int):
    """`build_index` by torch's stable radix sort (`index_reference`, int32 out): the alternative index build."""
    import torch

    return tuple(t.to(torch.int32) for t in index_reference(ids, num_experts))


INDEX_BUILDS = {"triton-count": build_index, "torch-sort": build_index_sorted}


def permute_fused(x, ids, num_experts: int, out=None, index: str = "triton-count"):
    """The op `moe_permute_fused`: (rows in expert order, inv, perm, offsets) from x [T, D] and ids [T, topk],
    the index built by `INDEX_BUILDS[index]`."""
    inv, perm, offsets = INDEX_BUILDS[index](ids, num_experts)
    return permute_rows(x, inv, ids.shape[1], out), inv, perm, offsets


def permute_bwd(d_rows, inv, topk: int, out=None, block_d: int = BLOCK_D):
    """The op `moe_permute_fused_bwd`: d_rows [T topk, D] -> dx [T, D], dx[t] = sum_j d_rows[inv[t topk + j]]."""
    import torch

    _need_triton()
    D = d_rows.shape[1]
    T = inv.numel() // topk
    assert d_rows.stride(-1) == 1 and inv.is_contiguous()
    dx = out if out is not None else torch.empty((T, D), dtype=d_rows.dtype, device=d_rows.device)
    _gather_sum_kernel[(T, triton.cdiv(D, block_d))](d_rows, inv, dx, D, topk, d_rows.stride(0), dx.stride(0),
                                                     BLOCK_D=block_d, num_warps=4)
    return dx


def unpermute_bwd(dy, rows, inv, weights, d_rows=None, part=None, block_d: int = BLOCK_D):
    """The op `moe_unpermute_fused_bwd`: dy [T, D], the forward's expert-ordered rows [T topk, D], inv, weights
    [T, topk] fp32 -> (d_rows [T topk, D] bf16, dw [T, topk] fp32)."""
    import torch

    _need_triton()
    T, topk = weights.shape
    D = dy.shape[1]
    assert dy.stride(-1) == 1 and rows.stride(-1) == 1 and weights.is_contiguous() and inv.is_contiguous()
    nblk = triton.cdiv(D, block_d)
    dr = d_rows if d_rows is not None else torch.empty_like(rows)
    pt = part if part is not None else torch.empty((T * topk, nblk), dtype=torch.float32, device=dy.device)
    _unpermute_bwd_kernel[(T, nblk)](dy, rows, inv, weights, dr, pt, D, topk, nblk, dy.stride(0), rows.stride(0),
                                     dr.stride(0), BLOCK_D=block_d, num_warps=4)
    return dr, pt.sum(1).view(T, topk)


# ---- torch references -----------------------------------------------------------------------------------

def index_reference(ids, num_experts: int):
    """(inv, perm, offsets) of `build_index` by torch: a stable sort of the flat ids, its inverse, and the first
    row of each expert by binary search in the sorted ids."""
    import torch

    flat = ids.reshape(-1).long()
    keys, perm = torch.sort(flat, stable=True)
    inv = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))
    offsets = torch.searchsorted(keys, torch.arange(num_experts + 1, device=ids.device))
    return inv, perm, offsets


def permute_reference(x, perm, topk: int):
    """rows [T topk, D] = x[perm // topk] (row r holds the token of pick perm[r])."""
    return x.index_select(0, perm.long() // topk)


def permute_bwd_reference(d_rows, perm, topk: int):
    """dx = the autograd of `permute_reference`: each row's gradient added to its token, in fp32."""
    import torch

    T = d_rows.shape[0] // topk
    dx = torch.zeros((T, d_rows.shape[1]), dtype=torch.float32, device=d_rows.device)
    return dx.index_add_(0, perm.long() // topk, d_rows.float())


def unpermute_bwd_reference(dy, rows, inv, weights):
    """(d_rows, dw) of out[t] = sum_j w[t, j] rows[inv[t, j]] in fp32 by torch autograd."""
    T, topk = weights.shape
    r = rows.float().requires_grad_(True)
    w = weights.float().clone().requires_grad_(True)
    out = (w[..., None] * r.index_select(0, inv.long()).view(T, topk, -1)).sum(1)
    out.backward(dy.float())
    return r.grad, w.grad
