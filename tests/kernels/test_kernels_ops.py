"""Op registry: FLOP and byte formulas, parameter checks."""

from __future__ import annotations

import itertools

import pytest

from k3sim.errors import InputError
from k3sim.kernels.ops import (OPS, expected_distinct_experts, get_op, kda_fwd_flop_per_token_head, validate_params,
                               wire_bytes)


def test_gemm_counts():
    """M=64, N=7168, K=2048, worked by hand: 2MNK = 1,879,048,192 FLOP; bf16 A (131,072) + B (14,680,064)
    + C (458,752) elements x 2 B = 30,539,776 B; fp8 inputs 1 B, bf16 output: 15,728,640 B."""
    p = dict(M=64, N=7168, K=2048)
    assert OPS["gemm_bf16"].flop(p) == 1_879_048_192
    assert OPS["gemm_bf16"].bytes(p) == 30_539_776
    assert OPS["gemm_fp8"].bytes(p) == 15_728_640


def test_one_chunk_kda_flop_formula():
    """C = 64, K = V = 128 by hand: parallel 2 x 64^2 x (3 x 128 + 2 x 128) + 64^3 / 3 = 5,330,261.33 per
    chunk, serial 3 x 2 x 64 x 128^2 = 6,291,456; per token (sum / 64) 181,589.33. cp/flops.py reads it."""
    from k3sim.cp.flops import chunk_fwd_flops

    assert kda_fwd_flop_per_token_head() == pytest.approx(181_589.333, abs=1e-3)
    f = chunk_fwd_flops()
    assert f["serial"] == 6_291_456 and f["parallel"] == pytest.approx(5_330_261.333, abs=1e-3)
    assert OPS["gemm_fp8"].dtype == "fp8"


def test_moe_distinct_experts_limits():
    assert expected_distinct_experts(1, 896, 16) == pytest.approx(16)
    assert expected_distinct_experts(10 ** 6, 896, 16) == pytest.approx(896)
    # B=64 tokens x top-16 of 896: 896 (1 - (1 - 1/56)^64) = 613.2 experts (worked by hand)
    assert expected_distinct_experts(64, 896, 16) == pytest.approx(613.2, abs=0.1)
    # exact against enumeration: 2 tokens, each picking 2 of 4 experts; every pair of choices alike
    picks = list(itertools.combinations(range(4), 2))
    mean = sum(len(set(a) | set(b)) for a in picks for b in picks) / len(picks) ** 2
    assert mean == 3.0 and expected_distinct_experts(2, 4, 2) == pytest.approx(mean)
    p = dict(B=1, E=896, K=3584, N=6144, topk=16)
    assert OPS["moe_grouped_bf16"].flop(p) == 2 * 16 * 3584 * 6144
    assert OPS["moe_grouped_bf16"].bytes(p) == pytest.approx(2 * (16 * 3584 * 6144 + 16 * (3584 + 6144)))


def test_kda_counts():
    # 5 C x C x D and 3 C x D x D products per chunk plus the C^3/3 inverse, per token-head
    assert kda_fwd_flop_per_token_head() == pytest.approx(10 * 64 * 128 + 6 * 128 * 128 + 64 * 64 / 3)
    p = dict(T=4096, H=96)
    assert OPS["chunk_kda_fwd_bwd"].flop(p) == pytest.approx(3 * OPS["chunk_kda_fwd"].flop(p))
    # padding to whole chunks
    assert OPS["chunk_kda_fwd"].flop(dict(T=65, H=1)) == OPS["chunk_kda_fwd"].flop(dict(T=128, H=1))
    dec = dict(B=32, T=1, H=96)
    state = 32 * 96 * 128 * 128 * 4 * 2
    assert state <= OPS["recurrent_kda_decode"].bytes(dec) <= 1.05 * state


def test_sdpa_counts():
    p = dict(T=4096, H=32, D=128)
    assert OPS["sdpa_causal_fwd"].flop(p) == 4 * 4096 ** 2 * 32 * 128 / 2
    assert OPS["sdpa_causal_fwd_bwd"].flop(p) == pytest.approx(3.5 * OPS["sdpa_causal_fwd"].flop(p))


@pytest.mark.parametrize("op,n,factor", [("all_gather", 8, 7), ("reduce_scatter", 4, 3), ("all_reduce", 8, 2 * 7 / 8),
                                         ("all_to_all", 8, 7 / 8), ("send_recv", 2, 1)])
def test_wire_bytes_bus_factors(op, n, factor):
    assert wire_bytes(op, 1000, n) == pytest.approx(1000 * factor)
    assert OPS[op].bytes(dict(bytes=1000, gpus=n)) == pytest.approx(1000 * factor)


def test_every_contract_op_is_registered():
    contract = ["gemm_bf16", "gemm_fp8", "hbm_copy", "hbm_read", "moe_grouped_bf16", "chunk_kda_fwd",
                "chunk_kda_fwd_bwd", "recurrent_kda_decode",
                "sdpa_causal_fwd", "sdpa_causal_fwd_bwd", "all_gather", "reduce_scatter", "all_reduce", "all_to_all",
                "send_recv", "custom_all_reduce",
                # decode-step kernels (issue 10, kernels/ops_decode.py)
                "moe_mxfp4_decode", "moe_ffn_grouped_bf16", "moe_ffn_grouped_fp8", "mla_decode", "rmsnorm",
                "mla_decode_flashmla",  # FlashMLA from its published throughput (k3sim/kernels/published.py)
                "silu_mul", "rope", "router_topk", "residual_add", "embedding",
                # EP dispatch / combine (issue 21; answered by k3sim/comm/ep.py, tests/comm/test_ep.py)
                "ep_dispatch", "ep_combine",
                # around the dispatch, deployed expert GEMMs (issue 21 item 5, calibration/deployed.py)
                "fp8_quant_128", "ep_permute", "ep_unpermute", "moe_grouped_fp8",
                # training (issue 22, calibration/train_fp8.py): block-scaled FP8 GEMM, fused routing glue
                "gemm_fp8_block", "fp8_quant_128_t", "moe_permute_fused", "moe_permute_fused_bwd",
                "moe_unpermute_fused", "moe_unpermute_fused_bwd",
                # hybrid models' mixers (issue 23 item 4, calibration/hybrid_ops.py)
                "chunk_gdn_fwd", "chunk_gdn_fwd_bwd", "recurrent_gdn_decode", "mamba2_chunk_fwd",
                "mamba2_chunk_fwd_bwd", "gqa_prefill_fwd", "mamba2_decode", "gqa_decode", "router_softmax_topk",
                "shared_expert_gate", "gqa_decode_paged"]
    assert sorted(OPS) == sorted(contract)
    for spec in OPS.values():
        p = {k: min(hi, max(lo, 64 if k != "gpus" else 2)) for k, (lo, hi) in spec.ranges.items()}
        p = validate_params(spec, p)
        assert spec.flop(p) >= 0 and spec.bytes(p) > 0


@pytest.mark.parametrize("params,match", [
    (dict(M=1, N=2), "missing parameter"),
    (dict(M=1, N=2, K=3, X=4), "unknown parameter"),
    (dict(M=0, N=2, K=3), "outside the allowed range"),
    (dict(M=1.5, N=2, K=3), "not an integer"),
    (dict(M="abc", N=2, K=3), "not an integer"),
])
def test_bad_params(params, match):
    with pytest.raises(InputError, match=match):
        validate_params(OPS["gemm_bf16"], params)


def test_bad_op_and_cross_checks():
    with pytest.raises(InputError, match="unknown op"):
        get_op("gemm_bf17")
    with pytest.raises(InputError, match="topk"):
        validate_params(OPS["moe_grouped_bf16"], dict(B=1, E=8, K=64, N=64, topk=9))
    with pytest.raises(InputError, match="allowed range"):
        validate_params(OPS["all_reduce"], dict(bytes=1024, gpus=1))
    assert validate_params(OPS["gemm_bf16"], dict(M="64", N=7168.0, K="2048")) == dict(M=64, N=7168, K=2048)


def test_kda_decode_counts():
    """Hand-computed from the formulas' docstrings, D = 128."""
    D = 128
    dec = dict(B=4, T=2, H=8)
    assert OPS["recurrent_kda_decode"].flop(dec) == 7 * D * D * 4 * 2 * 8
    assert OPS["recurrent_kda_decode"].bytes(dec) == 4 * 8 * D * D * 4 * 2 + 4 * 2 * 8 * (5 * D * 2 + 2)
