"""MXFP4 format, re-layout, routing metadata and the dequantise-then-bf16 reference (pure torch, CPU);
the Triton kernel itself under Triton's CPU interpreter when triton is installed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from k3sim.calibration import mxfp4  # noqa: E402


def test_e2m1_codes_decode_to_the_ocp_values():
    """Codes 0..15 one per nibble, scale byte 127 (2^0): the OCP FP4 E2M1 table, sign in bit 3."""
    codes = torch.tensor([[0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] * 2], dtype=torch.uint8)
    scales = torch.tensor([[127]], dtype=torch.uint8)
    vals = mxfp4.dequantize(codes, scales)[0, :16].tolist()
    assert vals == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_quantize_hand_worked_group():
    """One group whose max |x| is 3.0: shared exponent floor(log2 3) - 2 = -1 (scale byte 126), so the
    elements are x / 0.5 rounded to e2m1: 3.0 -> 6 (code 7), -0.25 -> -0.5 (code 9), 0.6 -> 1.0 (code 2)."""
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = 3.0, -0.25, 0.6
    codes, scales = mxfp4.quantize(x)
    assert scales.tolist() == [[126]]
    assert codes[0, 0].item() == (7 | (9 << 4)) and (codes[0, 1].item() & 15) == 2
    back = mxfp4.dequantize(codes, scales)[0]
    assert back[:3].tolist() == [3.0, -0.25, 0.5]


def test_quantize_is_idempotent_and_bounded():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 8, 64, generator=g) * 0.05
    c, s = mxfp4.quantize(w)
    dq = mxfp4.dequantize(c, s)
    c2, s2 = mxfp4.quantize(dq)
    assert torch.equal(c, c2) and torch.equal(s, s2)  # representable values map to themselves
    # e2m1 has a relative step of at most 1/3 (between 1.5 and 2, 3 and 4...) plus the subnormal range
    assert float((dq - w).norm() / w.norm()) < 0.2
    assert c.shape == (4, 8, 32) and s.shape == (4, 8, 2)
    assert mxfp4.BITS_PER_ELEMENT == 4.25


@pytest.mark.parametrize("block_n", [16, 32])
def test_relayout_round_trips_and_streams_one_tile_contiguously(block_n):
    g = torch.Generator().manual_seed(5)
    mats = [mxfp4.quantize(torch.randn(3, 32, 96, generator=g)) for _ in range(2)]
    codes_r, scales_r = mxfp4.relayout([m[0] for m in mats], [m[1] for m in mats], block_n)
    assert codes_r.shape == (3, 32 // block_n, 3, 2, block_n, 16)
    back_c, back_s = mxfp4.unrelayout(codes_r, scales_r)
    for (c, s), bc, bs in zip(mats, back_c, back_s):
        assert torch.equal(c, bc) and torch.equal(s, bs)
    # byte j of (expert 1, tile 0, group 2, matrix 1, neuron 0): element 64 + j low, 64 + 16 + j high
    c1 = mats[1][0][1, 0]  # standard packing, neuron 0 of expert 1
    el = torch.stack([c1 & 15, c1 >> 4], -1).reshape(-1)
    j = 5
    assert codes_r[1, 0, 2, 1, 0, j].item() == (el[64 + j] | (el[64 + 16 + j] << 4)).item()


def test_route_names_touched_experts_in_sorted_slots():
    ids = torch.tensor([[3, 1], [1, 0], [3, 2]], dtype=torch.int32)  # B = 3, topk = 2, E = 5
    wts = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.9, 0.1]])
    meta = mxfp4.route(ids, wts, 5)
    assert meta["num_slots"].tolist() == [4]  # experts 0, 1, 2, 3 touched, 4 not
    assert meta["slot_expert"][:4].tolist() == [0, 1, 1 + 1, 3]
    assert meta["slot_start"][:5].tolist() == [0, 1, 3, 4, 6]  # row ranges of each slot; then R = 6
    assert meta["tok"].tolist() == [1, 0, 1, 2, 0, 2]  # stable: expert 1 sees token 0 then token 1
    assert meta["expert_counts"].tolist() == [1, 2, 1, 2, 0]
    assert meta["offs"].tolist() == [1, 3, 4, 6, 6]
    assert torch.allclose(meta["wt"], torch.tensor([0.5, 0.25, 0.5, 0.1, 0.75, 0.9]))


def test_combine_sums_each_tokens_pairs():
    y = torch.arange(6, dtype=torch.float32).reshape(6, 1).repeat(1, 2)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])  # sorted row i came from pair perm[i]
    out = mxfp4.combine(y, perm, B=3, k=2)
    # pair p = token p // 2; pair 0 <- row 1, pair 1 <- row 3 -> token 0 = 1 + 3
    assert out[:, 0].tolist() == [4.0, 5.0, 6.0]


def test_reference_moe_matches_a_hand_worked_expert():
    """One expert (E = 1) of width N = 1 over K = 2: gate [1, 0], up [0, 2], down [[3], [1]]; x = [2, 1]:
    g = 2, u = 2, h = silu(2) * 2 = 2 * 2 / (1 + e^-2) = 3.5232, out = weight 1 x [3h, h]."""
    x = torch.tensor([[2.0, 1.0]], dtype=torch.bfloat16)
    gate = torch.tensor([[[1.0, 0.0]]])
    up = torch.tensor([[[0.0, 2.0]]])
    down = torch.tensor([[[3.0], [1.0]]])
    out = mxfp4.reference_moe(x, torch.tensor([[0]]), torch.tensor([[1.0]]), gate, up, down)
    h = 3.5232
    assert out[0].float().tolist() == pytest.approx([3 * h, h], rel=1e-2)


INTERPRETER_CHECK = """
import torch
from k3sim.calibration import mxfp4 as m
g = torch.Generator().manual_seed(0)
E, K, N = 2, 32, 32
mats = [m.quantize(torch.randn(s, generator=g) * 0.05) for s in ((E, N, K), (E, N, K), (E, K, N))]
gate, up, down = (m.dequantize(c, s, torch.bfloat16) for c, s in mats)
ex = m.MXFP4Experts(*mats, variant=m.Variant(1, 32, 4, 3))
for B, topk, skew in ((3, 1, False), (17, 2, True)):
    ids, wts = m.random_routing(B, E, topk, "cpu", seed=B)
    if skew:  # 17 tokens on experts 0 and 1: two 16-token tiles per expert
        ids = torch.tensor([[0, 1]] * B, dtype=torch.int32)
    x = torch.randn((B, K), generator=g).to(torch.bfloat16)
    err = m.rel_err(ex(x, m.route(ids, wts, E), B, topk), m.reference_moe(x, ids, wts, gate, up, down))
    print(B, err)
    assert err < 2e-2, err
"""


def test_kernel_matches_reference_under_the_triton_interpreter():
    """The Triton kernel itself (fp16 bit-placement dequantisation) on Triton's CPU interpreter, in a
    child process (triton reads TRITON_INTERPRET when it is imported): uniform routing, and 17 tokens
    on two experts (two 16-token tiles per expert)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", INTERPRETER_CHECK], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(r.stdout.split()) == 4
