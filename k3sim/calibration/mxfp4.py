"""MXFP4 routed experts at decode batch: packing, an offline re-layout, a dequantize-then-bf16
reference, and a token-centric Triton kernel (gate/up + SwiGLU, then down).

Format (OCP Microscaling v1.0, MXFP4; K3 ships its routed experts as compressed-tensors
mxfp4-pack-quantized, group 32, domain-facts.md): e2m1 elements (sign, 2 exponent bits, 1 mantissa
bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6), two per byte (element 2j in the low nibble), and one e8m0 scale
(2^(s-127)) per 32 consecutive elements along the reduction dimension: 4.25 bits per element.

Why a token-centric kernel: at decode batch an expert sees a handful of tokens, so its time is the
time to stream its weights. A tile-centric grouped GEMM (`torch._grouped_mm`) pads every expert's
tokens to an MMA tile and walks every group; here each Triton program owns BLOCK_N output neurons of
ONE touched expert, streams only that expert's weights (contiguous, thanks to the re-layout) and
computes all tokens routed to it. Programs of untouched slots exit at once, so the launch grid is
fixed and the whole call can be captured in a CUDA graph (no host synchronisation anywhere).

Layout the kernel reads (`relayout`): for expert e, tile t of BLOCK_N output neurons, group q of 32
inputs and matrix g (gate, up for the first kernel; down alone for the second):
codes[e, t, q, g, n, j] (16 bytes) holds element 32q + j in its low nibble and 32q + 16 + j in its
high nibble; scales[e, t, q, g, n]. One program's weights are one contiguous run of bytes.

Dequantisation trick (exact): an e2m1 nibble s|e1 e0|m, re-placed as the fp8 e4m3 byte
s|0 0 e1 e0|m 0 0, is the same number times 2^-6, subnormals included (e4m3's subnormal step is
2^-6 x 0.5 = e2m1's 0.5 x 2^-6). Hopper converts e4m3 to bf16 in hardware; the 2^6 goes into the
group scale, which multiplies the group's partial dot product rather than every element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GROUP = 32  # elements per e8m0 scale (OCP MX)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0..7 (OCP MX, FP4 E2M1)
E2M1_EMAX = 2  # exponent of the largest normal e2m1 value (6 = 1.5 x 2^2)
BITS_PER_ELEMENT = 4 + 8 / GROUP  # 4.25


# ---- format (pure torch, CPU or GPU) -----------------------------------------------------------

def _lut(device):
    import torch

    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def quantize(w):
    """bf16/fp32 [..., K] -> (codes uint8 [..., K/2], scales uint8 [..., K/32]) in the standard packing.

    Shared exponent as in the OCP MX spec: floor(log2(max |x| of the group)) - emax(e2m1), so the
    group's largest element lands in [4, 8) before rounding; elements round to the nearest e2m1 value
    (ties to the lower code) and saturate at 6."""
    import torch

    K = w.shape[-1]
    if K % GROUP:
        raise ValueError(f"last dimension {K} is not a multiple of {GROUP}")
    x = w.float().reshape(*w.shape[:-1], K // GROUP, GROUP)
    amax = x.abs().amax(-1, keepdim=True)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0 ** -126))) - E2M1_EMAX,
                      torch.full_like(amax, -127.0)).clamp(-127, 127)
    y = x / torch.exp2(exp)
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
    idx = (y.abs().unsqueeze(-1) - mags).abs().argmin(-1)  # nearest magnitude
    code = (idx | (((y < 0) & (idx > 0)).to(idx.dtype) << 3)).to(torch.uint8).reshape(*w.shape[:-1], K)  # no -0
    codes = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (exp.squeeze(-1) + 127).to(torch.uint8)
    return codes, scales


def dequantize(codes, scales, dtype=None):
    """Inverse of `quantize` (standard packing) -> fp32 (or `dtype`) [..., K]."""
    import torch

    lut = _lut(codes.device)
    lo = lut[(codes & 15).long()]
    hi = lut[(codes >> 4).long()]
    vals = torch.stack([lo, hi], -1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)
    scale = torch.exp2(scales.float() - 127.0)
    out = (vals.reshape(*scales.shape, GROUP) * scale.unsqueeze(-1)).reshape(vals.shape)
    return out if dtype is None else out.to(dtype)


def relayout(codes_list, scales_list, block_n: int):
    """Standard packing of G matrices [E, N, K] (codes [E, N, K/2], scales [E, N, K/32]) -> the kernel's
    streaming layout: codes [E, N/block_n, K/32, G, block_n, 16], scales [E, N/block_n, K/32, G, block_n]."""
    import torch

    E, N, half = codes_list[0].shape
    K = 2 * half
    if N % block_n or K % GROUP:
        raise ValueError(f"N={N} must be a multiple of block_n={block_n} and K={K} of {GROUP}")
    T, Q = N // block_n, K // GROUP
    cs, ss = [], []
    for codes, scales in zip(codes_list, scales_list):
        if codes.shape != (E, N, half) or scales.shape != (E, N, Q):
            raise ValueError("all matrices must share E, N, K")
        lo, hi = codes & 15, codes >> 4
        el = torch.stack([lo, hi], -1).reshape(E, N, Q, GROUP)  # 4-bit codes in element order
        packed = el[..., :16] | (el[..., 16:] << 4)  # byte j: element j low, element 16 + j high
        cs.append(packed.reshape(E, T, block_n, Q, 16).permute(0, 1, 3, 2, 4))  # E, T, Q, n, 16
        ss.append(scales.reshape(E, T, block_n, Q).permute(0, 1, 3, 2))  # E, T, Q, n
    return torch.stack(cs, 3).contiguous(), torch.stack(ss, 3).contiguous()


def unrelayout(codes_r, scales_r):
    """Inverse of `relayout`: -> lists of standard (codes [E, N, K/2], scales [E, N, K/32])."""
    import torch

    E, T, Q, G, bn, _ = codes_r.shape
    out_c, out_s = [], []
    for g in range(G):
        p = codes_r[:, :, :, g].permute(0, 1, 3, 2, 4).reshape(E, T * bn, Q, 16)
        el = torch.cat([p & 15, p >> 4], -1)  # elements 0..15 then 16..31
        el = el.reshape(E, T * bn, Q * GROUP)
        out_c.append((el[..., 0::2] | (el[..., 1::2] << 4)).contiguous())
        out_s.append(scales_r[:, :, :, g].permute(0, 1, 3, 2).reshape(E, T * bn, Q).contiguous())
    return out_c, out_s


# ---- routing metadata (capturable: fixed shapes, no host synchronisation) -------------------------

def route(topk_ids, topk_weights, num_experts: int):
    """Sort the B x topk assignments by expert and name each touched expert's slot.

    Returns a dict of device tensors: `perm` (assignment rows in expert order), `tok` (token of each
    sorted row), `wt` (its routing weight, fp32), `slot_expert` / `slot_start` (expert and first
    sorted row of slot s; slots past the touched count start at R = B*topk), `num_slots` [1],
    `expert_counts` [E], `offs` (cumulative rows per expert, int32, for grouped GEMMs)."""
    import torch

    B, k = topk_ids.shape
    R = B * k
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    sorted_e, perm = torch.sort(flat, stable=True)
    first = torch.ones(R, dtype=torch.bool, device=dev)
    first[1:] = sorted_e[1:] != sorted_e[:-1]
    slot_of_row = torch.cumsum(first.to(torch.int32), 0) - 1
    slot_start = torch.full((R + 1,), R, dtype=torch.int32, device=dev)
    rows = torch.arange(R, dtype=torch.int32, device=dev)
    # rows that start a slot write their index; others write R (scatter_reduce amin keeps the start)
    slot_start[:R].scatter_reduce_(0, slot_of_row.long(), torch.where(first, rows, torch.full_like(rows, R)),
                                   reduce="amin", include_self=True)
    slot_expert = torch.zeros(R, dtype=torch.int32, device=dev)
    slot_expert.scatter_(0, slot_of_row.long(), sorted_e.to(torch.int32))
    num_slots = first.sum().reshape(1).to(torch.int32)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    return {"perm": perm, "tok": (perm // k).to(torch.int32), "wt": topk_weights.reshape(-1)[perm].float(),
            "slot_expert": slot_expert, "slot_start": slot_start, "num_slots": num_slots,
            "expert_counts": counts, "offs": torch.cumsum(counts, 0).to(torch.int32)}


def combine(y_sorted, perm, B: int, k: int):
    """Sorted, already-weighted expert outputs [R, D] -> per-token sums [B, D] (fp32 accumulate)."""
    import torch

    out = torch.zeros((B * k, y_sorted.shape[1]), dtype=torch.float32, device=y_sorted.device)
    out[perm] = y_sorted.float()
    return out.reshape(B, k, -1).sum(1).to(y_sorted.dtype)


# ---- reference ---------------------------------------------------------------------------------

def reference_moe(x, topk_ids, topk_weights, w_gate, w_up, w_down):
    """Dequantised-then-bf16 routed experts, token by token: sum_j w_j down_e(silu(gate_e x) * up_e x).

    x [B, K] bf16; w_gate / w_up [E, N, K] and w_down [E, K, N] as bf16 (dequantised) tensors.
    bf16 operands, fp32 accumulation, the intermediate rounded to bf16 as the kernel does."""
    import torch
    import torch.nn.functional as F

    B, k = topk_ids.shape
    out = torch.zeros((B, w_down.shape[1]), dtype=torch.float32, device=x.device)
    for b in range(B):
        for j in range(k):
            e = int(topk_ids[b, j])
            g = (w_gate[e].float() @ x[b].float())
            u = (w_up[e].float() @ x[b].float())
            h = (F.silu(g) * u).to(torch.bfloat16).float()
            out[b] += float(topk_weights[b, j]) * (w_down[e].float() @ h)
    return out.to(torch.bfloat16)


# ---- Triton kernels ----------------------------------------------------------------------------

try:  # the kernels need triton; the format functions above run without it (CPU tests, CI)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

if triton is not None:
    @triton.jit
    def _dq(c, HIGH: tl.constexpr, MODE: tl.constexpr):
        """Codes (uint8, two nibbles) -> one nibble's values, exactly, times 2^-6 (MODE 0, bf16) or
        2^-14 (MODE 1 and 2, fp16); the group scale takes the power of two back."""
        if MODE == 0:
            # e2m1 s|e1 e0|m -> e4m3 byte s|0 0 e1 e0|m 0 0 -> hardware cvt to bf16
            c = c.to(tl.int32)
            if HIGH:
                b = (c & 0x80) | ((c & 0x70) >> 2)
            else:
                b = ((c & 8) << 4) | ((c & 7) << 2)
            return b.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
        elif MODE == 1:
            # e2m1 -> fp16 bits s|0 0 0 e1 e0|m 0..0: exponent bias 15 vs 1 (2^-14), subnormals
            # included (fp16 subnormal 2^-14 x 0.m); no conversion instruction at all
            c = c.to(tl.int32)
            if HIGH:
                b = ((c & 0x80) << 8) | ((c & 0x70) << 5)
            else:
                b = ((c & 8) << 12) | ((c & 7) << 9)
            return b.to(tl.int16).to(tl.float16, bitcast=True)
        else:
            # the same bit placement on 4 bytes per 32-bit register (prmt spreads them into 16-bit lanes)
            if HIGH:
                return tl.inline_asm_elementwise(
                    asm="""{
                    .reg .b32 t0, t1, u, v;
                    prmt.b32 t0, $2, 0, 0x4140;
                    prmt.b32 t1, $2, 0, 0x4342;
                    shl.b32 u, t0, 8; and.b32 u, u, 0x80008000; shl.b32 v, t0, 5; and.b32 v, v, 0x0E000E00;
                    or.b32 $0, u, v;
                    shl.b32 u, t1, 8; and.b32 u, u, 0x80008000; shl.b32 v, t1, 5; and.b32 v, v, 0x0E000E00;
                    or.b32 $1, u, v;
                    }""", constraints="=r,=r,r", args=[c], dtype=tl.float16, is_pure=True, pack=4)
            return tl.inline_asm_elementwise(
                asm="""{
                .reg .b32 t0, t1, u, v;
                prmt.b32 t0, $2, 0, 0x4140;
                prmt.b32 t1, $2, 0, 0x4342;
                shl.b32 u, t0, 12; and.b32 u, u, 0x80008000; shl.b32 v, t0, 9; and.b32 v, v, 0x0E000E00;
                or.b32 $0, u, v;
                shl.b32 u, t1, 12; and.b32 u, u, 0x80008000; shl.b32 v, t1, 9; and.b32 v, v, 0x0E000E00;
                or.b32 $1, u, v;
                }""", constraints="=r,=r,r", args=[c], dtype=tl.float16, is_pure=True, pack=4)

    @triton.jit
    def _mma(a, b, F32: tl.constexpr):
        # F32: Triton's CPU interpreter (tests) multiplies bf16 dots wrongly (triton 3.9); fp32 there
        if F32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32))
        return tl.dot(a, b)

    @triton.jit
    def _group_dot(w_ptr, s_ptr, x_lo, x_hi, rn, acc, F32: tl.constexpr, MODE: tl.constexpr):
        # one 32-element group: codes [BN, 16] (low nibbles: inputs 0-15, high: 16-31), scale [BN]
        c = tl.load(w_ptr + rn[:, None] * 16 + tl.arange(0, 16)[None, :])
        s = tl.load(s_ptr + rn).to(tl.int32)
        if MODE == 0:
            scale = ((s + 6) << 23).to(tl.float32, bitcast=True)  # 2^(s - 127) x 2^6
        else:
            scale = ((s + 14) << 23).to(tl.float32, bitcast=True)  # 2^(s - 127) x 2^14
        part = _mma(_dq(c, False, MODE), x_lo, F32) + _mma(_dq(c, True, MODE), x_hi, F32)
        return acc + part * scale[:, None]

    @triton.jit
    def _x_group(xT, m_mask, MODE: tl.constexpr):
        x_lo = tl.load(xT, mask=m_mask[None, :], other=0.0)
        x_hi = tl.load(xT + 16, mask=m_mask[None, :], other=0.0)
        if MODE != 0:  # fp16 operands (activations of a normed latent stay far inside fp16's range)
            x_lo = x_lo.to(tl.float16)
            x_hi = x_hi.to(tl.float16)
        return x_lo, x_hi

    @triton.jit
    def gate_up_kernel(x_ptr, w_ptr, s_ptr, h_ptr, tok_ptr, slot_expert_ptr, slot_start_ptr, num_slots_ptr,
                       K: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       F32: tl.constexpr = False, MODE: tl.constexpr = 1):
        pid = tl.program_id(0)
        NT: tl.constexpr = N // BLOCK_N
        Q: tl.constexpr = K // 32
        slot = pid // NT
        t = pid % NT
        if slot >= tl.load(num_slots_ptr):
            return
        e = tl.load(slot_expert_ptr + slot).to(tl.int64)
        start = tl.load(slot_start_ptr + slot)
        end = tl.load(slot_start_ptr + slot + 1)
        rn = tl.arange(0, BLOCK_N)
        rk = tl.arange(0, 16)
        tile_w = w_ptr + (e * NT + t) * (Q * 2 * BLOCK_N * 16)
        tile_s = s_ptr + (e * NT + t) * (Q * 2 * BLOCK_N)
        for m0 in range(start, end, BLOCK_M):
            rm = m0 + tl.arange(0, BLOCK_M)
            m_mask = rm < end
            tok = tl.load(tok_ptr + rm, mask=m_mask, other=0).to(tl.int64)
            xT = x_ptr + tok[None, :] * K + rk[:, None]  # [16, BLOCK_M]
            acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for q in range(0, Q):
                wq = tile_w + q * (2 * BLOCK_N * 16)
                sq = tile_s + q * (2 * BLOCK_N)
                x_lo, x_hi = _x_group(xT + q * 32, m_mask, MODE)
                acc_g = _group_dot(wq, sq, x_lo, x_hi, rn, acc_g, F32, MODE)
                acc_u = _group_dot(wq + BLOCK_N * 16, sq + BLOCK_N, x_lo, x_hi, rn, acc_u, F32, MODE)
            h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # SwiGLU
            cols = t * BLOCK_N + rn
            tl.store(h_ptr + rm[None, :].to(tl.int64) * N + cols[:, None], h.to(tl.bfloat16), mask=m_mask[None, :])

    @triton.jit
    def down_kernel(h_ptr, w_ptr, s_ptr, y_ptr, wt_ptr, slot_expert_ptr, slot_start_ptr, num_slots_ptr,
                    K: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    F32: tl.constexpr = False, MODE: tl.constexpr = 1):
        # h [R, K] (sorted rows; K = expert width) -> y [R, N] (N = latent), times the routing weight
        pid = tl.program_id(0)
        NT: tl.constexpr = N // BLOCK_N
        Q: tl.constexpr = K // 32
        slot = pid // NT
        t = pid % NT
        if slot >= tl.load(num_slots_ptr):
            return
        e = tl.load(slot_expert_ptr + slot).to(tl.int64)
        start = tl.load(slot_start_ptr + slot)
        end = tl.load(slot_start_ptr + slot + 1)
        rn = tl.arange(0, BLOCK_N)
        rk = tl.arange(0, 16)
        tile_w = w_ptr + (e * NT + t) * (Q * BLOCK_N * 16)
        tile_s = s_ptr + (e * NT + t) * (Q * BLOCK_N)
        for m0 in range(start, end, BLOCK_M):
            rm = m0 + tl.arange(0, BLOCK_M)
            m_mask = rm < end
            hT = h_ptr + rm[None, :].to(tl.int64) * K + rk[:, None]
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for q in range(0, Q):
                x_lo, x_hi = _x_group(hT + q * 32, m_mask, MODE)
                acc = _group_dot(tile_w + q * (BLOCK_N * 16), tile_s + q * BLOCK_N, x_lo, x_hi, rn, acc, F32, MODE)
            wt = tl.load(wt_ptr + rm, mask=m_mask, other=0.0)
            cols = t * BLOCK_N + rn
            tl.store(y_ptr + rm[None, :].to(tl.int64) * N + cols[:, None], (acc * wt[None, :]).to(tl.bfloat16),
                     mask=m_mask[None, :])


def interpreted() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1), used by the tests."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernels():
    if triton is None:
        raise RuntimeError("the MXFP4 expert kernel needs triton")
    return gate_up_kernel, down_kernel


# Kernel choices: 16 tokens per MMA is Triton's smallest dot width. The variant (dequantisation MODE,
# output neurons per program, warps, pipeline stages) is picked on the H200 by `graph_parts.moe_ffn_variants`
# (correct on the reference, then fastest on probe shapes); these defaults are its first candidate.
BLOCK_N = 64
BLOCK_M = 16


@dataclass(frozen=True)
class Variant:
    """MODE 0: e4m3 cvt -> bf16; 1: fp16 bit placement in Triton; 2: the same in inline PTX, 4 bytes a register."""

    mode: int = 1
    block_n: int = BLOCK_N
    num_warps: int = 4
    num_stages: int = 3

    @property
    def name(self) -> str:
        return f"m{self.mode}-n{self.block_n}-w{self.num_warps}-s{self.num_stages}"


def default_variant(block_n: int = BLOCK_N) -> Variant:
    """The H200 winner of run 20261201-1gpu-graph-b (moe_mxfp4_variants.csv: inline-PTX dequantisation,
    64 neurons, 4 warps, 3 stages; geometric mean of the EP8 probes 415 us against 437 us for the same in
    plain Triton and 546 us for the e4m3-cvt path); the plain-Triton form under the CPU interpreter,
    which cannot run inline PTX."""
    return Variant(1 if interpreted() else 2, block_n, 4, 3)


VARIANTS = [Variant(2, 64, 4, 3), Variant(1, 64, 4, 3), Variant(0, 64, 4, 3), Variant(2, 128, 8, 3),
            Variant(2, 32, 4, 4), Variant(2, 64, 4, 5), Variant(1, 128, 8, 3)]


class MXFP4Experts:
    """One layer's routed experts in the kernel's layout: gate/up [E, N, K] and down [E, K, N]
    (K = latent/hidden width, N = expert width), from standard-packed MXFP4 tensors."""

    def __init__(self, gate, up, down, block_n: int = BLOCK_N, variant: "Variant | None" = None):
        (gc, gs), (uc, us), (dc, ds) = gate, up, down
        self.E, self.N, half = gc.shape
        self.K = 2 * half
        self.variant = variant or default_variant(block_n)
        block_n = self.block_n = self.variant.block_n
        self.gu_codes, self.gu_scales = relayout([gc, uc], [gs, us], block_n)
        self.d_codes, self.d_scales = relayout([dc], [ds], block_n)

    @classmethod
    def random(cls, E: int, K: int, N: int, device, seed: int = 0, block_n: int = BLOCK_N,
               variant: "Variant | None" = None):
        """Random codes and scales drawn directly in the kernel layout (the timing runs: quantising
        tens of GB of bf16 would take longer than the measurement). Scales 2^-8..2^-6 keep
        |w| <= 0.1, like trained expert weights."""
        import torch

        self = cls.__new__(cls)
        self.variant = variant or default_variant(block_n)
        block_n = self.variant.block_n
        self.E, self.N, self.K, self.block_n = E, N, K, block_n
        g = torch.Generator(device=device).manual_seed(seed)
        self.gu_codes = torch.randint(0, 256, (E, N // block_n, K // GROUP, 2, block_n, 16), generator=g,
                                      device=device, dtype=torch.uint8)
        self.gu_scales = torch.randint(119, 122, (E, N // block_n, K // GROUP, 2, block_n), generator=g,
                                       device=device, dtype=torch.uint8)
        self.d_codes = torch.randint(0, 256, (E, K // block_n, N // GROUP, 1, block_n, 16), generator=g,
                                     device=device, dtype=torch.uint8)
        self.d_scales = torch.randint(119, 122, (E, K // block_n, N // GROUP, 1, block_n), generator=g,
                                      device=device, dtype=torch.uint8)
        return self

    def weight_bytes_per_expert(self) -> int:
        """MXFP4 bytes of one expert's three matrices (codes + scales)."""
        return int(3 * self.K * self.N * BITS_PER_ELEMENT / 8)

    def __call__(self, x, meta, B: int, topk: int, h=None, y=None):
        """x [B, K] bf16 and `route(...)` metadata -> [B, K] bf16. Launch grid fixed by B*topk."""
        import torch

        gate_up, down = _kernels()
        R = B * topk
        slots = min(R, self.E)
        h = torch.empty((R, self.N), dtype=torch.bfloat16, device=x.device) if h is None else h
        y = torch.empty((R, self.K), dtype=torch.bfloat16, device=x.device) if y is None else y
        v = self.variant
        cfg = dict(BLOCK_N=self.block_n, BLOCK_M=BLOCK_M, F32=interpreted(), MODE=v.mode, num_warps=v.num_warps,
                   num_stages=v.num_stages)
        gate_up[(slots * (self.N // self.block_n),)](
            x, self.gu_codes, self.gu_scales, h, meta["tok"], meta["slot_expert"], meta["slot_start"],
            meta["num_slots"], K=self.K, N=self.N, **cfg)
        down[(slots * (self.K // self.block_n),)](
            h, self.d_codes, self.d_scales, y, meta["wt"], meta["slot_expert"], meta["slot_start"],
            meta["num_slots"], K=self.N, N=self.K, **cfg)
        return combine(y, meta["perm"], B, topk)

    def dequantized(self, dtype=None):
        """(gate, up, down) as float tensors [E, N, K], [E, N, K], [E, K, N]: for the reference."""
        (gc, uc), (gs, us) = unrelayout(self.gu_codes, self.gu_scales)
        (dc,), (ds,) = unrelayout(self.d_codes, self.d_scales)
        return dequantize(gc, gs, dtype), dequantize(uc, us, dtype), dequantize(dc, ds, dtype)


def random_routing(B: int, E: int, topk: int, device, seed: int = 0):
    """Uniform top-k of E per token (distinct experts), softmax-normalised random weights."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    scores = torch.rand((B, E), generator=g, device=device)
    w, ids = scores.topk(topk, dim=-1)
    return ids.to(torch.int32), torch.softmax(w, -1)


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp64 (METHOD.md); NaN anywhere gives inf."""

    d = (out.double() - ref.double()).norm()
    r = ref.double().norm()
    v = float(d / r) if float(r) > 0 else float(d)
    return v if math.isfinite(v) else float("inf")
