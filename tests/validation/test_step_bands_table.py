"""The committed band table (hardware_profiles/measured/h200/step_bands.csv) is the generator's answer on the
committed runs: its inputs' fingerprint matches the files, one run's checks regenerate to the committed errors,
and the rows it leaves out are the ones the rule names (host-bound, glue-fit points)."""

from __future__ import annotations

import pytest
import yaml

from k3sim.configs import load_hardware
from k3sim.configs.bands import BAND_FILE, read_rows
from k3sim.configs.profiles import measured_dir
from k3sim.validation import bands as V

HW = load_hardware("h200")
TABLE = measured_dir(HW) / BAND_FILE


def test_the_committed_inputs_are_the_ones_the_table_was_made_from():
    meta = yaml.safe_load((TABLE.parent / V.META_FILE).read_text())
    now = V.fingerprint(HW)
    files = {k: v for k, v in meta["inputs_sha256"].items() if not k.startswith("kernel store")}
    stale = [k for k, v in files.items() if now.get(k) != v]
    assert not stale, f"inputs changed since the table was written: {stale}; rerun `{V.COMMAND}`"
    assert meta["rows"] == len(read_rows(TABLE)) and meta["command"] == V.COMMAND


def test_one_run_regenerates_to_the_committed_errors():
    """Run b's decode checks on today's model: a change of the step model or the kernels that moves an error by
    more than half a point makes the committed bands stale (rerun the generator)."""
    run = measured_dir(HW) / "20261201-wholestep-serve-b"
    fresh = {(r["config"], r["point"]): r["error"] for r in V.serve_rows(run, HW, "measured")}
    kept = {(r["config"], r["point"]): r["error"] for r in read_rows(TABLE)
            if r["run"] == run.name and r["basis"] == "measured"}
    assert fresh.keys() == kept.keys() and len(kept) == 29
    worst = max(abs(fresh[k] - kept[k]) for k in kept)
    assert worst < 0.005, f"run b's decode errors moved by {worst:.4f}: rerun `{V.COMMAND}`"


def test_left_out_rows_are_host_bound_or_glue_fit_points():
    rows = read_rows(TABLE)
    out = [r for r in rows if not r["used"]]
    assert out and all(r["note"].startswith(("host-bound", "fit point")) for r in out)
    assert all(r["kind"] == "train" for r in out if r["note"].startswith("fit point"))
    # Kimi-Linear's one profiled host-bound prefill point: 44.8 ms of kernels in a 106.7 ms eager step
    # (reports/decode/README.md); Qwen3-Next's three its write-up found host-bound (validation.bands.HOST_BOUND)
    pre = {r["family"]: [] for r in out}
    for r in out:
        if r["kind"] == "prefill" and r["basis"] == "measured":
            pre[r["family"]].append(r)
    assert [r["point"] for r in pre["kimi-linear-48b"]] == ["chunk=512 prefix=0 decodes=0"]
    assert "42 %" in pre["kimi-linear-48b"][0]["note"]
    assert sorted(r["point"] for r in pre["qwen3-next-80b-a3b"]) == [
        "chunk=2048 prefix=0 decodes=32", "chunk=2048 prefix=8192 decodes=32", "chunk=4096 prefix=0 decodes=32"]
    for r in rows:
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1, rel=1e-4, abs=1e-5)
