"""Absorbed-MLA decode: the naive reference on hand-worked cases, the torch baseline against it, the
split planning, and the split-K Triton kernel under Triton's CPU interpreter (when installed)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from k3sim.calibration import mla_decode as mla  # noqa: E402


def test_softmax_scale_is_one_over_sqrt_192():
    assert mla.SM_SCALE == pytest.approx(1 / math.sqrt(192))


def test_reference_two_positions_by_hand():
    """One head: q_latent = e0, no rope; cache rows have latent [a, 0...] with a = 0 and sqrt(192) ln 3,
    so the scores are 0 and ln 3 after the scale: weights 1/4, 3/4 of the two rows' latents."""
    a = math.sqrt(192) * math.log(3)
    ql = torch.zeros(1, 1, 512)
    ql[0, 0, 0] = 1.0
    qr = torch.zeros(1, 1, 64)
    cache = torch.zeros(1, 2, 576)
    cache[0, 1, 0] = a
    cache[0, 0, 1] = 4.0  # row 0's latent carries 4 in dim 1
    out = mla.reference(ql, qr, cache)
    assert out[0, 0, 0].item() == pytest.approx(0.75 * a, rel=1e-5)
    assert out[0, 0, 1].item() == pytest.approx(0.25 * 4.0, rel=1e-5)


def test_reference_masks_positions_past_the_length():
    g = torch.Generator().manual_seed(1)
    ql, qr = torch.randn(2, 3, 512, generator=g), torch.randn(2, 3, 64, generator=g)
    cache = torch.randn(2, 10, 576, generator=g)
    lens = torch.tensor([10, 4])
    out = mla.reference(ql, qr, cache, lens)
    short = mla.reference(ql[1:], qr[1:], cache[1:, :4])
    assert torch.allclose(out[1:], short, atol=1e-5)


def test_rope_part_enters_the_scores():
    """The last 64 cache dims are keys only: changing them changes the output, values stay the latent."""
    g = torch.Generator().manual_seed(2)
    ql, qr = torch.randn(1, 2, 512, generator=g), torch.randn(1, 2, 64, generator=g)
    cache = torch.randn(1, 5, 576, generator=g)
    cache2 = cache.clone()
    cache2[..., 512:] = 0
    assert not torch.allclose(mla.reference(ql, qr, cache), mla.reference(ql, qr, cache2))


def test_torch_baseline_matches_reference():
    g = torch.Generator().manual_seed(3)
    ql = torch.randn(2, 4, 512, generator=g).to(torch.bfloat16)
    qr = torch.randn(2, 4, 64, generator=g).to(torch.bfloat16)
    cache = torch.randn(2, 50, 576, generator=g).to(torch.bfloat16)
    out = mla.torch_decode(ql, qr, cache)
    ref = mla.reference(ql, qr, cache)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


def test_split_planning():
    """Two waves of 132 SMs: B = 1, H = 12 (one 16-head tile) at C = 128K -> 264 splits of >= 256
    positions; B = 64 needs ceil(264 / 64) = 5; a 1000-token context caps at ceil(1000 / 256) = 4."""
    assert mla.block_h(12) == 16 and mla.block_h(32) == 32 and mla.block_h(96) == 32 and mla.block_h(8) == 16
    assert mla.block_h(96, 64) == 64
    assert mla.num_splits(1, 131072, 12) == 264
    assert mla.num_splits(64, 131072, 12) == 5
    assert mla.num_splits(1, 1000, 12) == 4
    assert mla.num_splits(256, 4096, 96) == 1


def test_bytes_and_flop_by_hand():
    """B = 2, C = 1024, H = 12: cache 2 x 1024 x 576 x 2 B = 2,359,296; q + out 2 x 12 x (2 x 512 + 64)
    x 2 B = 52,224; FLOP 2 x 2 x 12 x 1024 x 1088 = 53,477,376."""
    assert mla.decode_bytes(2, 1024, 12) == 2_359_296 + 52_224
    assert mla.decode_flop(2, 1024, 12) == 53_477_376


KERNEL_CHECK = """
import torch
from k3sim.calibration import mla_decode as m
g = torch.Generator().manual_seed(0)
for B, C, H, splits, v in ((2, 150, 17, 3, m.Variant(32, 4, 2, 32)),):
    ql = torch.randn(B, H, 512, generator=g).bfloat16(); qr = torch.randn(B, H, 64, generator=g).bfloat16()
    cache = torch.randn(B, C, 576, generator=g).bfloat16()
    lens = torch.tensor([C - 37 * i for i in range(B)], dtype=torch.int32)
    out = m.MLADecode(B, C, H, "cpu", splits=splits, variant=v)(ql, qr, cache, lens)
    ref = m.reference(ql, qr, cache, lens)
    err = float((out.float() - ref).norm() / ref.norm())
    print(err)
    assert err < 1e-2, err
"""


def test_split_kernel_matches_reference_under_the_triton_interpreter():
    """Ragged lengths (150 and 113 positions in 3 chunks of 64: the second sequence's last split is
    empty), 17 heads in a 32-head tile."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    r = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=dict(os.environ, TRITON_INTERPRET="1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(r.stdout.split()) == 1
