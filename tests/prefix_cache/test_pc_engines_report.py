"""The engine-policy report's generator on a small slice of both shipped traces (a model-free clock): every
row is the replay of its configuration, the markdown shows the CSV's figures and the rules' block sizes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from k3sim.configs import load_model
from k3sim.prefix_cache.engines import engine_config
from k3sim.serving.engines_report import MODELS, write_engines_report
from k3sim.serving.replay import StepCost, replay
from k3sim.workloads import read_mooncake
from helpers_pc import run_main

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 12


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    return write_engines_report(out, limit=LIMIT, cost=StepCost(), processes=1), out


def test_files_rows_and_refusals(report):
    rep, out = report
    assert sorted(p.name for p in out.iterdir()) == [".k3sim-manifest.json", "engines.csv", "engines.md"]
    outputs = json.loads((out / ".k3sim-manifest.json").read_text())["outputs"]
    assert sorted(outputs["prefix-cache-sweep"]["engines"]) == ["engines.csv", "engines.md"]
    rows = list(csv.DictReader((out / "engines.csv").open()))
    # per trace: 8 policies x 2 capacities for Nemotron-H and K3, 7 x 2 + one refusal (vllm-all) for Qwen3-Next
    assert len(rows) == 2 * (16 + 16 + 15) == len(rep.rows)
    refused = [r for r in rows if r["note"]]
    assert {(r["model"], r["policy"]) for r in refused} == {("qwen3-next-80b-a3b", "vllm-all")}


def test_a_row_is_the_replay_of_its_configuration(report):
    rep, _ = report
    k3 = load_model(str(ROOT / MODELS[2]))
    ref = replay(read_mooncake(ROOT / "data/traces/synthetic_trace.jsonl", limit=LIMIT),
                 engine_config(k3, "sglang-extra-buffer", capacity_bytes=1e12), cost=StepCost())
    row = next(r for r in rep.rows if (r["trace"], r["model"], r["policy"], r.get("capacity_bytes"))
               == ("synthetic_trace.jsonl", "kimi-k3", "sglang-extra-buffer", 1e12))
    for key in ("token_hit_rate", "request_hit_rate", "prefill_flop_saved_fraction", "checkpoint_bytes_peak",
                "evictions", "checkpoints_written"):
        assert row[key] == getattr(ref, key), key


def test_markdown_shows_the_csv_figures_and_the_rules(report):
    rep, out = report
    md = (out / "engines.md").read_text()
    row = next(r for r in rep.rows if (r["trace"], r["model"], r["policy"], r.get("capacity_bytes"))
               == ("conversation_trace.jsonl", "nemotron-h-56b", "full-attention", None))
    assert f"{100 * row['token_hit_rate']:.2f} / {100 * row['request_hit_rate']:.2f} / " in md
    # the block-size table: the rules' pages at TP 1 (worked by hand in test_pc_engines.py)
    assert "| qwen3-next-80b-a3b | `vllm-align` | 1,056 / 1,056 |" in md
    assert "| nemotron-h-56b | `vllm-all` | 4,224 / 4,224 |" in md and "| kimi-k3 | `vllm-align` | 5,696 / 5,696 |" in md
    assert f"first {LIMIT} requests" in md and "best engine policy" in md


def test_cli_writes_the_report(capsys, tmp_path):
    """`--engines` through the entry point, on a 3-request slice with a given clock: per trace 8 policies for
    each model, Qwen3-Next's vllm-all a refusal row."""
    code, out, err = run_main(capsys, "prefix-cache", "--engines", "--limit", "3", "--capacities", "none",
                              "--processes", "1", "--out", tmp_path / "r", "--tokens-per-s", "2e5",
                              "--step-overhead-s", "0.01", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert Path(d["files"]["table"]).exists() and len(d["rows"]) == 2 * (8 + 8 + 8)
    assert "given" in Path(d["files"]["table"]).read_text()
    code, _, err = run_main(capsys, "prefix-cache", "--engines", "--out", tmp_path / "r", "--tokens-per-s", "2e5")
    assert code == 2 and "--tokens-per-s" in err and "--step-overhead-s" in err
