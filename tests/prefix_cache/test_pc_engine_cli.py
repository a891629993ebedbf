"""`k3sim prefix-cache --policy P --model M` for the engine policies: a run per family of models, and every bad
input one line naming its option, exit 2 (in-process, through the real entry point)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_pc import run_main

ROOT = Path(__file__).resolve().parents[2]
CONV = str(Path(__file__).resolve().parents[1] / "data" / "traces" / "conversation_head300.jsonl")
CLOCK = ("--tokens-per-s", "2e5", "--step-overhead-s", "0.01")


def one_line(capsys, *argv) -> str:
    code, out, err = run_main(capsys, "prefix-cache", *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and out == "" and "Traceback" not in err, (code, err)
    assert len(lines[0]) <= 300
    return lines[0]


@pytest.mark.parametrize("name, policy", [("qwen3-next-80b-a3b", "vllm-align"), ("nemotron-h-56b", "vllm-all"),
                                          ("kimi-k3", "sglang-extra-buffer"), ("jamba-1.5-mini", "trtllm-periodic"),
                                          ("llama-3.3-70b", "full-attention")])
def test_engine_policy_runs_on_a_shipped_model(capsys, name, policy):
    code, out, err = run_main(capsys, "prefix-cache", "--trace", CONV, "--limit", "40", "--model",
                              f"models/{name}.yaml", "--policy", policy, *CLOCK, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["policy"] == policy and d["requests"] == 40
    # the CLI is glue: its figures are the package's replay of the engine's configuration
    from k3sim.configs import load_model
    from k3sim.prefix_cache.engines import block_rule, engine_config
    from k3sim.serving.replay import StepCost, replay
    from k3sim.workloads import read_mooncake

    m = load_model(str(ROOT / "models" / f"{name}.yaml"))
    assert d["physical_block_tokens"] == block_rule(m, policy).simulated_page_tokens
    ref = replay(read_mooncake(CONV, limit=40), engine_config(m, policy), cost=StepCost(2e5, 0.01))
    for key in ("token_hit_rate", "prefill_flop_saved", "checkpoint_bytes_peak", "checkpoints_written"):
        assert d[key] == getattr(ref, key), key


@pytest.mark.parametrize("argv, needles", [
    (["--policy", "vllm-align", "--model", "models/llama-3.3-70b.yaml"], ["--policy:", "no recurrent layer"]),
    (["--policy", "vllm-all", "--model", "models/qwen3-next-80b-a3b.yaml"], ["--policy:", "mamba_cache_mode 'all'"]),
    (["--policy", "vllm-hybrid"], ["--policy:", "unknown policy", "vllm-align"]),
    (["--policy", "vllm-align", "--physical-block", "1024"], ["--physical-block:", "page-size rule"]),
    (["--policy", "vllm-all", "--hash-block", "1024"], ["--hash-block:", "page-size rule"]),
    (["--policy", "decoupled", "--snapshot-interval", "512"], ["--snapshot-interval:", "trtllm-periodic"]),
    (["--policy", "trtllm-periodic", "--snapshot-interval", "0"], ["--snapshot-interval:"]),
    (["--policy", "vllm-align", "--token-budget", "2048"], ["--token-budget:", "5696-token block"]),
    (["--policy", "sglang-no-buffer", "--retention-interval", "1024"], ["--retention-interval:", "k3"]),
    (["--policy", "k3", "--physical-block", "700"], ["--physical-block:", "does not divide"]),
])
def test_bad_engine_inputs(capsys, argv, needles):
    line = one_line(capsys, "--trace", CONV, *argv, *CLOCK)
    for n in needles:
        assert n in line, line


@pytest.mark.parametrize("argv, opt", [(["--model", "models/kimi-k3.yaml"], "--model"), (["--trace", CONV], "--trace"),
                                      (["--policy", "k3"], "--policy"), (["--sweep"], "--sweep")])
def test_engines_report_refuses_the_options_it_sets(capsys, tmp_path, argv, opt):
    line = one_line(capsys, "--engines", "--out", tmp_path / "r", *argv)
    assert line.startswith(f"error: {opt}:") and "--engines" in line


def test_sweep_takes_engine_policies(capsys, tmp_path):
    """--policies with engine policies: each by its rule (vllm-align one block, k3 the physical blocks)."""
    code, out, err = run_main(capsys, "prefix-cache", "--trace", CONV, "--limit", "30", "--model",
                              "models/qwen3-next-80b-a3b.yaml", "--sweep", "--policies", "vllm-align,k3,decoupled",
                              "--physical-blocks", "2048", "--capacities", "none", "--processes", "1",
                              "--out", tmp_path / "s", *CLOCK, "--json")
    assert code == 0, err
    rows = {(r["policy"], r["physical_block_tokens"]) for r in json.loads(out)["rows"]}
    assert rows == {("vllm-align", 1056), ("k3", 2048), ("decoupled", 2048)}
