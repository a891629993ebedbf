"""The report end to end on a synthetic measured directory and a fake kernel clock."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from cp_fakes import fake_kernel_time, k3
from k3sim.cp import intra_device as ID
from k3sim.cp.report import write_report


def test_report_with_measured_data(tmp_path):
    cal = tmp_path / "measured" / "run1"
    cal.mkdir(parents=True)
    p = ID.IntraParams(4e14, 1.5e-6, 40e-6, floor_s=1.2e-3)
    pd.DataFrame([{"T": t, "H": h, "seconds": ID.naive(t, h, p).seconds, "status": "ok"}
                  for t in (4096, 32768, 262144) for h in (12, 48, 96)]).to_csv(cal / "chunk_kda_fwd.csv", index=False)
    pd.DataFrame([{"T": t, "H": 96, "gpus": 2, "docs": d, "seconds": 1e-3 * t / 16384, "status": "ok",
                   "single_gpu_seconds": 1.6e-3 * t / 16384} for t in (16384, 65536, 262144) for d in (1, 4)]
                 ).to_csv(cal / "chunk_kda_cp_fwd.csv", index=False)
    hw = SimpleNamespace(name="fakegpu", scaleup_domain_gpus=8, scaleup_bandwidth_bytes_per_s=4.5e11,
                         scaleout_bandwidth_bytes_per_s=5e10, num_sms=132, peak_flops_per_s={"bf16": 1e15},
                         calibration_dir=str(tmp_path / "measured"))
    out = tmp_path / "rep"
    res = write_report(k3(), hw, [8192, 32768], [4, 8, 16], out, kernel_time=fake_kernel_time)
    for f in ("crossover.png", "crossover_p16.png", "step_time.png", "intra_device.png", "intra_device_fit.png", "kcp_validation.png",
              "summary.md", "sweep.csv"):
        assert (out / f).stat().st_size > 0, f
    assert res["intra_device_fit"]["fit"]["mape"] < 1e-6
    assert len(res["kcp_validation"]) and "KCP predicted vs measured" in (out / "summary.md").read_text()
