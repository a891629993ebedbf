"""`k3sim plan [SCENARIO]`: the shipped scenarios as data (--json), the positional/--scenario alias."""

from __future__ import annotations

import json

import pytest

from k3sim.output import to_jsonable


def run_cli_json(cli, *args: str, code: int = 0) -> dict:
    """tests/conftest.py's run_cli (the `cli` fixture) with --json, parsed."""
    proc = cli(*args, "--json")
    assert proc.returncode == code, proc.stderr
    return json.loads(proc.stdout)


def test_plan_default_scenario(cli, root):
    from k3sim.configs import resolve_scenario
    from k3sim.memory.plan import workload_plan

    out = run_cli_json(cli, "plan", "--no-report", "--serving-requests", "40")
    assert out["scenario"] == "k3-h200-serve-128k" and out["mode"] == "serve" and out["fits"] is True
    assert out["cluster"]["num_gpus"] == 16 and out["replicas"] == 1  # 16 GPUs / (tp 8 x pp 2)
    # The plan's memory is the memory planner's answer for the same layout, not a separate computation.
    sc, model, hw = resolve_scenario(root / "scenarios/default.yaml")
    direct = to_jsonable(workload_plan(model, hw, sc.parallelism, sc.workload))
    assert out["memory"] == direct
    assert out["memory"]["max_concurrent_requests"] >= 1
    assert str(out["memory"]["max_concurrent_requests"]) in out["verdict"]
    # decode roofline rows: tokens/s per GPU grows with the batch
    tps = [r["tokens_per_s_per_gpu"] for r in out["decode"]]
    assert len(tps) >= 4 and tps == sorted(tps)
    # serving: the keys of `k3sim serve --json`, from the requested 40-request sample
    assert out["requests"] == 40 and out["ttft_p50_s"] <= out["ttft_p99_s"]


def test_plan_train_scenario_keys(cli, root):
    out = run_cli_json(cli, "plan", "scenarios/k3-h200-train-32k.yaml", "--no-report")
    assert out["memory"]["mode"] == "train" and out["memory"]["fits"] is True
    assert out["step_time_s"] > 0 and out["tokens_per_s"] > 0 and 0 < out["mfu"] < 1
    assert out["step_time_s"] == pytest.approx(sum(r["seconds"] for r in out["breakdown"]))
    # 32 micro-batches (pp x v) x dp 64 x 32768 tokens
    assert out["tokens_per_step"] == 32 * 64 * 32768
    assert out["tokens_per_s"] == pytest.approx(out["tokens_per_step"] / out["step_time_s"])
    # Interleaved 1F1B on the first rank: pp x (1 + (pp - 1) / (pp v)) = 16 x (1 + 15/32) = 23.5.
    assert out["memory"]["in_flight_micro_batches"] == 23.5 and out["memory"]["worst_stage"] == 0


def test_plan_scenario_alias_and_conflict(cli, root, tmp_path):
    proc = cli("plan", "scenarios/default.yaml", "--scenario", "scenarios/k3-h200-1node.yaml", "--no-report")
    assert proc.returncode == 2 and "two scenarios given" in proc.stderr and "\n" not in proc.stderr.strip()


def test_plan_from_elsewhere_uses_repo_default(cli, tmp_path):
    proc = cli("plan", "--no-report", "--serving-requests", "40", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "k3-h200-serve-128k" in proc.stdout and "max concurrent requests" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # --no-report writes nothing
