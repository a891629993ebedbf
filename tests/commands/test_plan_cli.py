"""`k3sim plan` on the shipped scenarios and on a broken one."""

from __future__ import annotations

import json

import pytest


def test_plan_default_scenario(cli):
    out = run_cli_json(cli, "plan")
    assert out["scenario"] == "k3-h200-serve-128k"
    assert out["memory"]["max_concurrent_requests"] >= 1
    assert out["cluster_gpus"] == 16 and out["replicas"] == 1  # 16 GPUs / (tp 8 x pp 2)
    # The scenario plan is the memory plan of the same layout, not a separate computation.
    direct = run_cli_json(cli, "memory", "--model", "models/kimi-k3.yaml", "--hardware", "h200",
                          "--mode", "serve", "--tp", "8", "--pp", "2", "--ep", "8", "--context", "131072")
    assert out["memory"] == direct


def test_plan_from_elsewhere_uses_repo_default(cli, tmp_path):
    proc = cli("plan", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "k3-h200-serve-128k" in proc.stdout and "max concurrent requests" in proc.stdout


def test_plan_train_scenario(cli):
    out = run_cli_json(cli, "plan", "--scenario", "scenarios/k3-h200-train-32k.yaml")
    assert out["memory"]["mode"] == "train" and out["memory"]["fits"] is True
    # Every layout and workload field of the scenario reaches the plan (virtual stages, ZeRO stage, ...).
    direct = run_cli_json(cli, "memory", "--model", "models/kimi-k3.yaml", "--hardware", "h200",
                          "--mode", "train", "--tp", "8", "--pp", "16", "--virtual-stages", "2",
                          "--ep", "64", "--dp", "64", "--zero-stage", "1", "--context", "32768",
                          "--micro-batch", "1", "--recompute")
    assert out["memory"] == direct
    # Interleaved 1F1B on the first rank: pp x (1 + (pp - 1) / (pp v)) = 16 x (1 + 15/32) = 23.5.
    assert out["memory"]["in_flight_micro_batches"] == 23.5 and out["memory"]["worst_stage"] == 0


def test_plan_bad_scenario(cli, root, tmp_path):
    text = (root / "scenarios/default.yaml").read_text()
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace("../models/kimi-k3.yaml", str(root / "models/kimi-k3.yaml"))
                   .replace("  ep: 8", "  ep: 8\n  ez: 3"))
    proc = cli("plan", "--scenario", str(bad))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and str(bad) in err and "parallelism.ez" in err and "unknown field" in err


@pytest.mark.parametrize("old, new, words", [
    ("model: ../models/kimi-k3.yaml", "model: no-such-model.yaml",
     ["field 'model'", "file not found", "no-such-model.yaml"]),
    ("hardware: h200", "hardware: h999", ["field 'hardware'", "'h999'", "unknown hardware profile"]),
    ("hardware: h200", "hardware: no-such-gpu.yaml", ["field 'hardware'", "file not found"]),
    ("  pp: 2", "  pp: 1\n  dp: 2", ["does not fit", "180.8 GB"]),
    ("  tp: 8\n  pp: 2\n  ep: 8", "  tp: 8\n  pp: 2\n  ep: 7", ["field 'ep'", "ep=7 does not divide"]),
    ("workspace_fraction: 0.10", "workspace_fraction: .nan",
     ["field 'workload.workspace_fraction'", "finite number"]),
])
def test_plan_scenario_bad_reference_names_scenario_field(cli, root, tmp_path, old, new, words):
    """A scenario naming a missing model file or an unknown GPU is blamed on the scenario's field."""
    text = (root / "scenarios/default.yaml").read_text()
    assert old in text
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace("../models/kimi-k3.yaml", str(root / "models/kimi-k3.yaml"))
                   .replace(old.replace("../models/kimi-k3.yaml", str(root / "models/kimi-k3.yaml")), new))
    proc = cli("plan", "--scenario", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and str(bad) in err
    assert all(w in err for w in words), err


def run_cli_json(cli, *args: str) -> dict:
    """tests/conftest.py's run_cli (the `cli` fixture) with --json, parsed."""
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
