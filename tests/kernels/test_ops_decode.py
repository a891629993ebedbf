"""Decode-step OpSpecs (kernels/ops_decode.py): FLOP and byte counts worked by hand."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.kernels.ops import OPS, validate_params


def test_k3_routed_experts_batch_one_by_hand():
    """K3, EP1, B = 1: 16 distinct experts (E(1-(1-k/E)^1) = k). One expert's MXFP4 weights:
    3 x 3584 x 3072 x 4.25 / 8 = 17,547,264 B (the issue's 17.55 MB); 16 of them 280,756,224 B.
    Activations (bf16): x and the output 2 x 3584, h written+read 2 x 16 x 3072, per-pair outputs
    2 x 16 x 3584: 220,160 elements = 440,320 B. FLOP 2 x 16 x 3 x 3584 x 3072 = 1,056,964,608.
    Over K3's 92 MoE layers the weights are 25.83 GB per token (the issue's 25.8 GB)."""
    p = dict(B=1, E=896, K=3584, N=3072, topk=16)
    spec = OPS["moe_mxfp4_decode"]
    assert spec.bytes(p) == pytest.approx(280_756_224 + 440_320)
    assert spec.flop(p) == 1_056_964_608
    assert 92 * 280_756_224 == pytest.approx(25.83e9, rel=1e-3)
    # the same routing in bf16 and fp8 moves 2 / 0.53125 and 1 / 0.53125 times the weight bytes
    assert OPS["moe_ffn_grouped_bf16"].bytes(p) == pytest.approx(16 * 3 * 3584 * 3072 * 2 + 440_320)
    assert OPS["moe_ffn_grouped_fp8"].bytes(p) == pytest.approx(16 * 3 * 3584 * 3072 + 440_320)
    assert OPS["moe_ffn_grouped_fp8"].dtype == "fp8"


def test_mla_decode_by_hand():
    """B = 4, C = 32768, H = 12: latent cache 4 x 32768 x 576 x 2 B = 150,994,944 B; q + out
    4 x 12 x 1088 x 2 B = 104,448 B; FLOP 2 x 4 x 12 x 32768 x 1088 = 3,422,552,064."""
    p = dict(B=4, C=32768, H=12)
    assert OPS["mla_decode"].bytes(p) == 150_994_944 + 104_448
    assert OPS["mla_decode"].flop(p) == 3_422_552_064


def test_small_op_bytes_by_hand():
    assert OPS["rmsnorm"].bytes(dict(T=4, D=7168)) == 2 * (2 * 4 * 7168 + 7168)
    assert OPS["silu_mul"].bytes(dict(T=4, N=3072)) == 2 * 3 * 4 * 3072
    assert OPS["residual_add"].bytes(dict(T=4, D=7168)) == 2 * 3 * 4 * 7168
    assert OPS["router_topk"].bytes(dict(T=2, E=896, topk=16)) == 4 * 2 * 896 + 4 * 896 + 12 * 2 * 16
    assert OPS["embedding"].bytes(dict(T=2, D=2304)) == 2 * 2 * 2 * 2304 + 16


def test_topk_above_e_is_refused_naming_topk():
    with pytest.raises(InputError) as e:
        validate_params(OPS["moe_mxfp4_decode"], dict(B=1, E=8, K=64, N=64, topk=9))
    assert e.value.field == "topk"
    with pytest.raises(InputError):
        validate_params(OPS["router_topk"], dict(T=1, E=8, topk=9))
