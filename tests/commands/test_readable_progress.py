"""Progress on a terminal for the long runs (issue 24 item 10): `cp --sweep`, `decode --sweep-batch`,
`calibrate validate` draw a bar on stderr when it is a terminal, nothing when it is piped or with --json, and
stdout is the same bytes either way. `validate_profile(progress=)` runs its ops one at a time: the same tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import run_main  # noqa: E402
from test_kernel_time_cli import make_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KL_MODEL = ROOT / "models" / "kimi-linear-48b.yaml"


def _runs(capsys, monkeypatch, *argv) -> dict[str, tuple[str, str]]:
    """(stdout, stderr) of the same command with stderr piped, at a terminal, and at a terminal with --json."""
    got = {}
    for name, tty, extra in (("piped", False, ()), ("terminal", True, ()), ("json", True, ("--json",))):
        monkeypatch.setattr(sys.stderr, "isatty", lambda tty=tty: tty)
        code, out, err = run_main(capsys, *argv, *extra)
        assert code == 0, err
        got[name] = (out, err)
    return got


def _check(got: dict) -> None:
    assert got["piped"][1] == "" and got["json"][1] == ""   # no bar piped, none with --json
    assert got["terminal"][1] != ""                          # a bar at a terminal ...
    assert got["terminal"][0] == got["piped"][0]             # ... and stdout unchanged by it
    json.loads(got["json"][0])


def test_decode_sweep_batch_progress(capsys, monkeypatch, tmp_path):
    got = _runs(capsys, monkeypatch, "decode", "--model", KL_MODEL, "--tp", "1", "--pp", "1", "--ep", "1",
                "--sweep-batch", "--out", tmp_path / "d")
    _check(got)
    assert "decode sweep" in got["terminal"][1]
    assert [r["batch"] for r in json.loads(got["json"][0])["rows"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_cp_sweep_progress(capsys, monkeypatch, tmp_path):
    got = _runs(capsys, monkeypatch, "cp", "--sweep", "--seq-lens", "32K,64K", "--cps", "2,8", "--out", tmp_path / "c")
    _check(got)
    assert "cp sweep: 2 lengths x 2 CP degrees" in got["terminal"][1]


def test_calibrate_validate_progress(capsys, monkeypatch, tmp_path):
    hw, _ = make_profile(tmp_path)
    got = _runs(capsys, monkeypatch, "calibrate", "validate", "--hardware", hw, "--out", tmp_path / "v")
    _check(got)
    assert "leave-one-out" in got["terminal"][1]


def test_validate_profile_per_op_is_the_one_call(tmp_path):
    """Two measured ops: the tables of the per-op loop are those of one leave-one-out over every op, and the
    callback sees each op of both passes (2 ops x 2 passes = 4 calls, the total 4)."""
    import pandas as pd

    from k3sim.configs import load_hardware
    from k3sim.configs.profiles import measured_dir
    from k3sim.kernels.fit import fit_profile
    from k3sim.kernels.store import load_store
    from k3sim.kernels.validate import leave_one_out, validate_profile

    path, run = make_profile(tmp_path)
    rows = ["bytes,seconds,seconds_p20,seconds_p80,reps,status,error"]
    rows += [f"{2 ** e},{3e-6 + 2 ** e / 4.0e12:.9g},0,0,25,ok," for e in range(20, 29)]
    (run / "hbm_read.csv").write_text("\n".join(rows) + "\n")
    hw = load_hardware(str(path))
    calls = []
    loo, summary, meta, shapes = validate_profile(hw, progress=lambda d, n: calls.append((d, n)))
    store = load_store(measured_dir(hw), hardware=hw)
    one = leave_one_out(store, hw, fit_profile(store, hw))
    assert sorted(set(loo["op"])) == ["hbm_copy", "hbm_read"] and len(loo) == 11 + 9
    pd.testing.assert_frame_equal(loo, one)
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


@pytest.mark.parametrize("tty", [False, True])
def test_progress_is_a_no_op_off_a_terminal(monkeypatch, capsys, tty):
    from k3sim.output import progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    with progress("work", 3) as tick:
        for i in range(3):
            tick(i + 1)
    out, err = capsys.readouterr()
    assert out == "" and (err != "") == tty
