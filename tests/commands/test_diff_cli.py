"""`k3sim diff`: each figure is the owning command's answer for that side, the ratio is variant / base, a figure
one side cannot have is n/a with its reason, and a diff that means nothing is one line, exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

K3 = "models/kimi-k3.yaml"
KL = "models/kimi-linear-48b.yaml"
DS = "models/deepseek-v3.yaml"
SMALL = ["--prompt", "8192", "--context", "8192", "--batch", "16"]  # short prompts: a quick test


def run_json(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def figures(d: dict) -> dict[str, dict]:
    return {r["figure"]: r for r in d["figures"]}


def test_each_figure_is_the_owning_commands_answer(capsys):
    d = run_json(capsys, "diff", K3, "--variant-set", "kda.num_heads=48", *SMALL)
    f = figures(d)
    for side, sets in (("base", []), ("variant", ["--set", "kda.num_heads=48"])):
        info = run_json(capsys, "model-info", "--model", K3, *sets)
        mem = run_json(capsys, "memory", "--model", K3, "--tp", "8", "--pp", "2", "--ep", "8", "--context", "8192",
                       *sets)
        dec = run_json(capsys, "decode", "--model", K3, "--batch", "16", "--context", "8192", *sets)
        pre = run_json(capsys, "prefill", "--model", K3, "--prompt", "8192", *sets)
        assert f["total_params"][side] == info["total_params"]
        assert f["active_params"][side] == info["active_params"]
        assert f["max_concurrent_requests"][side] == mem["max_concurrent_requests"]
        assert f["request_bytes_per_gpu"][side] == mem["per_request_bytes_per_gpu"]
        assert f["weights_bytes_per_gpu"][side] == sum(v for k, v in mem["per_gpu_bytes"].items()
                                                        if k.startswith("weights_"))
        assert f["decode_tpot_s"][side] == pytest.approx(dec["tpot_s"], rel=1e-12)
        assert f["prefill_ttft_s"][side] == pytest.approx(pre["ttft_s"], rel=1e-12)
    for r in d["figures"]:
        assert r["ratio"] == pytest.approx(r["variant"] / r["base"])
        assert r["base_na"] is None and r["variant_na"] is None
    assert f["active_params"]["ratio"] < 1 and f["prefill_ttft_s"]["ratio"] < 1  # half the KDA heads
    assert d["variant"]["overrides"] == ["kda.num_heads=48"] and d["base"]["overrides"] == []


def test_training_figures_are_the_training_step_models(capsys):
    from k3sim.configs import Parallelism, load_hardware, load_model
    from k3sim.training import train_step

    d = run_json(capsys, "diff", KL, DS, *SMALL, "--seq-len", "4096", "--micro-batches", "16")
    f = figures(d)
    hw = load_hardware("h200")
    for side, path in (("base", KL), ("variant", DS)):
        r = train_step(load_model(path, overrides=()), hw, Parallelism(tp=8, pp=16, ep=64, dp=8), seq_len=4096,
                       num_micro_batches=16)
        assert f["train_step_time_s"][side] == pytest.approx(r.step_time_s, rel=1e-12)
        assert f["train_mfu"][side] == pytest.approx(r.mfu, rel=1e-12)
    assert f["total_params"]["ratio"] > 10  # 671 B over 48 B


def test_a_figure_one_side_cannot_have_is_na_with_the_reason(capsys):
    """DeepSeek-V3 supports 163,840 tokens: at a 200,000-token context its decode (and memory at that context)
    is n/a; K3 (1M) has every figure."""
    d = run_json(capsys, "diff", K3, DS, "--context", "200000", "--prompt", "8192", "--batch", "4")
    f = figures(d)
    assert f["decode_tpot_s"]["variant"] is None and f["decode_tpot_s"]["ratio"] is None
    assert f["max_concurrent_requests"]["variant_na"] == f["decode_tpot_s"]["variant_na"]
    assert "163,840" in f["decode_tpot_s"]["variant_na"] and "--context" in f["decode_tpot_s"]["variant_na"]
    assert f["decode_tpot_s"]["base"] > 0 and f["decode_tpot_s"]["base_na"] is None
    assert f["prefill_ttft_s"]["variant"] > 0  # an 8K prompt is within its context
    code, out, _ = run_main(capsys, "diff", K3, DS, "--context", "200000", "--prompt", "8192", "--batch", "4")
    assert code == 0 and "n/a [1]" in out and "163,840" in out


def test_a_layout_only_the_variant_refuses(capsys):
    d = run_json(capsys, "diff", K3, "--variant-set", "kda.num_heads=36", *SMALL)
    f = figures(d)
    for key in ("weights_bytes_per_gpu", "decode_tpot_s", "prefill_ttft_s", "train_step_time_s"):
        assert f[key]["variant"] is None and "36" in f[key]["variant_na"], key
        assert f[key]["base"] is not None
    assert f["total_params"]["ratio"] < 1


@pytest.mark.parametrize("argv,needles", [
    (["diff", K3], ["diff", "same model", "--variant-set"]),
    (["diff", K3, K3, "--base-set", "kda.num_heads=48", "--variant-set", "kda.num_heads=48"], ["same model"]),
    (["diff", K3, "--variant-set", "kda.num_head=48"], ["--variant-set kda.num_head=48", "kda.num_heads"]),
    (["diff", K3, "--base-set", "full_attn_layers=every:0"], ["--base-set full_attn_layers=every:0"]),
    (["diff", K3, "--variant-set", "kda.num_heads=x"], ["--variant-set kda.num_heads=x", "valid integer"]),
    (["diff", K3, "--variant-set", "kda.num_heads=48", "--tp", "7"], ["--tp", "tp=7"]),
    (["diff", K3, "--variant-set", "kda.num_heads=48", "--train-ep", "7"], ["--train-ep"]),
    (["diff", K3, "--variant-set", "kda.num_heads=48", "--cached", "32768"], ["--cached"]),
    (["diff", K3, "--variant-set", "kda.num_heads=48", "--chunk", "0"], ["--chunk"]),
])
def test_a_meaningless_diff_or_bad_option_is_one_line(capsys, argv, needles):
    assert_one_line(*run_main(capsys, *argv), *needles)
