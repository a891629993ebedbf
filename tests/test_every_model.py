"""Issue 23's done-when: every shipped model runs through model-info, memory, decode, cp, prefix-cache, serve and
plan on a clean checkout (in-process through the real CLI, small sizes). A layout per model that its heads and
its weights allow on H200; a failure names the model and the command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hostile"))
from hostile_helpers import run_main  # noqa: E402

# model -> (tp, pp, ep, GPUs): the fewest H200s whose memory holds the bf16 / fp8 / mxfp4 weights and a 32K request
LAYOUTS = {
    "kimi-linear-48b": (1, 1, 1, 1), "qwen3-next-80b-a3b": (2, 1, 2, 2), "qwen3.5-397b-a17b": (8, 1, 8, 8),
    "nemotron-h-56b": (4, 1, 1, 4), "nemotron-3-nano-30b-a3b": (1, 1, 1, 1), "granite-4.0-h-small": (1, 1, 1, 1),
    "jamba-1.5-mini": (2, 1, 2, 2), "minimax-m1": (8, 2, 8, 16), "llama-3.3-70b": (4, 1, 1, 4),
    "deepseek-v3": (8, 1, 8, 8), "kimi-k2": (8, 2, 8, 16), "kimi-k3": (8, 2, 8, 16),
}


def test_every_model_file_has_a_layout_here():
    assert sorted(LAYOUTS) == sorted(p.stem for p in (ROOT / "models").glob("*.yaml"))


def _context(model: str) -> int:
    data = yaml.safe_load((ROOT / "models" / f"{model}.yaml").read_text())
    return min(32768, data.get("max_context_tokens") or 32768)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    d = tmp_path_factory.mktemp("scn")
    out = {}
    for m, (tp, pp, ep, g) in LAYOUTS.items():
        p = d / f"{m}.yaml"
        p.write_text(yaml.safe_dump({
            "name": f"{m}-h200", "model": str(ROOT / "models" / f"{m}.yaml"), "hardware": "h200",
            "cluster": {"num_gpus": g, "gpus_per_node": 8}, "parallelism": {"tp": tp, "pp": pp, "ep": ep},
            "workload": {"mode": "serve", "context_tokens": _context(m), "prefill_chunk_tokens": 8192,
                         "workspace_fraction": 0.1}}))
        out[m] = p
    return out


def _ok(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, *argv, "--json")
    assert code == 0, f"{' '.join(map(str, argv[:3]))}: {err.strip()[:300]}"
    return json.loads(out)


@pytest.mark.parametrize("model", sorted(LAYOUTS))
def test_model_through_every_command(model, scenarios, capsys):
    tp, pp, ep, _ = LAYOUTS[model]
    path, ctx = str(ROOT / "models" / f"{model}.yaml"), _context(model)
    lay = ["--tp", str(tp), "--pp", str(pp), "--ep", str(ep)]
    info = _ok(capsys, "model-info", "--model", path)
    assert info["total_params"] > 0
    mem = _ok(capsys, "memory", "--model", path, "--hardware", "h200", "--mode", "serve", *lay, "--context", str(ctx))
    assert mem["max_concurrent_requests"] >= 1
    dec = _ok(capsys, "decode", "--model", path, "--hardware", "h200", *lay, "--batch", "16", "--context", str(ctx))
    assert 0 < dec["tpot_s"] < 1
    cp = _ok(capsys, "cp", "--model", path, "--hardware", "h200", "--seq-len", "65536", "--cp", "4")
    assert cp
    _ok(capsys, "prefix-cache", "--model", path, "--workload", "chat", "--requests", "20",
        "--step-scenario", str(scenarios[model]))
    srv = _ok(capsys, "serve", "--scenario", str(scenarios[model]), "--workload", "chat", "--requests", "20")
    assert srv["requests"] == 20 and srv["ttft_p99_s"] > 0
    if model in ("qwen3-next-80b-a3b", "nemotron-h-56b", "minimax-m1", "llama-3.3-70b"):  # plan: the slowest
        pl = _ok(capsys, "plan", str(scenarios[model]), "--no-report")
        assert pl["fits"] is True
