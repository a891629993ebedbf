"""MFU reads the one model-FLOP count (k3sim.memory.flops) and HFU the hardware count, on K3 with a hand-set
clock so that the step time, and so MFU and HFU, are worked out on paper."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakes import fake_kernel_time, fake_layer_costs  # noqa: E402

from k3sim.configs import load_hardware  # noqa: E402
from k3sim.configs.loaders import load_model  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.training import TrainOptions, train_step  # noqa: E402

H200 = load_hardware("h200")   # bf16 peak 989e12 FLOP/s
K3 = load_model(Path(__file__).parents[2] / "models" / "kimi-k3.yaml")
S = 32_768
# one GPU, one micro-batch of one 32K sequence, constant clock: 93 layers x (1 + 1 + 0.5) s = 232.5 s
# without recompute, 93 x (1 + 1 + 1 + 0.5) = 325.5 s with (the forward runs again)
STEP_S, STEP_RECOMPUTE_S = 232.5, 325.5
PEAK = 989e12


def run(model, recompute=False):
    return train_step(model, H200, Parallelism(), seq_len=S, activation_checkpointing=recompute,
                      options=TrainOptions(use_pipeline_engine=False), kernel_time=fake_kernel_time(),
                      layer_costs=fake_layer_costs(), with_memory=False)


def test_k3_mfu_by_hand():
    r = run(K3)
    assert r.step_time_s == pytest.approx(STEP_S)
    assert H200.peak_flops_per_s["bf16"] == PEAK
    # 32,768 tokens x 701,223,706,176 FLOP (tests/memory/test_flops.py) / (232.5 s x 989e12) = 0.099928
    assert r.mfu == pytest.approx(32_768 * 701_223_706_176 / (STEP_S * PEAK), rel=1e-9)
    assert r.mfu == pytest.approx(0.0999280, abs=1e-7)


def test_mfu_moves_with_the_mla_head_dim_by_hand():
    """v_head_dim 128 -> 64 removes, per MLA layer, 96 x 64 x (512 kv_b + 7,168 o_proj + 7,168 output gate)
    = 91,226,112 weights (x 24 = 2,189,426,688 active), and 3 x 24 x 96 x 64 x S attention FLOP per token:
    6 x 2,189,426,688 + 442,368 x 32,768 = 13,136,560,128 + 14,495,514,624 = 27,632,074,752 FLOP per token;
    MFU falls by 32,768 x that / (232.5 s x 989e12) = 0.0039377. (The old count, 3.5 x sdpa at D = 192 for
    both products, did not see V at all in the attention term.)"""
    narrow = K3.model_copy(update={"mla": K3.mla.model_copy(update={"v_head_dim": 64})})
    a, b = run(K3), run(narrow)
    assert a.step_time_s == b.step_time_s == pytest.approx(STEP_S)
    assert a.mfu - b.mfu == pytest.approx(32_768 * 27_632_074_752 / (STEP_S * PEAK), rel=1e-9)
    assert a.mfu - b.mfu == pytest.approx(0.0039377, abs=1e-7)


def test_k3_hfu_by_hand_with_recompute():
    """Hardware FLOP per token at 32K: GEMMs 2 N = 208,379,196,608 forward, x 3 + one recomputed forward = 4 x;
    MLA sdpa at D = 192 (the kernel's head dim): forward 24 x 2 S x 96 x 192 = 884,736 S, FlashAttention's
    fwd+bwd 3.5 x = 3,096,576 S, + the recomputed forward: 3,981,312 S = 130,459,631,616; KDA chunkwise
    1,202,847,744 forward, x 3 + 1 = 4,811,390,976. Total 833,516,786,432 + 130,459,631,616 + 4,811,390,976
    = 968,787,809,024 per token; without recompute 625,137,589,824 + 101,468,602,368 + 3,608,543,232
    = 730,214,735,424."""
    r = run(K3, recompute=True)
    assert r.step_time_s == pytest.approx(STEP_RECOMPUTE_S)
    assert r.hardware_flop_per_step == pytest.approx(32_768 * 968_787_809_024, rel=1e-12)
    assert r.hfu == pytest.approx(32_768 * 968_787_809_024 / (STEP_RECOMPUTE_S * PEAK), rel=1e-9)
    assert r.model_flop_per_step == pytest.approx(32_768 * 701_223_706_176, rel=1e-12)   # recompute is not model FLOP
    plain = run(K3)
    assert plain.hardware_flop_per_step == pytest.approx(32_768 * 730_214_735_424, rel=1e-12)
    assert plain.hfu > plain.mfu and r.hfu > r.mfu
