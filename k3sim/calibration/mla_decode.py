"""MLA decode attention in the absorbed form, as K3 and DeepSeek-style engines decode: a split-K
(flash-decoding) Triton kernel plus a naive torch reference.

Absorbed MLA (DeepSeek-V2, arXiv 2405.04434, sec. 2.1.3; FlashMLA): the key/value up-projections are
folded into the query and output projections, so each head's query is a 512-element latent part plus
a 64-element RoPE part, and it attends directly to the cached latent [c_kv (512) | k_rope (64)] of
every position; values are the first 512 elements of the same cache row. One cache row serves all
heads, so a program handles a tile of heads and reads each cache row once per tile.

Softmax scale 1/sqrt(qk_nope_head_dim + qk_rope_head_dim) = 1/sqrt(192) (the un-absorbed head dims
of K3's MLA, models/kimi-k3.yaml). Split-K: the context is cut into `splits` chunks, each program
writes a partial output and its log-sum-exp, and a second kernel merges them (flash-decoding,
Dao et al. 2023). Per-sequence lengths (`lens`) let the same captured graph serve ragged batches.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

D_LATENT = 512  # kv_lora_rank of K3 / Kimi-Linear
D_ROPE = 64  # qk_rope_head_dim
SM_SCALE = 1.0 / math.sqrt(128 + 64)  # K3 qk_nope_head_dim + qk_rope_head_dim
# Kernel choices (not measured optima): 32 cache rows per step keeps the [32, 512] bf16 tile at 32 KB;
# at most 32 heads per program bounds the fp32 accumulator [32, 512] to 64 registers a thread at 8 warps.
BLOCK_C = 32
MAX_BLOCK_H = 32
TARGET_PROGRAMS = 2 * 132  # harness choice: two waves of the H200's 132 SMs
MERGE_BLOCK_S = 16  # kernel choice: splits merged per step ([16, 512] fp32 in registers)
MIN_CHUNK = 256  # harness choice: a split reads at least this many positions (amortises its merge)
LAZY_LOG2 = 8.0  # kernel choice (lazy variants): a stale max may lag by 2^8 (p <= 256: far inside fp32 and bf16)


def reference(q_lat, q_rope, cache, lens=None, sm_scale: float = SM_SCALE):
    """Naive fp32 attention: q [B, H, 512] + [B, H, 64] against cache [B, C, 576] -> [B, H, 512]."""
    import torch

    B, C, _ = cache.shape
    kv = cache.float()
    s = torch.einsum("bhd,bcd->bhc", q_lat.float(), kv[..., :D_LATENT])
    s = s + torch.einsum("bhd,bcd->bhc", q_rope.float(), kv[..., D_LATENT:])
    s = s * sm_scale
    if lens is not None:
        pos = torch.arange(C, device=cache.device)
        s = s.masked_fill(pos[None, None, :] >= lens.to(cache.device)[:, None, None], float("-inf"))
    p = torch.softmax(s, -1)
    return torch.einsum("bhc,bcd->bhd", p, kv[..., :D_LATENT])


def torch_decode(q_lat, q_rope, cache, sm_scale: float = SM_SCALE):
    """The same attention in plain torch ops (bf16 matmuls, fp32 softmax): the comparison baseline."""
    import torch

    q = torch.cat([q_lat, q_rope], -1)  # [B, H, 576]
    s = torch.bmm(q, cache.transpose(1, 2)).float() * sm_scale  # [B, H, C]
    p = torch.softmax(s, -1).to(cache.dtype)
    return torch.bmm(p, cache[..., :D_LATENT])


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


try:  # the kernels need triton; the reference above runs without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:
    @triton.jit
    def _mm(a, b, F32: tl.constexpr):
        # F32: Triton's CPU interpreter multiplies bf16 dots wrongly (triton 3.9); fp32 there
        if F32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32))
        return tl.dot(a, b)

    @triton.jit
    def _mma(a, b, acc, F32: tl.constexpr):
        # acc + a b accumulated in place (the tensor-core accumulator is acc itself: no second [H, 512] tile)
        if F32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        return tl.dot(a, b, acc)

    @triton.jit
    def _split_kernel(ql_ptr, qr_ptr, kv_ptr, lens_ptr, o_ptr, lse_ptr,
                      s_qlb, s_qlh, s_qrb, s_qrh, s_kvb, s_kvc, H, chunk, splits, sm_scale_log2,
                      DL: tl.constexpr, DR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
                      F32: tl.constexpr, HEAD_FASTEST: tl.constexpr, FUSED: tl.constexpr, LAZY: tl.constexpr,
                      LAZY_T: tl.constexpr):
        # HEAD_FASTEST: the head tiles of one (sequence, split) are neighbours in launch order, so they read
        # the same cache rows at about the same time (L2 hits instead of one HBM pass per tile)
        if HEAD_FASTEST:
            ht = tl.program_id(0)
            sp = tl.program_id(1)
            b = tl.program_id(2).to(tl.int64)
        else:
            b = tl.program_id(0).to(tl.int64)
            sp = tl.program_id(1)
            ht = tl.program_id(2)
        L = tl.load(lens_ptr + b)
        start = sp * chunk
        end = tl.minimum(start + chunk, L)
        rh = ht * BLOCK_H + tl.arange(0, BLOCK_H)
        h_mask = rh < H
        rl = tl.arange(0, DL)
        rr = tl.arange(0, DR)
        q_l = tl.load(ql_ptr + b * s_qlb + rh[:, None] * s_qlh + rl[None, :], mask=h_mask[:, None], other=0.0)
        q_r = tl.load(qr_ptr + b * s_qrb + rh[:, None] * s_qrh + rr[None, :], mask=h_mask[:, None], other=0.0)
        m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_H, DL), tl.float32)
        for c0 in range(start, end, BLOCK_C):
            rc = c0 + tl.arange(0, BLOCK_C)
            c_mask = rc < end
            row = kv_ptr + b * s_kvb + rc[:, None].to(tl.int64) * s_kvc
            k_l = tl.load(row + rl[None, :], mask=c_mask[:, None], other=0.0)  # [BLOCK_C, DL]
            k_r = tl.load(row + DL + rr[None, :], mask=c_mask[:, None], other=0.0)
            if FUSED:
                s = _mma(q_r, tl.trans(k_r), _mm(q_l, tl.trans(k_l), F32), F32)
            else:
                s = _mm(q_l, tl.trans(k_l), F32) + _mm(q_r, tl.trans(k_r), F32)
            s = tl.where(c_mask[None, :], s * sm_scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if LAZY:
                # rescale only when some row's max grew by more than LAZY_LOG2 (FlashAttention-4's
                # conditional rescaling): between rescales the reference max is stale by at most that, so
                # p <= 2^LAZY_LOG2 and l, acc share the one reference (exact after the final division)
                if tl.max(m_new - m_i, 0) > LAZY_T:
                    alpha = tl.exp2(m_i - m_new)
                    l_i = l_i * alpha
                    acc = acc * alpha[:, None]
                    m_i = m_new
                p = tl.exp2(s - m_i[:, None])
                l_i = l_i + tl.sum(p, 1)
                acc = _mma(p.to(tl.bfloat16), k_l, acc, F32)
            else:
                p = tl.exp2(s - m_new[:, None])
                alpha = tl.exp2(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                if FUSED:
                    acc = _mma(p.to(tl.bfloat16), k_l, acc * alpha[:, None], F32)
                else:
                    acc = acc * alpha[:, None] + _mm(p.to(tl.bfloat16), k_l, F32)
                m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        base = (b * splits + sp) * H + rh
        tl.store(o_ptr + base[:, None] * DL + rl[None, :], out, mask=h_mask[:, None])
        tl.store(lse_ptr + base, lse, mask=h_mask)

    @triton.jit
    def _merge_kernel(o_ptr, lse_ptr, out_ptr, H, splits, s_ob, s_oh,
                      DL: tl.constexpr, BLOCK_S: tl.constexpr):
        # online merge over the splits, BLOCK_S at a time (registers stay bounded at any split count)
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        rl = tl.arange(0, DL)
        m = tl.full((), float("-inf"), tl.float32)
        den = tl.zeros((), tl.float32)
        acc = tl.zeros((DL,), tl.float32)
        for s0 in range(0, splits, BLOCK_S):
            rs = s0 + tl.arange(0, BLOCK_S)
            s_mask = rs < splits
            idx = (b * splits + rs) * H + h
            lse = tl.load(lse_ptr + idx, mask=s_mask, other=float("-inf"))
            m_new = tl.maximum(m, tl.max(lse, 0))
            w = tl.where(lse > float("-inf"), tl.exp2(lse - m_new), 0.0)
            alpha = tl.where(m > float("-inf"), tl.exp2(m - m_new), 0.0)
            o = tl.load(o_ptr + idx[:, None] * DL + rl[None, :], mask=s_mask[:, None], other=0.0)
            acc = acc * alpha + tl.sum(o * w[:, None], 0)
            den = den * alpha + tl.sum(w, 0)
            m = m_new
        tl.store(out_ptr + b * s_ob + h * s_oh + rl, (acc / den).to(tl.bfloat16))


@dataclass(frozen=True)
class Variant:
    """Launch configuration; `graph_parts.mla_variants` picks one on the H200 (correct, then fastest)."""

    block_c: int = BLOCK_C
    num_warps: int = 8
    num_stages: int = 2
    max_block_h: int = MAX_BLOCK_H
    head_fastest: bool = False  # grid order: head tiles innermost (see _split_kernel)
    waves: int = 2  # split planning: programs for this many waves of the SMs (num_splits)
    fused: bool = False  # dots accumulate into their running sums (tl.dot(a, b, acc))
    lazy: bool = False  # conditional rescaling (LAZY_LOG2); implies fused accumulation

    @property
    def name(self) -> str:
        base = f"c{self.block_c}-w{self.num_warps}-s{self.num_stages}-h{self.max_block_h}"
        return (base + ("-t" if self.head_fastest else "") + (f"-v{self.waves}" if self.waves != 2 else "")
                + ("-z" if self.lazy else "-f" if self.fused else ""))

    @classmethod
    def from_name(cls, name: str) -> "Variant":
        """The inverse of `name`: 'c64-w8-s2-h64-t-v4' -> Variant(64, 8, 2, 64, True, 4); ValueError otherwise."""
        import re

        m = re.fullmatch(r"c(\d+)-w(\d+)-s(\d+)-h(\d+)(-t)?(?:-v(\d+))?(-[fz])?", name.strip())
        if not m:
            raise ValueError(f"not a variant name: {name!r} (e.g. c32-w4-s2-h32, c64-w8-s2-h64-t-v4-z)")
        c, w, s, h, t, v, acc = m.groups()
        return cls(int(c), int(w), int(s), int(h), bool(t), int(v) if v else 2, fused=acc == "-f",
                   lazy=acc == "-z")


VARIANTS = [Variant(32, 8, 2, 32), Variant(64, 8, 2, 32), Variant(32, 4, 2, 32), Variant(32, 8, 2, 64),
            Variant(32, 8, 3, 32), Variant(64, 8, 1, 32)]
# The H200 winner of run 20261201-1gpu-graph-b for both head classes (mla_decode_variants.csv): 4 warps,
# 32 positions a step, 2 stages; e.g. B = 16, C = 16K, H = 96: 476 us against 846 us at 8 warps.
DEFAULT = Variant(32, 4, 2, 32)


def num_splits(B: int, C: int, H: int, max_block_h: int = MAX_BLOCK_H, waves: int = 2) -> int:
    """Context chunks per sequence: enough programs for `waves` waves of SMs (two by default), none
    shorter than MIN_CHUNK."""
    tiles = math.ceil(H / block_h(H, max_block_h))
    want = math.ceil(TARGET_PROGRAMS * waves / 2 / max(1, B * tiles))
    return max(1, min(want, math.ceil(C / MIN_CHUNK)))


def block_h(H: int, max_block_h: int = MAX_BLOCK_H) -> int:
    """Heads per program: a power of two, at least 16 (Triton's smallest dot), at most `max_block_h`."""
    return min(max_block_h, max(16, 1 << (max(1, H) - 1).bit_length()))


class MLADecode:
    """Buffers for one (B, C_max, H) decode shape, reused across calls (and by a captured graph)."""

    def __init__(self, B: int, C: int, H: int, device, splits: int | None = None, variant: Variant | None = None):
        import torch

        self.B, self.C, self.H = B, C, H
        self.variant = v = variant or DEFAULT
        self.splits = splits or num_splits(B, C, H, v.max_block_h, v.waves)
        self.chunk = math.ceil(math.ceil(C / self.splits) / v.block_c) * v.block_c
        self.bh = block_h(H, v.max_block_h)
        self.o_part = torch.empty((B, self.splits, H, D_LATENT), dtype=torch.float32, device=device)
        self.lse = torch.empty((B, self.splits, H), dtype=torch.float32, device=device)
        self.out = torch.empty((B, H, D_LATENT), dtype=torch.bfloat16, device=device)

    def __call__(self, q_lat, q_rope, cache, lens, sm_scale: float = SM_SCALE):
        if triton is None:
            raise RuntimeError("the MLA decode kernel needs triton")
        assert cache.shape[-1] == D_LATENT + D_ROPE and cache.stride(-1) == 1
        assert q_lat.stride(-1) == 1 and q_rope.stride(-1) == 1
        B, H, v = self.B, self.H, self.variant
        f32 = interpreted()
        tiles = math.ceil(H / self.bh)
        grid = (tiles, self.splits, B) if v.head_fastest else (B, self.splits, tiles)
        _split_kernel[grid](
            q_lat, q_rope, cache, lens, self.o_part, self.lse,
            q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1), cache.stride(0), cache.stride(1),
            H, self.chunk, self.splits, sm_scale * 1.4426950408889634,
            DL=D_LATENT, DR=D_ROPE, BLOCK_H=self.bh, BLOCK_C=v.block_c, F32=f32, HEAD_FASTEST=v.head_fastest,
            FUSED=v.fused or v.lazy, LAZY=v.lazy, LAZY_T=LAZY_LOG2,
            num_warps=v.num_warps, num_stages=v.num_stages)
        _merge_kernel[(B, H)](self.o_part, self.lse, self.out, H, self.splits, self.out.stride(0),
                              self.out.stride(1), DL=D_LATENT, BLOCK_S=MERGE_BLOCK_S, num_warps=4)
        return self.out


def decode_bytes(B: int, C: int, H: int) -> float:
    """Minimal HBM bytes of one call (one formula: `k3sim.kernels.ops_decode.mla_decode_bytes`)."""
    from k3sim.kernels.ops_decode import mla_decode_bytes

    return mla_decode_bytes({"B": B, "C": C, "H": H})


def decode_flop(B: int, C: int, H: int) -> float:
    """FLOP of one call (`k3sim.kernels.ops_decode.mla_decode_flop`)."""
    from k3sim.kernels.ops_decode import mla_decode_flop

    return mla_decode_flop({"B": B, "C": C, "H": H})
