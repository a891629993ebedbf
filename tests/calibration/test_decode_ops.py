"""The small decode-step kernels (`k3sim.calibration.decode_ops`) on hand-worked values (CPU torch)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from k3sim.calibration import decode_ops as ops  # noqa: E402


def test_rmsnorm_by_hand():
    """x = [3, 4]: mean square 12.5, 1/sqrt(12.5) = 0.28284; weight [1, 2] -> [0.84853, 2.26274]."""
    out = ops.rmsnorm(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0]), eps=0.0)
    assert out[0].tolist() == pytest.approx([0.848528, 2.262742], rel=1e-5)


def test_silu_mul_by_hand():
    """gate 1, up 3: silu(1) = 1 / (1 + e^-1) = 0.731059, times 3."""
    out = ops.silu_mul(torch.tensor([[1.0, 0.0, 3.0, 5.0]]))
    assert out[0].tolist() == pytest.approx([3 * 0.731059, 0.0], rel=1e-5)


def test_rope_rotates_pairs_by_position():
    """D = 4, theta = 10000 tables: position 0 is the identity; at position 1 the first pair (x1, x3)
    turns by 1 rad: (1, 0) -> (cos 1, sin 1)."""
    cos, sin = ops.rope_cache(4, 4, "cpu", theta=10000.0)
    x = torch.tensor([[[1.0, 2.0, 0.0, 5.0]]]).repeat(2, 1, 1)
    out = ops.rope(x, torch.tensor([0, 1]), cos, sin)
    assert out[0, 0].tolist() == pytest.approx([1.0, 2.0, 0.0, 5.0])
    assert out[1, 0, 0].item() == pytest.approx(math.cos(1.0), rel=1e-5)
    assert out[1, 0, 2].item() == pytest.approx(math.sin(1.0), rel=1e-5)


def test_router_picks_on_biased_scores_and_weights_by_unbiased():
    """Scores sigmoid([0, 2, 1]) = [0.5, 0.881, 0.731]; a bias of +1 on expert 0 makes it win with
    expert 1; weights renormalise the unbiased scores: 0.5 / 1.381 and 0.881 / 1.381, times scale 2."""
    ids, w = ops.router_topk(torch.tensor([[0.0, 2.0, 1.0]]), torch.tensor([1.0, 0.0, 0.0]), 2, scale=2.0)
    assert sorted(ids[0].tolist()) == [0, 1]
    s0, s1 = 0.5, 1 / (1 + math.exp(-2))
    got = dict(zip(ids[0].tolist(), w[0].tolist()))
    assert got[0] == pytest.approx(2 * s0 / (s0 + s1), rel=1e-5)
    assert got[1] == pytest.approx(2 * s1 / (s0 + s1), rel=1e-5)


def test_residual_add_is_in_place_and_embedding_gathers():
    res = torch.ones(2, 3)
    out = ops.residual_add(torch.full((2, 3), 2.0), res)
    assert out is res and res.tolist() == [[3.0] * 3] * 2
    table = torch.arange(12.0).reshape(4, 3)
    assert ops.embedding(torch.tensor([2, 0]), table).tolist() == [[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]


@pytest.mark.parametrize("op", list(ops.OPS))
def test_every_measured_op_has_a_case_and_an_opspec(op):
    """The harness cases run on CPU, and each op is registered in the predictor with the same params."""
    from k3sim.kernels.ops import OPS

    shape = ops.SHAPES[op][0]
    if op == "embedding":  # the table (VOCAB x D) is large for a unit test: a small one through `shared`
        shared = {("emb", shape["D"]): torch.randn(16, shape["D"]).to(torch.bfloat16)}
    else:
        shared = {}
    fn, nbytes = ops.make_case(op, dict(T=3, **shape), "cpu", shared=shared)
    if op == "embedding":  # ids index the 163840-row vocabulary: gather from the small table by hand instead
        assert nbytes == 2 * 2 * 3 * shape["D"] + 8 * 3  # rows read and written (bf16) + the int64 ids
    else:
        fn()
    assert OPS[op].params == ops.OPS[op]
    # the harness sizes its operand sets on the predictor's bytes: one formula, not a second copy
    assert nbytes == OPS[op].bytes(dict(T=3, **shape))
