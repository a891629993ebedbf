"""`k3sim kernel-time`: JSON answers on a calibrated tmp profile and on the datasheet; bad input exits 2."""

from __future__ import annotations

import json

import pytest

PROFILE = """name: clitest
hbm_bytes: 1.0e+11
hbm_bandwidth_bytes_per_s: 4.0e+12
peak_flops_per_s: {{bf16: 1.0e+15, fp8: 2.0e+15}}
scaleup_bandwidth_bytes_per_s: 4.5e+11
scaleup_domain_gpus: 8
scaleout_bandwidth_bytes_per_s: 5.0e+10
num_sms: 132
calibration_dir: {cal}
sources: {{hbm_bytes: t, hbm_bandwidth_bytes_per_s: t, peak_flops_per_s: t, scaleup_bandwidth_bytes_per_s: t,
           scaleup_domain_gpus: t, scaleout_bandwidth_bytes_per_s: t, num_sms: t}}
"""


def make_profile(tmp_path, calibrated: bool = True):
    """A profile YAML and (optionally) one measured run of hbm_copy: t = 5 us + 2 bytes / 3.6e12."""
    cal = tmp_path / "measured" / "clitest"
    run = cal / "r1"
    run.mkdir(parents=True)
    (run / "provenance.yaml").write_text("gpu_name: test\ncommand: pytest\n")
    rows = ["bytes,seconds,seconds_p20,seconds_p80,reps,status,error"]
    rows += [f"{2 ** e},{5e-6 + 2 * 2 ** e / 3.6e12:.9g},0,0,25,ok," for e in range(20, 31)]
    (run / "hbm_copy.csv").write_text("\n".join(rows) + "\n")
    yaml_path = tmp_path / "clitest.yaml"
    yaml_path.write_text(PROFILE.format(cal=cal if calibrated else "null"))
    return yaml_path, run


def test_kernel_time_json_measured_and_interpolated(cli, tmp_path):
    hw, _ = make_profile(tmp_path)
    proc = cli("kernel-time", "hbm_copy", "--hardware", hw, "--set", "bytes=1048576", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["source"] == "measured" and out["params"] == {"bytes": 1048576} and out["method"] == "exact"
    assert out["seconds"] == pytest.approx(5e-6 + 2 * 2 ** 20 / 3.6e12, rel=1e-6)
    proc = cli("kernel-time", "hbm_copy", "--hardware", hw, "--set", "bytes=3000000", "--json")
    out = json.loads(proc.stdout)
    assert out["source"] == "interpolated" and out["method"] == "multilinear"  # 1-D: the bracketing pair
    assert out["seconds"] == pytest.approx(5e-6 + 2 * 3e6 / 3.6e12, rel=0.02)


def test_kernel_time_datasheet_for_the_issue_example(cli):
    proc = cli("kernel-time", "gemm_bf16", "--hardware", "h200", "--set", "M=64", "--set", "N=7168", "--set", "K=2048",
               "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= {"seconds", "source", "detail"}
    assert out["params"] == {"M": 64, "N": 7168, "K": 2048}
    # the committed H200 data measured this shape: the answer is that measurement, not a model value
    from k3sim.configs.profiles import PROFILES_DIR
    from k3sim.kernels.store import load_store

    pts = load_store(PROFILES_DIR / "measured" / "h200").points("gemm_bf16")
    row = pts[(pts["M"] == 64) & (pts["N"] == 7168) & (pts["K"] == 2048)]
    assert len(row) == 1
    assert out["source"] == "measured" and out["seconds"] == pytest.approx(float(row["seconds"].iloc[0]), rel=1e-9)


@pytest.mark.parametrize("args,match", [
    (["gemm_bf17", "--set", "M=1"], "unknown op"),
    (["gemm_bf16", "--set", "M=1", "--set", "N=1"], "missing parameter"),
    (["gemm_bf16", "--set", "M=1", "--set", "N=1", "--set", "K=1", "--set", "Z=1"], "unknown parameter"),
    (["gemm_bf16", "--set", "M=-4", "--set", "N=1", "--set", "K=1"], "outside the allowed range"),
    (["gemm_bf16", "--set", "M"], "NAME=VALUE"),
    (["hbm_copy", "--set", "bytes=1024", "--hardware", "no-such-gpu"], "no-such-gpu"),
    (["hbm_copy", "--set", "bytes=nan"], "--set bytes=nan: parameter bytes='nan' is not an integer"),
    (["gemm_bf16", "--set", "M=1", "--set", "N=1", "--set", "K=0"], "--set K=0: gemm_bf16: K=0 outside"),
])
def test_bad_input_is_one_line_exit_2(cli, args, match):
    proc = cli("kernel-time", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in proc.stderr


def test_corrupt_measurement_file_is_exit_2(cli, tmp_path):
    hw, run = make_profile(tmp_path)
    (run / "hbm_copy.csv").write_text("bytes,seconds,status\n1024,abc,ok\n")
    proc = cli("kernel-time", "hbm_copy", "--hardware", hw, "--set", "bytes=1024")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "hbm_copy.csv" in proc.stderr


def test_damaged_fitted_yaml_is_exit_2_not_a_nan_time(cli, tmp_path):
    """A hand-edited fit whose smoothing exponent leaves the model's domain (p <= 1) printed a null
    (NaN) time with exit 0; it is refused, naming the file and the field."""
    import yaml

    hw, run = make_profile(tmp_path)
    path = run.parent / "fitted.yaml"  # the profile's own fit: written only when --out names it
    assert cli("calibrate", "fit", "--hardware", hw, "--out", path).returncode == 0
    d = yaml.safe_load(path.read_text())
    d["ops"]["hbm_copy"]["params"]["smooth_p"] = 0.5
    path.write_text(yaml.safe_dump(d))
    proc = cli("kernel-time", "hbm_copy", "--hardware", hw, "--set", "bytes=1099511627776", "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "fitted.yaml" in lines[0] and "smooth_p=0.5 must exceed 1" in lines[0]
