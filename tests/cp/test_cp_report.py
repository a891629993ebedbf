"""The report end to end on a synthetic measured directory and a fake kernel clock."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from cp_fakes import fake_kernel_time, k3
from k3sim.cp import intra_device as ID
from k3sim.cp.report import write_report
from k3sim.errors import InputError


def _dying(op, p, hw):
    """A kernel clock that fails half-way through a report (at the 64-head KDA forward)."""
    if op == "chunk_kda_fwd" and p["H"] == 64:
        raise RuntimeError("boom")
    return fake_kernel_time(op, p, hw)


def test_report_with_measured_data(tmp_path):
    cal = tmp_path / "measured" / "run1"
    cal.mkdir(parents=True)
    (cal / "provenance.yaml").write_text('gpu_name: "Synthetic GPU"\ncommand: "pytest"\n')
    p = ID.IntraParams(4e14, 1.5e-6, 40e-6, floor_s=1.2e-3)
    pd.DataFrame([{"T": t, "H": h, "seconds": ID.naive(t, h, p).seconds, "status": "ok"}
                  for t in (4096, 32768, 262144) for h in (12, 48, 96)]).to_csv(cal / "chunk_kda_fwd.csv", index=False)
    pd.DataFrame([{"T": t, "H": 96, "gpus": 2, "docs": d, "seconds": 1e-3 * t / 16384, "status": "ok",
                   "single_gpu_seconds": 1.6e-3 * t / 16384} for t in (16384, 65536, 262144) for d in (1, 4)]
                 ).to_csv(cal / "chunk_kda_cp_fwd.csv", index=False)
    hw = SimpleNamespace(name="fakegpu", scaleup_domain_gpus=8, scaleup_bandwidth_bytes_per_s=4.5e11, hbm_bandwidth_bytes_per_s=4.8e12,
                         scaleout_bandwidth_bytes_per_s=5e10, num_sms=132, peak_flops_per_s={"bf16": 1e15},
                         calibration_dir=str(tmp_path / "measured"))
    out = tmp_path / "rep"
    res = write_report(k3(), hw, [8192, 32768], [4, 8, 16], out, kernel_time=fake_kernel_time)
    for f in ("crossover.png", "crossover_p16.png", "step_time.png", "intra_device.png", "intra_device_fit.png", "kcp_validation.png",
              "summary.md", "sweep.csv"):
        assert (out / f).stat().st_size > 0, f
    assert res["intra_device_fit"]["fit"]["mape"] < 1e-6
    assert len(res["kcp_validation"]) and "KCP predicted vs measured" in (out / "summary.md").read_text()
    kv = pd.read_csv(out / "kcp_validation.csv")              # one row per measured (T, docs), values as written
    assert sorted(zip(kv["T"], kv["docs"])) == [(t, d) for t in (16384, 65536, 262144) for d in (1, 4)]
    assert kv["measured_fwd_s"].tolist() == pytest.approx([1e-3 * t / 16384 for t in kv["T"]], rel=1e-12)


def _hw(tmp_path):
    return SimpleNamespace(name="fakegpu", scaleup_domain_gpus=8, scaleup_bandwidth_bytes_per_s=4.5e11,
                           scaleout_bandwidth_bytes_per_s=5e10, num_sms=132, peak_flops_per_s={"bf16": 1e15},
                           calibration_dir=None)  # uncalibrated: datasheet times


def test_report_failure_leaves_out_as_it_was(tmp_path):
    """A failure half-way (the kernel clock dies at the published point's 64-head setting, after the sweep
    table and plots exist) writes nothing into `out`, leaves an existing file untouched and no staging
    directory behind."""
    from k3sim.cp.report import KIND
    from k3sim.files import MANIFEST_NAME, mark_output

    out = tmp_path / "rep"
    out.mkdir()
    (out / "sweep.csv").write_text("old\n")
    (out / "README.md").write_text("mine\n")  # not k3sim's: never touched
    mark_output(out, kind=KIND, files=["sweep.csv"])  # a previous cp --sweep output

    with pytest.raises(RuntimeError, match="boom"):
        write_report(k3(), _hw(tmp_path), [8192], [8], out, kernel_time=_dying)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_NAME, "README.md", "sweep.csv"]
    assert (out / "sweep.csv").read_text() == "old\n" and (out / "README.md").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_report_refuses_a_directory_of_someone_elses_files(tmp_path):
    """`cp --sweep --out DIR` replaced the files of any DIR; one that is not a cp-sweep output is refused."""
    out = tmp_path / "rep"
    out.mkdir()
    (out / "sweep.csv").write_text("mine\n")
    with pytest.raises(InputError, match="did not write"):
        write_report(k3(), _hw(tmp_path), [8192], [8], out, kernel_time=fake_kernel_time)
    assert [p.name for p in out.iterdir()] == ["sweep.csv"] and (out / "sweep.csv").read_text() == "mine\n"


def test_report_failure_creates_no_directory(tmp_path):
    """`out` (and its missing parents) did not exist: a failure half-way leaves none of them behind."""
    out = tmp_path / "new" / "rep"

    with pytest.raises(RuntimeError, match="boom"):
        write_report(k3(), _hw(tmp_path), [8192], [8], out, kernel_time=_dying)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("lens,cps,focus,needle", [
    ([], [8], 8, "no sequence lengths"),
    ([8192], [], 8, "no CP degrees"),
    ([0, 8192], [8], 8, "must be positive"),
    ([8192], [0, 8], 8, "at least 1"),
    ([8192], [2, 4], 8, "not among"),
    ([1000], [3], 3, "divides none"),
])
def test_report_refuses_unplottable_sweeps_before_writing(tmp_path, lens, cps, focus, needle):
    out = tmp_path / "rep"
    with pytest.raises(InputError, match=needle):
        write_report(k3(), _hw(tmp_path), lens, cps, out, focus_cp=focus, kernel_time=fake_kernel_time)
    assert not out.exists()
