"""Expert traffic formulas against the issue's hand-worked K3 facts."""

import pytest

from k3sim.configs import load_model
from k3sim.step.experts import (distinct_experts, expected_distinct_skewed, routed_bytes_per_step,
                                routed_expert_bytes, zipf_weights)

K3 = load_model("models/kimi-k3.yaml")


@pytest.mark.parametrize("batch, expected", [(1, 16), (8, 120), (32, 393), (64, 613), (128, 807)])
def test_k3_distinct_experts_uniform(batch, expected):
    # issue #10 "Facts the model must reproduce": about 16 / 120 / 393 / 613 / 807
    assert distinct_experts(batch, 896, 16) == pytest.approx(expected, abs=0.6)


def test_one_k3_expert_is_17_55_mb_in_mxfp4():
    # 3 x 3584 x 3072 weights x 4.25 bits / 8 = 17,547,264 B
    assert routed_expert_bytes(K3) == pytest.approx(3 * 3584 * 3072 * 4.25 / 8)
    assert routed_expert_bytes(K3) == pytest.approx(17.55e6, rel=1e-3)


def test_batch_one_token_reads_25_8_gb_of_routed_weights():
    assert routed_bytes_per_step(K3, 1) == pytest.approx(25.8e9, rel=2e-3)


def test_skewed_routing_touches_fewer_experts_and_uniform_weights_reduce_to_the_formula():
    uniform = expected_distinct_skewed(64, [1 / 896] * 896, 16)
    assert uniform == pytest.approx(distinct_experts(64, 896, 16), rel=1e-12)
    skewed = distinct_experts(64, 896, 16, zipf=1.0)
    assert skewed < uniform - 50  # hot experts absorb many picks: far fewer distinct experts
    w = zipf_weights(4, 1.0)  # 1, 1/2, 1/3, 1/4 normalised by 25/12
    assert w == pytest.approx([12 / 25, 6 / 25, 4 / 25, 3 / 25])


def test_zero_tokens_touch_no_expert():
    assert distinct_experts(0, 896, 16) == 0.0
