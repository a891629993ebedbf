"""`k3sim calibrate fit|validate|run` on a tmp profile; errors are one line and exit 2."""

from __future__ import annotations

import importlib.util
import json

import yaml
from test_kernel_time_cli import make_profile


def test_fit_writes_fitted_yaml(cli, tmp_path):
    hw, run = make_profile(tmp_path)
    proc = cli("calibrate", "fit", "--hardware", hw, "--out", run.parent / "fitted.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    fitted = yaml.safe_load((run.parent / "fitted.yaml").read_text())
    assert fitted["profile"] == "clitest" and fitted["ops"]["hbm_copy"]["runs"] == ["r1"]
    params = fitted["ops"]["hbm_copy"]["params"]
    assert abs(params["eff_bytes"] * 4.0e12 / 3.6e12 - 1) < 0.05  # fitted 3.6 TB/s of a 4 TB/s datasheet
    assert json.loads(proc.stdout)["path"].endswith("fitted.yaml")


def test_fit_writes_under_the_working_directory_unless_told(cli, tmp_path):
    """`calibrate fit` rewrote the profile's committed fitted.yaml; by default it writes ./k3sim-out/."""
    hw, run = make_profile(tmp_path / "p")
    proc = cli("calibrate", "fit", "--hardware", hw, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["path"] == "k3sim-out/clitest-fitted.yaml"
    assert (tmp_path / "k3sim-out" / "clitest-fitted.yaml").is_file() and not (run.parent / "fitted.yaml").exists()


def test_validate_writes_report(cli, tmp_path):
    hw, _ = make_profile(tmp_path)
    out = tmp_path / "report"
    proc = cli("calibrate", "validate", "--hardware", hw, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)["summary"]
    fam = [r for r in summary if r["level"] == "family"]
    assert fam[0]["family"] == "hbm" and fam[0]["count"] == 11 and fam[0]["mape"] < 0.01
    assert (out / "validation.md").exists() and (out / "validation.csv").exists()


def test_errors_exit_2(cli, tmp_path):
    bare, _ = make_profile(tmp_path / "b", calibrated=False)
    cases = [(["calibrate", "fit", "--hardware", bare], "is uncalibrated (no measured data directory)"),
             (["calibrate", "validate", "--hardware", bare, "--out", tmp_path / "rep"], "is uncalibrated (no measured data directory)")]
    if importlib.util.find_spec("torch") is None:  # a machine without a GPU stack: `run` must refuse
        cases.append((["calibrate", "run", "--out", tmp_path / "run", "--parts", "hbm"], "PyTorch"))
    for args, match in cases:
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and match in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "rep").exists()  # nothing half-written


def test_unwritable_outputs_are_one_line_exit_2_and_leave_nothing(cli, tmp_path):
    hw, run = make_profile(tmp_path)
    (run.parent / "fitted.yaml").mkdir()  # a directory where the fit must go: refused before the fit
    proc = cli("calibrate", "fit", "--hardware", hw, "--out", run.parent / "fitted.yaml")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "fitted.yaml" in lines[0] and "is a directory" in lines[0]
    assert [p.name for p in run.parent.iterdir() if p.name.startswith(".")] == []  # no temp file left
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = cli("calibrate", "validate", "--hardware", hw, "--out", blocker / "report")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a-file is a regular file, not a directory" in lines[0] and "Traceback" not in proc.stderr


def test_measured_dir_without_successful_rows_is_exit_2(cli, tmp_path):
    hw, run = make_profile(tmp_path)
    (run / "hbm_copy.csv").write_text("bytes,seconds,status,error\n1024,,failed,OOM\n")
    for args in (["calibrate", "fit", "--hardware", hw, "--out", run.parent / "fitted.yaml"],
                 ["calibrate", "validate", "--hardware", hw, "--out", tmp_path / "rep"]):
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "no successful measurement" in lines[0]
    assert not (run.parent / "fitted.yaml").exists()  # no empty fit written


def test_run_option_errors_come_before_the_gpu_check(cli, tmp_path):
    for args, match in [(["--time-budget", "0"], "--time-budget: must be a positive"),
                        (["--time-budget", "-5"], "--time-budget: must be a positive"),
                        (["--time-budget", "inf"], "--time-budget: must be a positive"),
                        (["--parts", " , "], "--parts: no part given"),
                        (["--profile", "../h200"], "--profile: expected a profile name")]:
        proc = cli("calibrate", "run", "--out", tmp_path / "run", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and match in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_run_refuses_an_existing_run_directory(cli, tmp_path):
    _, run = make_profile(tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    proc = cli("calibrate", "run", "--out", run, "--parts", "hbm")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already holds a measurement run" in lines[0]
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # the earlier run is untouched


def test_run_out_that_is_a_file_is_exit_2(cli, tmp_path):
    """--out names a directory: a file there would fail at mkdir on the GPU machine (a traceback)."""
    f = tmp_path / "a-file"
    f.write_text("x")
    proc = cli("calibrate", "run", "--out", f, "--parts", "hbm")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a-file: exists and is not a directory" in lines[0]
    assert f.read_text() == "x"


def test_validate_with_nothing_to_leave_out_is_exit_2(cli, tmp_path):
    """One measured shape per op: leave-one-out has no row; an empty report would read as a result."""
    hw, run = make_profile(tmp_path)
    (run / "hbm_copy.csv").write_text("bytes,seconds,status\n1048576,1e-5,ok\n")
    out = tmp_path / "rep"
    proc = cli("calibrate", "validate", "--hardware", hw, "--out", out)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing to leave one out" in lines[0] and str(run.parent) in lines[0]
    assert not list(out.glob("validation*"))


def test_regenerating_unchanged_fit_and_report_leaves_the_files_untouched(cli, tmp_path):
    """`calibrate fit/validate` rewrote committed files when only the date changed (git never clean). A rerun
    on the same data, a second later, leaves every file byte-identical with its old modification time."""
    import os

    hw, run = make_profile(tmp_path)
    out = tmp_path / "report"
    fit = ("calibrate", "fit", "--hardware", hw, "--out", run.parent / "fitted.yaml")
    assert cli(*fit).returncode == 0
    assert cli("calibrate", "validate", "--hardware", hw, "--out", out, "--no-refit").returncode == 0
    files = [run.parent / "fitted.yaml", *sorted(out.iterdir())]
    for f in files:
        os.utime(f, (1_000_000, 1_000_000))
    before = {f: f.read_bytes() for f in files}
    assert cli(*fit).returncode == 0
    assert cli("calibrate", "validate", "--hardware", hw, "--out", out, "--no-refit").returncode == 0
    for f in files:
        assert f.read_bytes() == before[f] and f.stat().st_mtime == 1_000_000, f.name
    assert sorted(out.iterdir()) == files[1:]
