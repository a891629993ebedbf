"""plan(): the sections of a training and a serving scenario, and the verdict of a layout that does not fit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest_helpers import ROOT, kl_train  # noqa: E402

from k3sim.errors import InputError  # noqa: E402
from k3sim.planner.plan import plan  # noqa: E402


def test_training_plan_sections_and_json(tmp_path):
    res = plan(kl_train(tmp_path), sections=("memory", "step", "calibration"))
    t = res.training
    assert res.mode == "train" and res.fits
    assert t.step_time_s == pytest.approx(sum(r.seconds for r in t.breakdown))
    assert 0 < t.mfu < 1
    # The plan's step is the step model's answer for the scenario's layout and workload (one source of
    # truth): tp 2, pp 2, ep 8, dp 4; 4 micro-batches of one 4096-token sequence, recompute on.
    from k3sim.configs.parallel import Parallelism
    from k3sim.planner.inputs import load
    from k3sim.training import TrainOptions, train_step

    inp = load(res.scenario_file)
    direct = train_step(inp.model, inp.hw, Parallelism(tp=2, pp=2, ep=8, dp=4), seq_len=4096,
                        micro_batch_size=1, num_micro_batches=4, activation_checkpointing=True,
                        options=TrainOptions(), with_memory=False)
    assert t.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12)
    assert t.mfu == pytest.approx(direct.mfu, rel=1e-12)
    j = res.to_json()
    assert j["step_time_s"] == t.step_time_s and j["mfu"] == t.mfu
    assert j["memory"]["mode"] == "train" and j["tokens_per_step"] == 4 * 4 * 4096
    assert j["tokens_per_s"] == pytest.approx(4 * 4 * 4096 / t.step_time_s)
    # every kernel the step called is listed with how its time was obtained
    ops = {k["op"] for k in res.kernel_calls}
    assert {"gemm_bf16", "chunk_kda_fwd", "all_gather", "reduce_scatter", "ep_dispatch", "ep_combine"} <= ops
    assert {c["op"] for c in res.calibration} <= ops and res.calibration
    assert res.notes["decode"] == "not applicable to a training scenario"


def test_training_section_options_reach_the_step_model(tmp_path):
    base = plan(kl_train(tmp_path), sections=("step",)).training
    skew = plan(kl_train(tmp_path, training="  routing_skew: 1.2"), sections=("step",)).training
    moon = plan(kl_train(tmp_path, training="  routing_skew: 1.2\n  redundant_experts: 2"),
                sections=("step",)).training
    assert skew.ep_imbalance > 1.5 * base.ep_imbalance
    assert moon.ep_imbalance < 1.05 and moon.step_time_s < skew.step_time_s


def test_training_section_bad_field_named(tmp_path):
    with pytest.raises(InputError) as e:
        plan(kl_train(tmp_path, training="  tp_overlap: 2"), sections=("memory",))
    assert e.value.field == "training.tp_overlap"


def test_training_moe_glue_reaches_the_step_model_and_is_checked(tmp_path):
    base = plan(kl_train(tmp_path), sections=("step",)).training
    fused = plan(kl_train(tmp_path, training="  moe_glue: proxy"), sections=("step",)).training
    assert fused.compute_s < base.compute_s and fused.options["moe_glue"] == "proxy"
    with pytest.raises(InputError) as e:
        plan(kl_train(tmp_path, training="  moe_glue: unfused"), sections=("memory",))
    assert e.value.field == "training.moe_glue"


def test_serving_plan_that_does_not_fit_gives_the_verdict():
    res = plan(ROOT / "scenarios/k3-h200-1node.yaml", sections=("memory", "decode"))
    assert not res.fits
    assert res.verdict.startswith("does not fit") and "180.8 GB" in res.verdict
    assert res.notes["decode"].startswith("not computed: does not fit")
