"""`k3sim plan` on the shipped scenarios and on a broken one."""

from __future__ import annotations

from conftest import ROOT, run_cli, run_cli_json


def test_plan_default_scenario():
    out = run_cli_json("plan")
    assert out["scenario"] == "k3-h200-serve-128k"
    assert out["memory"]["max_concurrent_requests"] >= 1


def test_plan_from_elsewhere_uses_repo_default(tmp_path):
    proc = run_cli("plan", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "k3-h200-serve-128k" in proc.stdout and "max concurrent requests" in proc.stdout


def test_plan_train_scenario():
    out = run_cli_json("plan", "--scenario", "scenarios/k3-h200-train-32k.yaml")
    assert out["memory"]["mode"] == "train" and out["memory"]["fits"] is True


def test_plan_bad_scenario(tmp_path):
    text = (ROOT / "scenarios/default.yaml").read_text()
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace("../models/kimi-k3.yaml", str(ROOT / "models/kimi-k3.yaml"))
                   .replace("  ep: 8", "  ep: 8\n  ez: 3"))
    proc = run_cli("plan", "--scenario", str(bad))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and str(bad) in err and "parallelism.ez" in err and "unknown field" in err
