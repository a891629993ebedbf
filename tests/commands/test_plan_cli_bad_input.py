"""`k3sim plan` on broken scenarios and on a layout that does not fit: one line, exit 2."""

from __future__ import annotations

import json

import pytest


def test_plan_bad_scenario(cli, root, tmp_path):
    text = (root / "scenarios/default.yaml").read_text()
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace("../models/kimi-k3.yaml", str(root / "models/kimi-k3.yaml"))
                   .replace("  ep: 8", "  ep: 8\n  ez: 3"))
    proc = cli("plan", "--scenario", str(bad), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and str(bad) in err and "parallelism.ez" in err and "unknown field" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("old, new, words", [
    ("model: ../models/kimi-k3.yaml", "model: no-such-model.yaml",
     ["field 'model'", "file not found", "no-such-model.yaml"]),
    ("hardware: h200", "hardware: h999", ["field 'hardware'", "'h999'", "unknown hardware profile"]),
    ("hardware: h200", "hardware: no-such-gpu.yaml", ["field 'hardware'", "file not found"]),
    ("  tp: 8\n  pp: 2\n  ep: 8", "  tp: 8\n  pp: 2\n  ep: 7", ["field 'ep'", "ep=7 does not divide"]),
    ("workspace_fraction: 0.10", "workspace_fraction: .nan",
     ["field 'workload.workspace_fraction'", "finite number"]),
    ("workload:", "training:\n  seed: -1\nworkload:", ["field 'training.seed'"]),
])
def test_plan_scenario_bad_reference_names_scenario_field(cli, root, tmp_path, old, new, words):
    """A scenario naming a missing model file or an unknown GPU is blamed on the scenario's field."""
    text = (root / "scenarios/default.yaml").read_text()
    assert old in text
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace("../models/kimi-k3.yaml", str(root / "models/kimi-k3.yaml"))
                   .replace(old.replace("../models/kimi-k3.yaml", str(root / "models/kimi-k3.yaml")), new))
    proc = cli("plan", "--scenario", str(bad), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and str(bad) in err
    assert all(w in err for w in words), err


def test_plan_that_does_not_fit_writes_its_report_then_exits_2(cli, root, tmp_path):
    out = tmp_path / "r"
    proc = cli("plan", "scenarios/k3-h200-1node.yaml", "--out", str(out))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and "k3-h200-1node.yaml" in err and "does not fit" in err and "180.8 GB" in err
    md = (out / "report.md").read_text()
    assert "**Verdict: does not fit" in md and "180.8 GB" in md
    # the figures: routed experts 180.8 GB = 168.4 GiB per GPU (the report's tables in GiB, components in words)
    assert "| weights: routed experts | 168.3" in md and (out / "figures/memory.png").stat().st_size > 0


def test_plan_unwritable_out(cli, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    proc = cli("plan", "scenarios/kimi-linear-48b-h200.yaml", "--out", str(f))
    assert proc.returncode == 2 and "not a directory" in proc.stderr and "--out" in proc.stderr


def test_plan_json_that_does_not_fit_prints_its_data_then_exits_2(cli, tmp_path):
    # `--json` returned exit 0 here: click hands a command's typer.Exit(2) back instead of raising it
    proc = cli("plan", "scenarios/k3-h200-1node.yaml", "--json", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.returncode
    data = json.loads(proc.stdout)
    assert data["fits"] is False and "does not fit" in data["verdict"] and "180.8 GB" in data["verdict"]
