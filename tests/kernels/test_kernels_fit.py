"""Fitting recovers known parameters; fitted.yaml round-trips and is used only while it matches the data."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import COLL_POINTS, GEMM_POINTS, HBM_POINTS, TRUE_AB, TRUE_GEMM, TRUE_HBM, hardware, write_run

from k3sim.errors import InputError
from k3sim.kernels.fit import FITTED_NAME, fit_profile, load_or_fit, read_fitted, write_fitted
from k3sim.kernels.model import RooflineFit, fit_alpha_beta, fit_roofline
from k3sim.kernels.ops import OPS
from k3sim.kernels.predict import clear_cache, profile_predictor
from k3sim.predict import predict_kernel_time
from k3sim.kernels.store import load_store


def test_roofline_fit_recovers_parameters(tmp_path):
    """Identifiable parameters come back: the compute efficiency (large GEMMs), the streaming efficiency
    and launch time (copies up to 4 GiB); the rest only as far as the fitted curve matches the truth."""
    write_run(tmp_path, "a", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS}, noise=0.005, seed=1)
    fp = fit_profile(load_store(tmp_path), hardware(tmp_path))
    gemm, hbm = fp.ops["gemm_bf16"].roofline, fp.ops["hbm_copy"].roofline
    assert gemm.eff_flop == pytest.approx(TRUE_GEMM.eff_flop, rel=0.06)  # trades a little with half_flop
    assert hbm.eff_bytes == pytest.approx(TRUE_HBM.eff_bytes, rel=0.03)
    assert fp.ops["gemm_bf16"].rms_log_error < 0.01
    assert fp.ops["gemm_bf16"].points_used == len(GEMM_POINTS)
    for p in [dict(M=2, N=5000, K=3000), dict(M=300, N=3000, K=5000), dict(M=30000, N=7168, K=2048)]:
        f, b = OPS["gemm_bf16"].flop(p), OPS["gemm_bf16"].bytes(p)
        assert gemm.seconds(f, b) == pytest.approx(TRUE_GEMM.seconds(f, b), rel=0.03)


def test_alpha_beta_fit_recovers_parameters():
    wire = np.array([2.0 ** e for e in range(8, 31)])
    t = TRUE_AB[2].seconds(wire) * np.exp(np.random.default_rng(0).normal(0, 0.01, wire.size))
    ab = fit_alpha_beta(wire, t)
    assert ab.alpha_s == pytest.approx(15e-6, rel=0.05)
    assert ab.bus_bandwidth_bytes_per_s == pytest.approx(350e9, rel=0.03)


def test_fitted_yaml_round_trip_and_staleness(tmp_path):
    write_run(tmp_path, "a", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS})
    hw = hardware(tmp_path)
    store = load_store(tmp_path)
    fp = fit_profile(store, hw)
    path = write_fitted(tmp_path / FITTED_NAME, fp)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
    back = read_fitted(path)
    assert back.data_fingerprint == store.fingerprint and back.ops["gemm_bf16"].runs == ["a"]
    assert back.ops["hbm_copy"].roofline.eff_bytes == pytest.approx(fp.ops["hbm_copy"].roofline.eff_bytes, rel=1e-5)
    _, note = load_or_fit(load_store(tmp_path), hw)
    assert note.startswith("fit of ")
    write_run(tmp_path, "b", {"hbm_copy": HBM_POINTS[:3], "all_gather": COLL_POINTS})
    _, note = load_or_fit(load_store(tmp_path), hw)
    assert "stale" in note
    clear_cache()  # a new run of hbm_copy makes only hbm_copy's fit stale
    assert "fit of" in predict_kernel_time("gemm_bf16", dict(M=100, N=7168, K=2048), hw).detail
    assert "stale" in predict_kernel_time("hbm_copy", dict(bytes=3 * 2 ** 20), hw).detail
    assert "absent" in predict_kernel_time("all_gather", dict(bytes=3 * 2 ** 20, gpus=2), hw).detail


def test_fitted_yaml_is_used_by_the_predictor(tmp_path):
    write_run(tmp_path, "a", {"hbm_copy": HBM_POINTS})
    hw = hardware(tmp_path)
    fp = fit_profile(load_store(tmp_path), hw)
    fp.ops["hbm_copy"].roofline.eff_bytes *= 0.5  # a hand-edited fit must show in model answers
    write_fitted(tmp_path / FITTED_NAME, fp)
    clear_cache()
    kt = predict_kernel_time("hbm_copy", dict(bytes=2 ** 38), hw)
    assert kt.source == "model" and "fit of" in kt.detail
    model = profile_predictor(hw).op("hbm_copy").model_seconds(dict(bytes=2 ** 38))[0]
    assert model == pytest.approx(2 * 2 ** 38 / (0.45 * 4e12), rel=0.06)
    clear_cache()


def test_corrupt_fitted_yaml(tmp_path):
    (tmp_path / FITTED_NAME).write_text("format: something-else\nops: {}\n")
    with pytest.raises(InputError, match="not a k3sim kernel fit"):
        read_fitted(tmp_path / FITTED_NAME)


def test_efficiency_exponent_on_head_dim_is_recovered():
    """SDPA's compute efficiency falls with head dim as a fitted power (a different kernel tile)."""
    spec = OPS["sdpa_causal_fwd_bwd"]
    rows = [dict(T=t, H=h, D=d) for d in (64, 128, 192) for h in (8, 32) for t in (2048, 8192, 32768, 65536)]
    flop = np.array([spec.flop(r) for r in rows])
    nbytes = np.array([spec.bytes(r) for r in rows])
    feats = spec.features(rows)
    true = RooflineFit(5e-5, 0.55, 1e10, 0.6, 0.8, 1e7, 0.7, 5.0, 1e15, 4e12, eff_exponents={"D": 0.9})
    got = fit_roofline(flop, nbytes, true.seconds(flop, nbytes, feats), 1e15, 4e12, feats=feats, names=("D",))
    assert got.eff_exponents["D"] == pytest.approx(0.9, abs=0.05)
    assert got.eff_flop == pytest.approx(0.55, rel=0.05)


@pytest.mark.parametrize("edit,match", [
    (lambda d: d["ops"]["hbm_copy"]["params"].__setitem__("launch_s", float("nan")), "launch_s=nan"),
    (lambda d: d["ops"]["hbm_copy"]["params"].__setitem__("eff_bytes", -0.5), "eff_bytes=-0.5"),
    (lambda d: d["ops"]["all_gather"]["by_gpus"][2].__setitem__("bus_bandwidth_bytes_per_s", 0.0), "bus_bandwidth"),
    # values the model is not defined at: a p-norm needs p > 1 (p = 0.5 gave NaN seconds, exit 0)
    (lambda d: d["ops"]["hbm_copy"]["params"].__setitem__("smooth_p", 0.5), "smooth_p=0.5 must exceed 1"),
    (lambda d: d["ops"]["hbm_copy"]["params"].__setitem__("exp_bytes", 1.5), r"exp_bytes=1.5 outside \(0, 1\]"),
    # a model that does not fit the op (each was a traceback at prediction time)
    (lambda d: d["ops"]["hbm_copy"]["params"].__setitem__("eff_exponents", {"H": 0.1}), "eff_exponents names"),
    (lambda d: d["ops"].__setitem__("all_gather", dict(d["ops"]["hbm_copy"])), "takes model alpha-beta"),
    (lambda d: d["ops"].__setitem__("hbm_copy", dict(d["ops"]["all_gather"])), "takes model roofline"),
    (lambda d: d["ops"]["all_gather"].__setitem__("by_gpus", {}), "by_gpus is empty"),
    (lambda d: d["ops"]["all_gather"]["by_gpus"].__setitem__(1, d["ops"]["all_gather"]["by_gpus"][2]),
     r"by_gpus has 1 GPUs, outside \[2, 65536\]"),
    (lambda d: d["ops"]["hbm_copy"].__setitem__("model", "linear"), "model is 'linear'"),
    (lambda d: d["ops"]["hbm_copy"].__setitem__("runs", "abc"), "runs must be a list"),
])
def test_fitted_yaml_with_impossible_values_is_refused(tmp_path, edit, match):
    """A damaged or hand-edited fit must not turn into NaN or negative kernel times."""
    import yaml

    from k3sim.kernels.fit import to_dict

    write_run(tmp_path, "a", {"hbm_copy": HBM_POINTS, "all_gather": COLL_POINTS})
    d = to_dict(fit_profile(load_store(tmp_path), hardware(tmp_path)))
    edit(d)
    (tmp_path / FITTED_NAME).write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match=f"not a k3sim kernel fit.*{match}"):
        read_fitted(tmp_path / FITTED_NAME)


DECODE_ROWS = [dict(B=b, T=t, H=h) for h in (12, 96) for t in (1, 2, 4, 8) for b in (1, 2, 4, 8, 16, 64, 256)]
TRUE_DECODE = RooflineFit(4e-6, 0.05, 1e9, 0.5, 0.85, 2e7, 0.9, 3.0, 1e15, 4.8e12, floor_s=2e-6, step_s=1.5e-6)


def _decode_work(rows):
    spec = OPS["recurrent_kda_decode"]
    return (np.array([spec.flop(r) for r in rows]), np.array([spec.bytes(r) for r in rows]), spec.steps(rows))


def _write_decode_csv(run):
    """recurrent_kda_decode.csv in `run`: DECODE_ROWS timed by TRUE_DECODE (with its per-step latency)."""
    flop, nbytes, steps = _decode_work(DECODE_ROWS)
    lines = ["B,T,H,seconds,status"] + [f"{r['B']},{r['T']},{r['H']},{t:.9g},ok" for r, t in
                                        zip(DECODE_ROWS, TRUE_DECODE.seconds(flop, nbytes, steps=steps))]
    (run / "recurrent_kda_decode.csv").write_text("\n".join(lines) + "\n")


def test_serial_step_latency_is_recovered_and_sets_small_batch_decode():
    """fla's fused recurrent kernel walks a request's T tokens in sequence: at B = 1 the time grows with
    T by the per-step latency although FLOP and bytes barely change; the fit finds that latency."""
    flop, nbytes, steps = _decode_work(DECODE_ROWS)
    t = TRUE_DECODE.seconds(flop, nbytes, steps=steps)
    got = fit_roofline(flop, nbytes, t, 1e15, 4.8e12, steps=steps)
    assert got.step_s == pytest.approx(1.5e-6, rel=0.1)
    assert np.abs(got.seconds(flop, nbytes, steps=steps) / t - 1).max() < 0.03
    one, eight = _decode_work([dict(B=1, T=1, H=96), dict(B=1, T=8, H=96)])[2]
    assert (one, eight) == (1.0, 8.0)


def test_a_fit_with_step_latency_refuses_a_call_without_steps():
    flop, nbytes, _ = _decode_work(DECODE_ROWS[:3])
    with pytest.raises(ValueError, match="serial steps"):
        TRUE_DECODE.seconds(flop, nbytes)


def test_step_latency_round_trips_through_theta_and_fitted_yaml(tmp_path):
    """theta keeps the efficiency exponents before the step latency; fitted.yaml stores step_s only for
    ops that have one."""
    fit = RooflineFit(4e-6, 0.5, 1e10, 0.5, 0.8, 1e7, 0.7, 4.0, 1e15, 4e12, floor_s=1e-6,
                      eff_exponents={"H": 0.3}, step_s=2e-6)
    back = RooflineFit.from_theta(fit.to_theta(), 1e15, 4e12, ("H",), serial=True)
    assert back.step_s == pytest.approx(2e-6) and back.eff_exponents["H"] == pytest.approx(0.3)
    assert "step_s" not in RooflineFit(4e-6, 0.5, 1e10, 0.5, 0.8, 1e7, 0.7, 4.0, 1e15, 4e12).as_dict()
    root = tmp_path / "m"
    run = write_run(root, "a", {"hbm_copy": HBM_POINTS})
    _write_decode_csv(run)
    fp = fit_profile(load_store(root), hardware(root))
    assert fp.ops["recurrent_kda_decode"].roofline.step_s > 0 and fp.ops["hbm_copy"].roofline.step_s == 0
    got = read_fitted(write_fitted(root / FITTED_NAME, fp))
    assert got.ops["recurrent_kda_decode"].roofline.step_s == pytest.approx(
        fp.ops["recurrent_kda_decode"].roofline.step_s, rel=1e-5)
    assert "step_s" not in (root / FITTED_NAME).read_text().split("hbm_copy:")[1].split("recurrent_kda_decode:")[0]


def test_features_default_to_reference_values_when_a_fit_has_both_exponents_and_step_latency():
    """theta holds the efficiency exponents before log step_s: a call without features must not read an
    exponent as the step latency."""
    fit = RooflineFit(4e-6, 0.5, 1e10, 0.5, 0.8, 1e7, 0.7, 4.0, 1e15, 4e12, floor_s=1e-6,
                      eff_exponents={"H": 0.3}, step_s=2e-6)
    flop, nbytes, steps = np.array([1e9, 1e11]), np.array([1e6, 1e8]), np.array([4.0, 8.0])
    assert fit.seconds(flop, nbytes, None, steps) == pytest.approx(fit.seconds(flop, nbytes, np.zeros((2, 1)), steps))
    assert fit.seconds(flop, nbytes, None, steps)[0] < 1e-3  # microseconds, not e^0.3 s per step
    assert fit.seconds(np.array([]), np.array([]), None, np.array([])).size == 0


def test_fitted_yaml_step_latency_must_belong_to_the_op(tmp_path):
    """step_s on an op without serial steps is refused (one line, the file named); a decode fit without
    step_s (made before the term existed) is treated as stale and refitted in memory."""
    import yaml

    from k3sim.kernels.fit import op_fit

    root = tmp_path / "m"
    run = write_run(root, "a", {"hbm_copy": HBM_POINTS})
    _write_decode_csv(run)
    store = load_store(root)
    path = write_fitted(root / FITTED_NAME, fit_profile(store, hardware(root)))
    d = yaml.safe_load(path.read_text())
    d["ops"]["recurrent_kda_decode"]["params"].pop("step_s")
    path.write_text(yaml.safe_dump(d))
    fit, note = op_fit(store, read_fitted(path), "recurrent_kda_decode", hardware(root))
    assert "stale" in note and fit.roofline.step_s > 0
    d["ops"]["hbm_copy"]["params"]["step_s"] = 1e-6
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match="hbm_copy: step_s given for an op without serial steps"):
        read_fitted(path)
