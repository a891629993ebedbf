"""ViT cost from the kernel predictor, encoder CP (none / fixed / dynamic subgroups), image sampler."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.pipeline.encoder import ViTCost, encoder_step, encoder_steps, patches, sample_images

from pipeline_toys import fake_kernel_time, toy_gpu, toy_model


def vit():
    return ViTCost(toy_model().vision, toy_gpu(), fake_kernel_time)


def test_image_cost_hand_worked():
    # toy ViT: 2 layers, hidden 8, MLP 16, 2 heads of 4, patch 14, 3 channels; T = 100 patches
    gemm = 2 * 100 * (24 * 8 + 8 * 8 + 16 * 8 + 8 * 16) / 1e12
    att = 2 * (2 * 100 ** 2 * 2 * 4 / 1e12)            # bidirectional = 2 x causal
    att_b = 3.5 * att - att
    embed = 2 * 100 * 8 * 3 * 14 ** 2 / 1e12
    c = vit().image(100, 1)
    assert c.forward_s == pytest.approx(embed + 2 * (gemm + att))
    assert c.backward_s == pytest.approx(2 * embed + 2 * (2 * gemm + att_b))
    assert c.comm_forward_s == 0


def test_gather_kv_splits_compute_and_adds_an_all_gather_per_layer():
    one, two = vit().image(100, 1), vit().image(100, 2)
    shard = 50 * 2 * 8 * 2                              # T/c rows x K and V x hidden x bf16
    assert two.comm_forward_s == pytest.approx(2 * (1e-5 + shard / 1e9))
    assert two.forward_s - two.comm_forward_s == pytest.approx(one.forward_s / 2)


def test_dynamic_subgroups_balance_a_skewed_micro_batch():
    tokens = [4000, 100, 100, 100]
    none = encoder_step(vit(), tokens, 4, "none")
    fixed = encoder_step(vit(), tokens, 4, "fixed")
    dyn = encoder_step(vit(), tokens, 4, "dynamic")
    assert none.imbalance > 2.5 and none.comm_share == 0
    assert fixed.imbalance == pytest.approx(1.0)
    assert dyn.imbalance < none.imbalance
    assert dyn.forward_s < none.forward_s
    # small images stay whole under dynamic CP: less communication than splitting everything
    assert dyn.comm_share < fixed.comm_share


def test_sampler_is_seeded_and_patch_counts_round_up():
    a, b, c = sample_images(5, 7), sample_images(5, 7), sample_images(5, 8)
    assert a == b and a != c
    assert all(224 <= w <= 2048 and 224 <= h <= 2048 for mb in a for w, h in mb)
    assert patches(224, 225, 14) == 16 * 17


def test_encoder_steps_needs_a_vision_tower():
    m = toy_model().model_copy(update={"vision": None})
    with pytest.raises(InputError, match="no vision tower"):
        encoder_steps(m, toy_gpu(), 2, gpus=2, kernel_time=fake_kernel_time)


def test_unknown_cp_mode_is_bad_input():
    with pytest.raises(InputError, match="--encoder-cp"):
        encoder_step(vit(), [10], 2, "ring")


def test_dynamic_is_never_slower_than_none_or_fixed():
    import random

    rng = random.Random(3)
    v = vit()
    for _ in range(30):
        tokens = [rng.choice([50, 200, 900, 3000, 12000]) for _ in range(rng.randint(1, 7))]
        g = rng.choice([1, 2, 4, 8])
        t = {mode: encoder_step(v, tokens, g, mode) for mode in ("none", "fixed", "dynamic")}
        assert t["dynamic"].busiest_s <= min(t["none"].busiest_s, t["fixed"].busiest_s) * (1 + 1e-12)
        assert t["dynamic"].imbalance >= 1.0 - 1e-12
