"""`training.precision: fp8` in the step model (issue 22 item 2): the precision reaches the layer costs, MFU stays
counted against the bf16 peak, a profile without FP8 is refused naming the field."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from fakes import fake_kernel_time, fake_layer_costs  # noqa: E402
from memory_toys import toy_model  # noqa: E402

from k3sim.configs import load_hardware, load_model  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.errors import InputError  # noqa: E402
from k3sim.step.glue import GlueCalibration  # noqa: E402
from k3sim.step.training import training_layer_costs  # noqa: E402
from k3sim.training import TrainOptions, train_step  # noqa: E402

H200 = load_hardware("h200")
FP8_SCALE = 0.6  # the fake layer costs' fp8 / bf16 factor


def costs_by_precision(scale: float = FP8_SCALE):
    """The hand-set layer costs (4 layers x 1 + 1 + 0.5 s), times `scale` under fp8."""
    base = fake_layer_costs()

    def costs(model, hw, *, precision="bf16", **kw):
        k = scale if precision == "fp8" else 1.0
        return [replace(c, forward_s=k * c.forward_s, backward_input_s=k * c.backward_input_s,
                        backward_weight_s=k * c.backward_weight_s) for c in base(model, hw, **kw)]
    return costs


def toy_step(precision: str, hw=H200):
    return train_step(toy_model(), hw, Parallelism(), seq_len=64, num_micro_batches=3, activation_checkpointing=False,
                      options=TrainOptions(precision=precision, use_pipeline_engine=False),
                      kernel_time=fake_kernel_time(), layer_costs=costs_by_precision(), with_memory=False)


def test_the_precision_reaches_the_layer_costs_and_mfu_stays_on_the_bf16_peak():
    b, f = toy_step("bf16"), toy_step("fp8")
    # one GPU, no communication: 3 micro-batches x 4 layers x 2.5 s, x 0.6 under fp8
    assert b.step_time_s == pytest.approx(3 * 4 * 2.5)
    assert f.step_time_s == pytest.approx(3 * 4 * 2.5 * FP8_SCALE)
    # the same model FLOP over the same bf16 peak: MFU rises by exactly the step-time ratio
    assert f.model_flop_per_step == b.model_flop_per_step
    assert f.mfu == pytest.approx(b.mfu / FP8_SCALE, rel=1e-12)
    # against the H200's dense bf16 peak, 989 TFLOP/s (datasheet), not its 1979 TFLOP/s fp8 peak
    assert f.mfu == pytest.approx(f.model_flop_per_step / (f.step_time_s * 989e12), rel=1e-3)
    assert (b.options["precision"], f.options["precision"]) == ("bf16", "fp8")
    rows = [a["assumption"] for a in f.assumptions if a["assumption"].startswith("FP8 training")]
    assert len(rows) == 1 and "LM head" in rows[0] and "router" in rows[0]
    assert not [a for a in b.assumptions if a["assumption"].startswith("FP8 training")]


def test_fp8_on_a_profile_without_an_fp8_peak_is_refused_naming_the_field():
    no_fp8 = H200.model_copy(update={"name": "h200-no-fp8",
                                     "peak_flops_per_s": {"bf16": 989e12, "fp16": 989e12}})
    with pytest.raises(InputError) as err:
        toy_step("fp8", no_fp8)
    assert err.value.field == "training.precision"
    assert "h200-no-fp8" in err.value.reason and "training.precision: bf16" in err.value.reason
    assert toy_step("bf16", no_fp8).step_time_s == pytest.approx(30.0)  # bf16 needs no FP8


def test_k3_step_under_fp8_is_its_fp8_layer_costs():
    """K3 at 32K on TP8 x EP8 with ZeRO-1 over DP 8 (pp 1, no recompute; DP shards the optimizer states, which one
    stage of all 93 layers needs to stay under the 1 TiB a kernel may stream): the step's forward and backward rows are
    the micro-batch count times the sum of `training_layer_costs` at that precision; FP8's rows are the smaller,
    and the step is faster."""
    k3 = load_model("models/kimi-k3.yaml")
    par = Parallelism(tp=8, ep=8, dp=8, zero_stage=1)
    glue = GlueCalibration.proxy()
    steps, layer_sums = {}, {}
    for prec in ("bf16", "fp8"):
        steps[prec] = train_step(k3, H200, par, seq_len=32768, num_micro_batches=2, activation_checkpointing=False,
                                 options=TrainOptions(precision=prec, moe_glue="proxy", use_pipeline_engine=False),
                                 with_memory=False)
        costs = training_layer_costs(k3, H200, tp=8, ep=8, tokens=32768, seq_len=32768, glue=glue, precision=prec)
        layer_sums[prec] = (sum(c.forward_s for c in costs), sum(c.backward_s for c in costs))
    for prec, r in steps.items():
        rows = {row.component: row.seconds for row in r.breakdown}
        assert rows["compute: forward"] == pytest.approx(2 * layer_sums[prec][0], rel=1e-9)
        assert rows["compute: backward"] == pytest.approx(2 * layer_sums[prec][1], rel=1e-9)
    assert sum(layer_sums["fp8"]) < sum(layer_sums["bf16"])
    assert steps["fp8"].step_time_s < steps["bf16"].step_time_s
