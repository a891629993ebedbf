"""The training glue calibration as the model uses it (`step/glue.py`): which calls it scales, the profile's
calibration by default, carried to another profile, a broken calibration file is bad input. Its fit and the
whole-step check it is judged by are validation (tests/validation)."""

from __future__ import annotations

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.configs.profiles import profiles_dir
from k3sim.step.calls import Call, Timer
from k3sim.step.glue import GLUE_FILE, GlueCalibration, load_glue
from k3sim.step.training import _call_costs, training_layer_costs


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200")


def test_glue_scales_proxy_calls_only(h200):
    timer = Timer(h200)
    proxy = Call("moe_permute", "moe_permute", {"T": 4096, "D": 2304}, proxy_bytes=2 * 4096 * 8 * 2304 * 2)
    gemm = Call("x", "gemm_bf16", {"M": 4096, "N": 4096, "K": 2304})
    f1, b1, w1 = _call_costs(timer, proxy, GlueCalibration.proxy())
    f3, b3, w3 = _call_costs(timer, proxy, GlueCalibration(3.0, 5.0))
    assert (f3, b3, w3) == pytest.approx((3 * f1, 5 * b1, 0.0))
    assert b1 == pytest.approx(2 * f1)  # the small-op backward: twice the forward's bytes
    assert _call_costs(timer, gemm, GlueCalibration(3.0, 5.0)) == _call_costs(timer, gemm, None)
    # a proxy-priced op outside the fitted glue families (the gated norm, "norms") keeps its plain proxy
    norm = Call("kda_out_norm", "gated_rmsnorm", {"T": 4096, "D": 128}, proxy_bytes=3 * 4096 * 128 * 2)
    assert timer.row(norm, 0).source.startswith("proxy")
    assert _call_costs(timer, norm, GlueCalibration(3.0, 5.0)) == _call_costs(timer, norm, GlueCalibration.proxy())


def test_training_layer_costs_use_the_profile_calibration_by_default(h200):
    model = load_model(str(profiles_dir().parent / "models" / "kimi-linear-48b.yaml"))
    kw = dict(tp=1, ep=1, tokens=4096, seq_len=4096)
    default = training_layer_costs(model, h200, **kw)
    calibrated = training_layer_costs(model, h200, glue=load_glue(h200), **kw)
    plain = training_layer_costs(model, h200, glue=GlueCalibration.proxy(), **kw)
    moe = [i for i, c in enumerate(default) if c.kind == "kda"][-1]
    assert default[moe] == calibrated[moe]
    assert default[moe].forward_s > 1.1 * plain[moe].forward_s


def test_load_glue_carries_h200_to_an_uncalibrated_profile_and_says_so(h200):
    own = load_glue(h200)
    other = load_glue(load_hardware("gb200-nvl72"))
    assert "carried" not in own.source and "carried to profile 'gb200-nvl72'" in other.source
    assert (other.fwd, other.bwd) == (own.fwd, own.bwd)


@pytest.mark.parametrize("text, field", [
    ("fwd: ten\nbwd: 6\nrun: r\nconfig: c\npoints: [1x1]\n", "fwd"),
    ("fwd: 10\nbwd: -3\nrun: r\nconfig: c\npoints: [1x1]\n", "bwd"),
    ("fwd: 10\nbwd: 6\nconfig: c\npoints: [1x1]\n", "run"),
    ("fwd: [10\n", None),
    ("- 10\n", None),
    ("fwd: 10\nbwd: 6\nrun: r\nconfig: c\npoints: [4096]\n", "points"),
])
def test_a_broken_glue_file_is_bad_input_naming_file_and_field(tmp_path, h200, text, field):
    from k3sim.errors import InputError

    (tmp_path / GLUE_FILE).write_text(text)
    hw = h200.model_copy(update={"calibration_dir": str(tmp_path)})
    with pytest.raises(InputError) as ei:
        load_glue(hw)
    assert str(tmp_path / GLUE_FILE) in str(ei.value)
    if field:
        assert ei.value.field == field


def test_moe_glue_mode_is_checked(h200):
    from k3sim.errors import InputError
    from k3sim.step.glue import glue_for

    assert glue_for(h200, "proxy") == GlueCalibration.proxy()
    assert glue_for(h200, "calibrated") == load_glue(h200)
    with pytest.raises(InputError, match="calibrated or proxy"):
        glue_for(h200, "fused")
