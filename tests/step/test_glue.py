"""The training glue calibration as the model uses it (`step/glue.py`): which calls it scales, the profile's
calibration by default, carried to another profile and labelled so, the fused permute path (measured kernels
for the MoE permute / combine, the rest as calibrated), the `moe_glue` modes, a broken calibration file is bad
input. Its fit and the whole-step check it is judged by are validation (tests/validation)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.configs.profiles import profiles_dir
from k3sim.step import glue as G
from k3sim.step.calls import Call, Timer
from k3sim.step.glue import FUSED_GLUE_OPS, GLUE_FILE, GlueCalibration, glue_for, load_glue
from k3sim.step.training import _call_costs, training_layer_costs

MODELS = profiles_dir().parent / "models"
GOOD = ("fwd: 10\nbwd: 6\npoints: [a:1x1, b:2x1]\nruns: {a:1x1: r1, b:2x1: r2}\n"
        "per_config: {a: {fwd: 9, bwd: 5}, b: {fwd: 11, bwd: 7}}\n")


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200")


def fake_kernel_time(table, unmeasured=()):
    """kernel_time returning `table[op]` seconds, source "measured" (hand-set numbers); the ops in
    `unmeasured` answer as the predictor does for an op with no measurements on the profile."""
    def kt(op, params, hardware=None, convention=None):
        return SimpleNamespace(seconds=table.get(op, 1.0),
                               source="datasheet-roofline" if op in unmeasured else "measured", detail="")
    return kt


FUSED_OPS = ("moe_permute_fused", "moe_permute_fused_bwd", "moe_unpermute_fused", "moe_unpermute_fused_bwd")


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


def test_fused_path_falls_back_to_the_measured_dispatch_kernels_while_ours_are_unmeasured(h200):
    # Our fused ops registered but without measurements: permute = ep_permute forward, ep_unpermute backward;
    # combine the transpose. Hand-set kernel times: ep_permute 7 us, ep_unpermute 3 us per call; count 2.
    timer = Timer(h200, fake_kernel_time({"ep_permute": 7e-6, "ep_unpermute": 3e-6}, unmeasured=FUSED_OPS))
    fused = GlueCalibration(3.0, 5.0, fused=True)
    p = {"T": 4096, "topk": 2, "D": 3584}
    perm = Call("routed_experts_permute", "moe_permute", p, count=2, proxy_bytes=1.0)
    comb = Call("routed_experts_combine", "moe_combine", p, count=2, proxy_bytes=1.0)
    assert _call_costs(timer, perm, fused) == pytest.approx((14e-6, 6e-6, 0.0))
    assert _call_costs(timer, comb, fused) == pytest.approx((6e-6, 14e-6, 0.0))
    assert set(FUSED_GLUE_OPS) == {"moe_permute", "moe_combine"}
    # the other glue (short conv: a proxy-priced glue call) keeps the calibrated factors in fused mode
    conv = Call("kda_short_conv", "short_conv_unmeasured", {"T": 64}, proxy_bytes=1e6)
    assert _call_costs(Timer(h200), conv, fused) == _call_costs(Timer(h200), conv, GlueCalibration(3.0, 5.0))


def test_fused_path_uses_our_fused_kernels_where_measured(h200, monkeypatch):
    from k3sim.kernels import ops

    for name in FUSED_OPS:  # registered (by the GPU harness, or here)
        if name not in ops.OPS:
            monkeypatch.setitem(ops.OPS, name, ops.OPS["ep_permute"])
    timer = Timer(h200, fake_kernel_time(dict(zip(FUSED_OPS, (1e-6, 2e-6, 4e-6, 8e-6)))))
    p = {"T": 128, "topk": 8, "D": 7168}
    fused = GlueCalibration(fused=True)
    assert fused.fused_costs(timer, Call("c", "moe_permute", p)) == pytest.approx((1e-6, 2e-6, 0.0))
    assert fused.fused_costs(timer, Call("c", "moe_combine", p)) == pytest.approx((4e-6, 8e-6, 0.0))
    assert G.fused_kernels("moe_combine", timer) == ("moe_unpermute_fused", "moe_unpermute_fused_bwd", True)
    # one op of a pair unmeasured: the whole pair falls back
    half = Timer(h200, fake_kernel_time({}, unmeasured=("moe_unpermute_fused_bwd",)))
    assert G.fused_kernels("moe_combine", half) == ("ep_unpermute", "ep_permute", False)
    assert G.fused_kernels("moe_permute", half) == ("moe_permute_fused", "moe_permute_fused_bwd", True)


def test_fused_layer_costs_differ_from_calibrated_by_the_permute_and_combine_only(h200):
    # K3 layer (MoE), one rank of TP8 EP8 at 2048 tokens: fused - calibrated forward = the two calls' difference
    model = load_model(str(MODELS / "kimi-k3.yaml"))
    cal, fused = glue_for(h200, "calibrated"), glue_for(h200, "fused")
    kw = dict(tp=8, ep=8, tokens=2048, seq_len=2048)
    a, b = training_layer_costs(model, h200, glue=cal, **kw), training_layer_costs(model, h200, glue=fused, **kw)
    from k3sim.step.batch import Batch
    from k3sim.step.layers import layer_calls
    from k3sim.step.layout import StepLayout

    timer = Timer(h200)
    calls = [c for c in layer_calls(model, 4, StepLayout(tp=8, ep=8), Batch(prefill=((2048, 0),)), "grouped_bf16")
             if c.op in FUSED_GLUE_OPS]
    assert [c.op for c in calls] == ["moe_permute", "moe_combine"]
    d_fwd = sum(_call_costs(timer, c, cal)[0] - _call_costs(timer, c, fused)[0] for c in calls)
    d_bwd = sum(_call_costs(timer, c, cal)[1] - _call_costs(timer, c, fused)[1] for c in calls)
    lay = next(i for i, c in enumerate(a) if c.layer == 4)
    assert a[lay].forward_s - b[lay].forward_s == pytest.approx(d_fwd, rel=1e-9)
    assert a[lay].backward_input_s - b[lay].backward_input_s == pytest.approx(d_bwd, rel=1e-9)
    assert d_fwd > 0 and d_bwd > 0  # the unfused glue costs more than the measured kernels here
    emb = next(c for c in a if c.kind == "embedding")
    assert emb == next(c for c in b if c.kind == "embedding")  # no MoE glue there


def test_training_layer_costs_use_the_profile_calibration_by_default(h200):
    model = load_model(str(MODELS / "kimi-linear-48b.yaml"))
    kw = dict(tp=1, ep=1, tokens=4096, seq_len=4096)
    default = training_layer_costs(model, h200, **kw)
    calibrated = training_layer_costs(model, h200, glue=load_glue(h200), **kw)
    plain = training_layer_costs(model, h200, glue=GlueCalibration.proxy(), **kw)
    moe = [i for i, c in enumerate(default) if c.kind == "kda"][-1]
    assert default[moe] == calibrated[moe]
    assert default[moe].forward_s > 1.1 * plain[moe].forward_s


@pytest.mark.parametrize("name", ["gb200-nvl72", "h100-sxm", "h800"])
def test_load_glue_carries_h200_to_another_profile_and_says_so(h200, name):
    own = load_glue(h200)
    other = load_glue(load_hardware(name))
    assert "carried" not in own.source and own.carried_from == "" and "carried" not in own.note
    assert f"carried from h200 to profile '{name}'" in other.source and other.carried_from == "h200"
    assert "carried from h200" in other.note
    assert (other.fwd, other.bwd) == (own.fwd, own.bwd)
    fused = glue_for(load_hardware(name), "fused")
    assert "carried from h200" in fused.source and "carried from h200" in fused.note


def test_the_committed_calibration_has_its_spread(h200):
    g = load_glue(h200)
    assert len(g.per_config) >= 2 and len(g.fit_shapes()) == len(g.points) >= 2
    lo, hi = g.spread()["fwd"]
    assert lo < g.fwd < hi  # pooled: the mean of the configurations' own factors
    assert g.fwd == pytest.approx(sum(r[1] for r in g.per_config) / len(g.per_config), abs=1e-4)
    assert f"x {lo:.1f}-{hi:.1f} forward" in g.source


def test_a_glue_file_is_read_with_its_provenance(tmp_path, h200):
    (tmp_path / GLUE_FILE).write_text(GOOD)
    g = load_glue(h200.model_copy(update={"calibration_dir": str(tmp_path)}))
    assert (g.fwd, g.bwd, g.runs, g.points) == (10.0, 6.0, ("r1", "r2"), ("a:1x1", "b:2x1"))
    assert g.fit_shapes() == {("a", 1, 1), ("b", 2, 1)}
    assert g.spread() == {"fwd": (9.0, 11.0), "bwd": (5.0, 7.0)} and g.carried_from == ""


@pytest.mark.parametrize("text, field", [
    (GOOD.replace("fwd: 10", "fwd: ten"), "fwd"),
    (GOOD.replace("bwd: 6", "bwd: -3"), "bwd"),
    (GOOD.replace("runs: {a:1x1: r1, b:2x1: r2}\n", ""), "runs"),
    (GOOD.replace("b:2x1: r2", "b:2x1: 3"), "runs"),
    (GOOD.replace("points: [a:1x1, b:2x1]", "points: [4096x1]"), "points"),
    (GOOD.replace(", b: {fwd: 11, bwd: 7}", ""), "per_config"),
    (GOOD.replace("bwd: 7", "bwd: 0"), "per_config.b.bwd"),
    ("fwd: [10\n", None),
    ("- 10\n", None),
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


def test_moe_glue_modes(h200):
    from k3sim.errors import InputError

    k3 = load_model(str(MODELS / "kimi-k3.yaml"))
    dsv3 = load_model(str(MODELS / "deepseek-v3.yaml"))
    kimi = load_model(str(MODELS / "kimi-linear-48b.yaml"))
    assert glue_for(h200, "proxy") == GlueCalibration.proxy()
    assert glue_for(h200, "calibrated") == load_glue(h200)
    fused = glue_for(h200, "fused")
    assert fused == replace(load_glue(h200), fused=True, source=fused.source, fused_note=fused.fused_note)
    assert fused.fused_note == G.fused_source(h200) and fused.source.startswith(fused.fused_note)
    assert glue_for(h200, "auto", k3).fused and glue_for(h200, "auto", dsv3).fused  # published fused stacks
    assert glue_for(h200, "auto", kimi) == load_glue(h200)  # no published fused stack: calibrated
    assert G.resolve_mode("auto", k3) == "fused" and G.resolve_mode("auto", kimi) == "calibrated"
    with pytest.raises(ValueError, match="depends on the model"):
        glue_for(h200, "auto")
    with pytest.raises(InputError, match="calibrated or fused or proxy"):
        glue_for(h200, "unfused")


def test_a_refitted_file_is_read_again(tmp_path, h200):
    import os

    f = tmp_path / GLUE_FILE
    f.write_text(GOOD)
    hw = h200.model_copy(update={"calibration_dir": str(tmp_path)})
    assert load_glue(hw).fwd == 10.0
    f.write_text(GOOD.replace("fwd: 10", "fwd: 12"))
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a new version even within one clock tick
    assert load_glue(hw).fwd == 12.0 and glue_for(hw, "fused").fwd == 12.0


def test_the_glue_factors_are_not_carried_to_ops_no_fitted_run_built():
    """The whole-step runs build no Block AttnRes: its reads keep the plain proxy (factor 1), while the routing
    glue the fit measured takes the factors."""
    from k3sim.step.glue import is_glue

    assert not is_glue("attn_res_read")
    assert is_glue("moe_permute") and is_glue("moe_combine")
