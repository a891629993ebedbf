"""`k3sim prefill`: TTFT of a prompt as the serving step model times its chunks, the breakdown adding up to it,
and bad input in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

from k3sim.commands.prefill import MAX_CHUNKS, chunk_plan

K3 = "models/kimi-k3.yaml"


def prefill_json(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, "prefill", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_chunk_plan_by_hand():
    assert chunk_plan(32768, 8192, 8192) == [(8192, 8192), (8192, 16384), (8192, 24576)]
    assert chunk_plan(10000, 0, 4096) == [(4096, 0), (4096, 4096), (1808, 8192)]
    assert chunk_plan(5, 4, 8192) == [(1, 4)]


def test_ttft_is_the_step_models_chunks_back_to_back():
    """Each chunk timed alone by `forward_step` (a fresh timer each, as serving's step model) and summed by hand."""
    from k3sim.commands.prefill import prefill_ttft
    from k3sim.configs import load_hardware, load_model
    from k3sim.step import Batch, StepLayout, forward_step

    model, hw = load_model(K3, overrides=()), load_hardware("h200")
    layout = StepLayout(tp=8, pp=2, ep=8)
    res = prefill_ttft(model, hw, layout, 20000, cached=4000, chunk=8192)
    by_hand = [forward_step(model, hw, layout, Batch(prefill=((c, p),))).seconds
               for c, p in [(8192, 4000), (7808, 12192)]]
    assert [s["seconds"] for s in res.steps] == pytest.approx(by_hand, rel=1e-12)
    assert res.ttft_s == pytest.approx(sum(by_hand), rel=1e-12)
    assert sum(r["seconds"] for r in res.rows) == pytest.approx(res.ttft_s, rel=1e-9)


@pytest.mark.parametrize("model", ["kimi-k3", "kimi-linear-48b", "deepseek-v3"])
def test_json_parts_add_up_and_a_cached_prefix_shortens_ttft(capsys, model):
    args = ["--model", f"models/{model}.yaml", "--prompt", "16384", "--chunk", "4096", "--tp", "8", "--pp", "1"]
    cold, warm = prefill_json(capsys, *args), prefill_json(capsys, *args, "--cached", "8192")
    assert (cold["num_chunks"], warm["num_chunks"], warm["prefilled_tokens"]) == (4, 2, 8192)
    for d in (cold, warm):
        assert d["ttft_s"] == pytest.approx(sum(c["seconds"] for c in d["chunks"]), rel=1e-12)
        assert sum(c["seconds"] for c in d["by_category"]) == pytest.approx(d["ttft_s"], rel=1e-9)
        assert sum(c["share"] for c in d["by_category"]) == pytest.approx(1.0)
        assert d["prefill_tokens_per_s"] == pytest.approx(d["prefilled_tokens"] / d["ttft_s"])
        # K3's ~1.5 TB of weights do not fit on one 8-GPU stage; the other two do: said, and still timed
        assert d["memory"]["fits"] is (model != "kimi-k3")
    # the cached run's two chunks are the cold run's last two (same chunk, same prefix)
    assert [c["seconds"] for c in warm["chunks"]] == pytest.approx([c["seconds"] for c in cold["chunks"][2:]])
    assert 0 < warm["ttft_s"] < cold["ttft_s"]


def test_a_longer_prefix_makes_each_chunk_slower(capsys):
    d = prefill_json(capsys, "--prompt", "65536", "--chunk", "16384")
    secs = [c["seconds"] for c in d["chunks"]]
    assert secs == sorted(secs) and secs[-1] > secs[0]  # attention over a growing prefix


def test_set_changes_the_prefilled_model(capsys):
    base = prefill_json(capsys, "--prompt", "8192")
    var = prefill_json(capsys, "--prompt", "8192", "--set", "moe.num_active_experts=8")
    assert var["ttft_s"] < base["ttft_s"] and var["model"] == base["model"]


def test_the_table_view(capsys):
    code, out, err = run_main(capsys, "prefill", "--prompt", "100000", "--chunk", "4096")
    assert code == 0, err
    assert "TTFT" in out and "TTFT by category" in out and "first and last 6 of 25" in out


@pytest.mark.parametrize("argv,needles", [
    (["--prompt", "8192", "--cached", "8192"], ["--cached", "leave nothing to prefill"]),
    (["--prompt", "8192", "--cached", "9000"], ["--cached", "below --prompt"]),
    (["--prompt", "8192", "--cached", "-1"], ["--cached", "0 or more"]),
    (["--prompt", "8192", "--chunk", "0"], ["--chunk"]),
    (["--prompt", "0"], ["--prompt"]),
    (["--prompt", "2000000"], ["--prompt", "max_context_tokens"]),
    (["--prompt", "1048576", "--chunk", "16"], ["--chunk", f"at most {MAX_CHUNKS:,}", "at least 256"]),
    (["--prompt", "8192", "--tp", "7"], ["--tp"]),
    (["--prompt", "8192", "--ep-kernel", "normal"], ["--ep-kernel", "--attention-dp"]),
    (["--prompt", "8192", "--expert-kernel", "fastest"], ["--expert-kernel"]),
])
def test_bad_input_is_one_line_naming_the_option(capsys, argv, needles):
    assert_one_line(*run_main(capsys, "prefill", *argv), *needles)
