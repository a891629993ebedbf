"""Leave-one-out validation: the computation, the report, and the committed H200 data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import COLL_POINTS, GEMM_POINTS, HBM_POINTS, hardware, true_seconds, write_run

from k3sim.kernels.fit import FittedProfile, fit_store_op
from k3sim.kernels.store import load_store
from k3sim.kernels.validate import leave_one_out, leave_shape_out, summarize, summarize_shapes, write_report

REAL = Path(__file__).resolve().parents[2] / "hardware_profiles" / "measured" / "h200"


def test_loo_errors_are_relative_to_the_measurement(tmp_path):
    write_run(tmp_path, "a", {"hbm_copy": HBM_POINTS, "all_gather": COLL_POINTS}, wiggle=0.03)
    store = load_store(tmp_path)
    loo = leave_one_out(store, hardware(tmp_path))
    assert len(loo) == len(HBM_POINTS) + len(COLL_POINTS)
    for r in loo.itertuples():
        p = dict(kv.split("=") for kv in r.shape.split())
        p = {k: int(v) for k, v in p.items()}
        assert r.measured_s == pytest.approx(true_seconds(r.op, p, 0.03), rel=1e-6)
        assert r.rel_err == pytest.approx(r.predicted_s / r.measured_s - 1)
    # interior points interpolated, the two ends of each 1-D sweep extrapolated by the model
    assert (loo.groupby("op")["source"].apply(lambda s: (s == "model").sum()) == 2).all()


def test_loo_is_accurate_on_smooth_data_and_reports(tmp_path):
    write_run(tmp_path, "a", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS, "all_gather": COLL_POINTS},
              wiggle=0.03)
    loo = leave_one_out(load_store(tmp_path), hardware(tmp_path))
    s = summarize(loo)
    fam = s[s["level"] == "family"].set_index("family")
    assert list(fam.index) == ["gemm", "hbm", "collective"]
    assert (fam["mape"] < 0.02).all() and fam["meets_goal"].all()
    assert fam.loc["gemm", "count"] == len(GEMM_POINTS)
    paths = write_report(loo, s, tmp_path / "out", {"profile": "testgpu", "date": "d", "fingerprint": "f",
                                                    "runs": ["a"]})
    md = paths[0].read_text()
    assert "| **gemm** | (all) | 42 |" in md
    assert paths[2].read_text().count("\n") == len(loo) + 1


def test_loo_detects_a_bad_point(tmp_path):
    run = write_run(tmp_path, "a", {"hbm_copy": HBM_POINTS})
    csv = run / "hbm_copy.csv"
    lines = csv.read_text().splitlines()
    cells = lines[6].split(",")
    cells[1] = f"{float(cells[1]) * 1.5:.9g}"  # one measurement 50 % off
    lines[6] = ",".join(cells)
    csv.write_text("\n".join(lines) + "\n")
    loo = leave_one_out(load_store(tmp_path), hardware(tmp_path))
    worst = loo.loc[loo["rel_err"].abs().idxmax()]
    assert worst["rel_err"] == pytest.approx(1 / 1.5 - 1, abs=0.05)


@pytest.mark.skipif(not REAL.is_dir() or not any(REAL.glob("*/provenance.yaml")),
                    reason="committed H200 measurements not present yet")
def test_committed_h200_data_loads_and_validates():
    from k3sim.configs import load_hardware

    hw = load_hardware("h200")
    store = load_store(REAL)
    assert store.ops(), "no successful measurement in the committed H200 data"
    op = "hbm_copy" if "hbm_copy" in store.ops() else store.ops()[0]
    fp = FittedProfile("h200", "now", store.fingerprint, {op: fit_store_op(store, op, hw)})
    loo = leave_one_out(store, hw, fp, ops=[op])
    assert len(loo) == len(store.points(op)) and np.isfinite(loo["rel_err"]).all()
    # the goal for HBM streaming (reports/calibration/validation.csv has ~1 %)
    assert loo["rel_err"].abs().mean() <= 0.05


def test_leave_shape_out_hides_a_whole_shape(tmp_path):
    write_run(tmp_path, "a", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS}, wiggle=0.03)
    lso = leave_shape_out(load_store(tmp_path), hardware(tmp_path))
    assert set(lso["op"]) == {"gemm_bf16"}  # hbm_copy has no layer shape to leave out
    assert len(lso) == len(GEMM_POINTS)
    assert (lso["source"] != "measured").all()
    s = summarize_shapes(lso)
    assert s.loc[0, "count"] == len(GEMM_POINTS) and s.loc[0, "mape"] < 0.05


@pytest.mark.skipif(not REAL.is_dir() or not any(REAL.glob("*/provenance.yaml")),
                    reason="committed H200 measurements not present yet")
def test_committed_fit_matches_the_committed_data_and_decode_has_its_step_latency():
    """fitted.yaml was refitted after the last measurement was committed (else the predictor would refit
    in memory on every start and call the file stale), and the decode fit carries the per-token latency
    chain: one request verifying 64 tokens (beyond the measured T <= 32) costs more than 32 did."""
    from k3sim.configs import load_hardware
    from k3sim.kernels.fit import FITTED_NAME, read_fitted
    from k3sim.kernels.predict import predict_kernel_time

    store = load_store(REAL)
    fitted = read_fitted(REAL / FITTED_NAME)
    assert fitted.data_fingerprint == store.fingerprint
    step = fitted.ops["recurrent_kda_decode"].roofline.step_s
    assert 0.2e-6 < step < 10e-6  # a few hundred SM cycles per dependent token step
    hw = load_hardware("h200")
    t32 = predict_kernel_time("recurrent_kda_decode", {"B": 1, "T": 32, "H": 96}, hw)
    t64 = predict_kernel_time("recurrent_kda_decode", {"B": 1, "T": 64, "H": 96}, hw)
    assert t32.source == "measured" and t64.source == "model"
    assert t64.seconds - t32.seconds > 32 * 0.5 * step
