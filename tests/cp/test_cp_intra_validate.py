"""Intra-device forms, the naive-form fit, and the model-vs-measurement hooks on synthetic CSVs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from cp_fakes import fake_kernel_time, hw
from k3sim.cp import intra_device as ID
from k3sim.cp import validate as V

P0 = ID.IntraParams(R_flops_per_s=4e14, tau_s=1.5e-6, t0_s=40e-6, blocks_per_sm=1, num_sms=132, floor_s=1.2e-3)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_forms_ordering(tp):
    h = 96 // tp
    n, o, c = ID.naive(131072, h, P0), ID.overlap(131072, h, P0), ID.sm_cp(131072, h, P0)
    assert o.seconds <= n.seconds and c.seconds <= n.seconds
    assert 0 < n.gpu_fraction <= 1 and 0 < c.gpu_fraction <= 1


def test_few_heads_idle_the_gpu_and_sm_cp_fills_it():
    """TP = 8: 12 heads x 2 V-tiles = 24 lanes of 132 SMs in the state pass; splitting into G segments helps."""
    n1, n8 = ID.naive(131072, 96, P0), ID.naive(131072, 12, P0)
    c8 = ID.sm_cp(131072, 12, P0)
    assert n8.gpu_fraction < n1.gpu_fraction
    assert c8.segments >= 4 and c8.gpu_fraction > 2 * n8.gpu_fraction


def test_naive_serial_part_counts_waves():
    """96 heads -> 192 lanes > 132 SMs: two waves per chunk step; 48 heads -> 96 lanes: one."""
    t_par96, n, _, w96 = ID._parts(65536, 96, P0)
    _, _, _, w48 = ID._parts(65536, 48, P0)
    assert (w96, w48) == (2, 1) and n == 1024
    assert ID.naive(65536, 96, P0).seconds == pytest.approx(P0.t0_s + t_par96 + 1024 * P0.tau_s * 2)


def test_fit_recovers_parameters():
    T = np.array([4096, 16384, 65536, 262144] * 4)
    H = np.repeat([12, 24, 48, 96], 4)
    s = np.array([ID.naive(int(t), int(h), P0).seconds for t, h in zip(T, H)])
    fitted, stats = ID.fit_naive(T, H, s, replace(P0, R_flops_per_s=1e15, tau_s=1e-6, t0_s=0.0))
    assert stats["mape"] < 1e-6 and stats["blocks_per_sm"] == 1
    assert fitted.tau_s == pytest.approx(P0.tau_s, rel=1e-6)
    assert fitted.R_flops_per_s == pytest.approx(P0.R_flops_per_s, rel=1e-6)
    assert fitted.t0_s == pytest.approx(P0.t0_s, rel=1e-6)
    assert fitted.floor_s == P0.floor_s                  # T = 4K: every head count at the same host floor


def test_validate_on_synthetic_measurements(tmp_path):
    run = tmp_path / "run1"
    run.mkdir()
    (run / "provenance.yaml").write_text('gpu_name: "Synthetic GPU"\ncommand: "pytest"\ndate_utc: "2026-01-01"\n')
    T = [4096, 16384, 65536, 262144]
    rows = [{"T": t, "H": h, "seconds": ID.naive(t, h, P0).seconds, "status": "ok"} for t in T for h in (12, 24, 48, 96)]
    rows.append({"T": 8192, "H": 12, "seconds": float("nan"), "status": "failed"})
    pd.DataFrame(rows).to_csv(run / "chunk_kda_fwd.csv", index=False)
    chk = V.intra_device_check(hw(), tmp_path)
    assert chk["fit"]["mape"] < 1e-6 and chk["leave_head_out_mape"] < 1e-6

    # measured KCP 10 % slower than the model predicts with the same kernel clock
    from k3sim.cp.geometry import CPGeometry
    from k3sim.cp.layers import kcp_layer
    from k3sim.cp.model import layer_inputs

    kr = []
    for t in (16384, 65536, 262144):
        x = layer_inputs(CPGeometry(hidden_size=96 * 128, kda_heads=96, num_kda_layers=1), hw(), t, 2,
                         docs=1, kernel_time=fake_kernel_time, conv_halo=False)
        kr.append({"T": t, "H": 96, "gpus": 2, "docs": 1, "seconds": 1.1 * kcp_layer(x).fwd.time_s,
                   "single_gpu_seconds": 1e-3, "status": "ok"})
    pd.DataFrame(kr).to_csv(run / "chunk_kda_cp_fwd.csv", index=False)
    k = V.kcp_check(hw(), tmp_path, kernel_time=fake_kernel_time)
    assert len(k["rows"]) == 3
    assert k["fwd_mape"] == pytest.approx(1 - 1 / 1.1, rel=1e-6)
    assert k["implied_pre_factor_median"] > 0.9         # slower than predicted -> larger pre-process
    # round trip: the implied factor, fed back, reproduces the median row's measurement exactly
    again = V.kcp_check(hw(), tmp_path, kernel_time=fake_kernel_time, pre_factor=k["implied_pre_factor_median"])
    assert sorted(abs(r["fwd_err"]) for r in again["rows"])[0] == pytest.approx(0.0, abs=1e-12)


def test_validate_without_data_returns_none(tmp_path):
    assert V.intra_device_check(hw(), tmp_path) is None
    assert V.kcp_check(hw(), None) is None


def test_more_sequences_fill_the_gpu_like_heads():
    """TP = 8 (12 heads): 4 sequences give 48 heads' worth of lanes, so the naive form uses more of the GPU."""
    one = [r for r in ID.table(96, [8], 65536, P0, sequences=1) if r["form"] == "naive"][0]
    four = [r for r in ID.table(96, [8], 65536, P0, sequences=4) if r["form"] == "naive"][0]
    assert four["gpu_fraction"] > 2 * one["gpu_fraction"]
    assert four["seconds_per_token"] < one["seconds_per_token"]


def test_short_calls_are_host_bound():
    """Below the floor (host issue time) every head count takes the same time, as measured at T = 4K."""
    assert ID.naive(4096, 12, P0).seconds == ID.naive(4096, 96, P0).seconds == P0.floor_s


def test_a_later_run_supersedes_a_shape_and_host_floor_is_detected(tmp_path):
    """The cp checks read measurements as the kernel store does (the latest run of a shape wins, not a
    median over runs), and the naive-form fit takes a host floor only where the data show one."""
    def run(name, date, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "provenance.yaml").write_text(f'gpu_name: "g"\ncommand: "pytest"\ndate_utc: "{date}"\n')
        pd.DataFrame(rows).to_csv(d / "chunk_kda_fwd.csv", index=False)

    run("b-old", "2026-01-01", [{"T": 4096, "H": h, "seconds": 1.3e-3, "status": "ok"} for h in (12, 96)])
    run("a-new", "2026-02-01", [{"T": 4096, "H": 12, "seconds": 2.8e-4, "status": "ok"}])
    df = V.load_op(tmp_path, "chunk_kda_fwd").sort_values("H")
    assert df["seconds"].tolist() == [2.8e-4, 1.3e-3] and df["run_id"].tolist() == ["a-new", "b-old"]
    T, H = np.array([4096, 4096, 8192, 8192]), np.array([12, 96, 12, 96])
    assert ID.host_floor_s(T, H, np.array([1.30e-3, 1.32e-3, 1.31e-3, 2.6e-3])) == pytest.approx(1.31e-3)
    assert ID.host_floor_s(T, H, np.array([2.8e-4, 1.32e-3, 5.3e-4, 2.6e-3])) == 0.0  # scales with heads
