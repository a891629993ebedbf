"""simulate_layout: options -> result, with the toy model and fake kernel/layer costs."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.pipeline import LayoutSpec, simulate_layout

from pipeline_toys import fake_kernel_time, fake_layer_costs, toy_gpu, toy_model


def run(**kw):
    spec = LayoutSpec(**{"stages": 2, "virtual": 1, "microbatches": 4, "tp": 1, "ep": 1, **kw})
    return simulate_layout(spec, toy_model(), toy_gpu(), kernel_time=fake_kernel_time,
                           layer_costs=fake_layer_costs)


def test_model_derived_end_to_end_with_encoder():
    r = run(schedule="1f1b", encoder_policy="bubble")
    assert r.step_time_s >= r.text_step_time_s > 0
    enc = r.extra["encoder"]
    assert enc["cp_mode"] == "dynamic" and enc["gpus"] == 1 and enc["cost_ratio"] > 0
    # two chunks of 4 layers (+ embedding / head), recompute: stage 0 forward 4.25 s, backward 12.25 s
    assert r.extra["model_stage_forward_s"] == pytest.approx((4.25 + 4.5) / 2)
    assert r.extra["attn_res"]["hop_blocks_resend_all"] == [3]


def test_encoder_cost_ratio_scales_the_mean_stage_forward():
    r = run(schedule="1f1b", encoder_policy="serial", encoder_cost=0.5)
    stage_f = (4.25 + 4.5) / 2
    assert r.encoder_compute_s == pytest.approx(4 * 0.5 * stage_f * 3)   # forward + 2x backward
    assert r.step_time_s == pytest.approx(r.text_step_time_s + r.encoder_compute_s)


@pytest.mark.parametrize("kw,option", [
    ({"microbatch_tokens": 1000, "seq_len": 4096}, "--microbatch-tokens"),
    ({"seed": -1}, "--seed"),
    ({"stages": 200, "microbatches": 2000, "uniform": (1.0, 2.0, None), "encoder_policy": "none"},
     "--microbatches"),
    ({"stages": 10000, "microbatches": 16, "uniform": (1.0, 2.0, None), "encoder_policy": "none"}, "--stages"),
    ({"tp": 3}, "--tp"),
    ({"stages": 3, "virtual": 3, "microbatches": 3, "schedule": "interleaved-1f1b"}, "--stages"),
    ({"encoder_cost": -1.0}, "--encoder-cost"),
    ({"encoder_policy": "both"}, "--encoder-policy"),
])
def test_bad_options_name_the_option(kw, option):
    with pytest.raises(InputError) as e:
        run(**kw)
    assert str(e.value).startswith(option)


def test_uniform_costs_need_no_model():
    spec = LayoutSpec(schedule="zb-h1", stages=4, microbatches=8, uniform=(1.0, 1.0, 1.0), encoder_policy="none")
    assert simulate_layout(spec).bubble_ratio == pytest.approx(3 / 24)
