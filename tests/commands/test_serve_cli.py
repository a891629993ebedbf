"""`k3sim serve`: the issue's JSON keys on a shipped trace, the --out files, a small rate sweep, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_cli

TRACE = "data/traces/conversation_trace.jsonl"
KEYS = ["requests", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s",
        "throughput_requests_per_s", "throughput_output_tokens_per_s_per_gpu", "goodput_requests_per_s",
        "token_hit_rate", "mean_requests_in_system", "mean_e2e_s", "sim_seconds"]


def test_serve_json_keys_and_out_files(tmp_path):
    out = tmp_path / "run"
    p = run_cli("serve", "--scenario", "scenarios/default.yaml", "--trace", TRACE, "--limit", "30",
                "--arrival-rate", "0.2", "--json", "--out", out)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert list(d)[:len(KEYS)] == KEYS
    assert d["requests"] == 30 and d["little_law_relative_error"] < 0.02
    assert 0 < d["ttft_p50_s"] <= d["ttft_p99_s"] and 0 < d["tpot_p50_s"] <= d["tpot_p99_s"]
    for name in ("summary.json", "requests.csv", "requests.parquet", "timeseries.csv", "latency_cdfs.png"):
        assert (out / name).stat().st_size > 0, name
    import numpy as np
    import pandas as pd

    df = pd.read_parquet(out / "requests.parquet")  # the per-request table gives back the summary's figures
    assert len(df) == 30
    assert np.percentile(df["ttft_s"], 99) == pytest.approx(d["ttft_p99_s"])
    assert df["e2e_s"].mean() == pytest.approx(d["mean_e2e_s"])


def test_serve_rate_sweep_writes_the_plot(tmp_path):
    out = tmp_path / "sweep"
    p = run_cli("serve", "--trace", TRACE, "--limit", "15", "--sweep-rate", "0.05,0.4", "--processes", "1",
                "--json", "--out", out)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [r["arrival_rate"] for r in d["rows"]] == [0.05, 0.4]
    # every rate serves every request, and Little's law holds on each run
    assert [r["requests"] + r["requests_rejected"] for r in d["rows"]] == [15, 15]
    assert all(r["little_law_relative_error"] < 0.02 for r in d["rows"])
    assert (out / "rate_sweep.png").stat().st_size > 0 and (out / "rate_sweep.csv").exists()


def _bad_trace(tmp_path: Path) -> Path:
    lines = (ROOT / TRACE).read_text().splitlines()[:5]
    lines[3] = '{"timestamp": 10, "input_length": -4, "output_length": 3, "hash_ids": [1]}'
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def _train_scenario(tmp_path: Path) -> Path:
    p = tmp_path / "train.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "model": str(ROOT / "models/kimi-k3.yaml"), "hardware": "h200",
                                 "cluster": {"num_gpus": 16}, "parallelism": {"tp": 8, "pp": 2, "ep": 8},
                                 "workload": {"mode": "train", "context_tokens": 4096}}))
    return p


@pytest.mark.parametrize("args, needle", [
    (["--trace", "BAD"], "line 4"),
    (["--trace", TRACE, "--arrival-rate", "0"], "--arrival-rate"),
    (["--trace", TRACE, "--arrival-rate", "-3"], "--arrival-rate"),
    (["--trace", TRACE, "--slo-ttft", "0"], "--slo-ttft"),
    (["--trace", TRACE, "--slo-tpot", "-1"], "--slo-tpot"),
    (["--trace", TRACE, "--disaggregate", "1:1"], "--disaggregate"),
    (["--trace", TRACE, "--disaggregate", "x"], "--disaggregate"),
    (["--trace", TRACE, "--pool-bytes", "1e6"], "--pool-bytes"),
    (["--trace", TRACE, "--pool-bytes", "-5"], "--pool-bytes"),
    (["--trace", TRACE, "--scenario", "TRAIN"], "serving"),
    (["--trace", TRACE, "--router", "random"], "--router"),
    (["--trace", TRACE, "--cache-policy", "lru"], "--cache-policy"),
    (["--trace", TRACE, "--sweep-rate", "1,0"], "--sweep-rate"),
    (["--trace", TRACE, "--replicas", "1000000000"], "--replicas"),
    (["--trace", TRACE, "--arrival-rate", "1e30"], "--arrival-rate"),
    (["--workload", "chat", "--requests", "1000000000"], "--requests"),
    (["--trace", "MISSING"], "file not found"),
    (["--trace", TRACE, "--workload", "chat"], "--trace"),
])
def test_bad_input_one_line_exit_2_no_out(tmp_path, args, needle):
    subst = {"BAD": lambda: str(_bad_trace(tmp_path)), "TRAIN": lambda: str(_train_scenario(tmp_path)),
             "MISSING": lambda: str(tmp_path / "nope.jsonl")}
    args = [subst[a]() if a in subst else a for a in args]
    out = tmp_path / "out"
    p = run_cli("serve", *args, "--out", out)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert not out.exists()
