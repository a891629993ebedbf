"""`k3sim kernel-time --convention graph|eager` (issue 10) on a tmp profile with both timers' rows."""

from __future__ import annotations

import pytest

PROFILE = """name: convtest
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


def _profile(tmp_path):
    """hbm_copy at 1-64 MiB: event rows 10 us + 2 bytes / 3e12 with host_s 12 us; graph rows 6 us less."""
    cal = tmp_path / "measured" / "convtest"
    for name, timer, shift in (("ev", None, 0.0), ("gr", "graph", -6e-6)):
        run = cal / name
        run.mkdir(parents=True)
        (run / "provenance.yaml").write_text("gpu_name: test\ncommand: pytest\n")
        head = "bytes,seconds,seconds_p20,seconds_p80,reps,status,error,host_s" + (",timer" if timer else "")
        rows = [head] + [f"{2 ** e},{10e-6 + shift + 2 * 2 ** e / 3e12:.9g},0,0,200,ok,,1.2e-05"
                         + (f",{timer}" if timer else "") for e in range(20, 27)]
        (run / "hbm_copy.csv").write_text("\n".join(rows) + "\n")
    prof = tmp_path / "convtest.yaml"
    prof.write_text(PROFILE.format(cal=cal))
    return prof


def test_graph_default_and_eager(tmp_path, cli_json):
    prof = _profile(tmp_path)
    args = ["kernel-time", "hbm_copy", "--hardware", prof, "--set", f"bytes={2 ** 22}"]
    g = cli_json(*args)
    e = cli_json(*args, "--convention", "eager")
    assert g["convention"] == "graph" and e["convention"] == "eager"
    t = 2 * 2 ** 22 / 3e12
    assert g["seconds"] == pytest.approx(4e-6 + t, rel=1e-6)
    assert e["seconds"] == pytest.approx(10e-6 + t + 12e-6, rel=1e-6)  # event row + host launch
    assert "graph-timed row" in g["detail"] and "host launch" in e["detail"]


def test_bad_convention_exits_2(tmp_path, cli):
    prof = _profile(tmp_path)
    r = cli("kernel-time", "hbm_copy", "--hardware", prof, "--set", "bytes=1048576", "--convention", "cuda")
    assert r.returncode == 2 and "--convention" in r.stderr and len(r.stderr.strip().splitlines()) == 1
