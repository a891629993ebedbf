"""The EP all-to-all calibration on the DeepEP tables (k3sim.validation.ep_comm): the fitted parameters, the
leave-one-out and leave-EP-out errors below the bounds the fit reaches (LOO MAPE 3.5 %, max 7.8 %; leave-EP-out
MAPE 4.6 %, max 11.7 %, 2026-12-02), and the held-out checks, including the one the model does not meet."""

from __future__ import annotations

import pytest

from k3sim.validation.ep_comm import report, table


@pytest.fixture(scope="module")
def rep():
    return report()


def test_the_fitted_parameters(rep):
    p = rep["parameters"]
    assert p["rows"] == 20  # V1 normal 4 EP x 2 phases, V1 low-latency 6 x 2
    assert p["f_nvl"] == pytest.approx(0.662, abs=0.005)    # of H800's 200 GB/s: 132 GB/s (DeepEP: ~160 max)
    assert p["f_rdma"] == pytest.approx(0.8815, abs=0.005)  # of the 50 GB/s NIC: 44 GB/s
    assert 0 < p["f_nvl"] < p["f_rdma"] <= 1
    d, c = p["latency"]["dispatch"], p["latency"]["combine"]
    assert d["a_s"] == pytest.approx(27.6e-6, rel=0.05) and d["b_s_per_log2_ep"] < 0.5e-6
    assert c["b_s_per_log2_ep"] == pytest.approx(5.2e-6, rel=0.1)
    assert rep["fit"]["max_abs_rel_err"] < 0.065


def test_leave_one_out_and_leave_ep_out(rep):
    loo, leo = rep["leave_one_out"], rep["leave_ep_out"]
    assert loo["count"] == 20 and leo["count"] == 20
    assert loo["mape"] < 0.04 and loo["max_abs_rel_err"] < 0.085
    assert leo["mape"] < 0.05 and leo["max_abs_rel_err"] < 0.125
    # leaving a row out never helps it here: each row's error is at least its in-fit error
    fit = {(r["table"], r["phase"], r["ep"]): abs(r["rel_err"]) for r in rep["fit"]["rows"]}
    assert all(abs(r["rel_err"]) >= fit[(r["table"], r["phase"], r["ep"])] - 1e-9 for r in loo["rows"])


def test_held_out_checks(rep):
    rows = rep["checks"]["rows"]
    rdma_only = [r for r in rows if r["table"] == "v1_low_latency_rdma_only"]
    assert len(rdma_only) == 8 and all(abs(r["rel_err"]) < 0.10 for r in rdma_only)
    v2 = {(r["phase"], r["ep"], r["hardware"], r["reported"]): r["rel_err"] for r in rows if r["table"] == "v2_normal"}
    assert abs(v2[("dispatch", 32, "h800", "61 GB/s (nodes, 6 SMs)")]) < 0.05
    assert abs(v2[("combine", 16, "b200", "91 GB/s (nodes, 12 SMs)")]) < 0.05
    # V2 on SM90 at EP 8 x 2: not the V1 model. V1's NVLink forwarding there would take 1.73 ms at 100 % of
    # H800's NVLink against V2's 1.36 ms: V2 reaches the node's ranks another way; the model stays V1's
    assert v2[("dispatch", 16, "h800", "90 GB/s (nodes, 12 SMs)")] > 0.5


def test_the_table_and_the_command(rep, cli_json):
    cols, body = table(rep)
    assert cols[0] == "table" and len(body) == 20 + len(rep["checks"]["rows"])
    out = cli_json("check", "deepep")
    assert out["leave_one_out"]["mape"] == pytest.approx(rep["leave_one_out"]["mape"])
    assert out["calibration"] == "external/deepep-v1-h800"
