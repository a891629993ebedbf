"""`--set KEY=VALUE` model what-ifs on every command that takes a model (`k3sim.commands.options.MODEL_SET`):
the same option everywhere, the overridden model's figures, a scenario's model overridden too, bad input in one
line, and nothing left behind for the next command in the same process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

K3 = "models/kimi-k3.yaml"
TRACE = "tests/data/traces/conversation_head300.jsonl"
# Every command that reads a model: its --model, or the model its scenario names.
MODEL_COMMANDS = ["decode", "prefill", "model-info", "memory", "cp", "prefix-cache", "pipeline", "sweep", "serve",
                  "plan"]


def json_of(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_every_command_that_takes_a_model_has_the_one_set_option():
    from k3sim.commands import register_all
    from k3sim.commands.options import MODEL_SET_HELP

    app = typer.Typer()
    register_all(app)
    commands = typer.main.get_group(app).commands
    for name in MODEL_COMMANDS:
        (opt,) = [p for p in commands[name].params if "--set" in getattr(p, "opts", ())]
        assert opt.multiple and opt.metavar == "KEY=VALUE" and opt.help == MODEL_SET_HELP, name
    # kernel-time takes no model: its --set is its own, the op's parameters
    (own,) = [p for p in commands["kernel-time"].params if "--set" in getattr(p, "opts", ())]
    assert own.help != MODEL_SET_HELP


def test_model_info_reports_the_overridden_model_and_says_so(capsys):
    base = json_of(capsys, "model-info", "--model", K3)
    var = json_of(capsys, "model-info", "--model", K3, "--set", "kda.num_heads=48")
    # KDA projections shrink with the heads; MLA, MoE and embeddings stay: total and active drop by the same amount
    drop = base["total_params"] - var["total_params"]
    assert drop > 0 and base["active_params"] - var["active_params"] == drop
    assert var["kinds"][0]["params_per_layer"] < base["kinds"][0]["params_per_layer"]
    assert var["source"].endswith("with --set kda.num_heads=48")
    # the next command in this process reads the file as it is
    assert json_of(capsys, "model-info", "--model", K3)["total_params"] == base["total_params"]


def test_every_8_halves_k3s_mla_layers_in_memory_and_decode(capsys):
    mem = ["memory", "--model", K3, "--tp", "8", "--pp", "2", "--ep", "8", "--context", "131072"]
    base, var = json_of(capsys, *mem), json_of(capsys, *mem, "--set", "full_attn_layers=every:8")
    # MLA KV per token is per MLA layer: 24 layers -> 11 (layers 8 ... 88)
    assert var["mla_kv_bytes_per_token"] * 24 == base["mla_kv_bytes_per_token"] * 11
    assert var["max_concurrent_requests"] > base["max_concurrent_requests"]
    dec = ["decode", "--model", K3, "--batch", "32", "--context", "131072"]
    assert json_of(capsys, *dec, "--set", "full_attn_layers=every:8")["tpot_s"] < json_of(capsys, *dec)["tpot_s"]


def test_a_scenarios_model_is_overridden_too(capsys):
    serve = ["serve", "--scenario", "scenarios/default.yaml", "--trace", TRACE, "--limit", "4", "--arrival-rate",
             "0.05"]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        base = json_of(capsys, *serve, "--out", f"{tmp}/a")
        var = json_of(capsys, *serve, "--out", f"{tmp}/b", "--set", "moe.num_active_experts=4")
    assert var["ttft_p50_s"] < base["ttft_p50_s"]  # fewer experts per token: a faster prefill


@pytest.mark.parametrize("argv,needles", [
    (["model-info", "--model", K3, "--set", "kda.num_head=48"],
     ["--set kda.num_head=48", "unknown key 'kda.num_head'", "kda.num_heads"]),
    (["decode", "--set", "kda.num_heads=many"], ["--set kda.num_heads=many", "field 'kda.num_heads'"]),
    (["memory", "--model", K3, "--set", "full_attn_layers=every:0"], ["--set full_attn_layers=every:0", "N >= 1"]),
    (["prefill", "--prompt", "8192", "--set", "moe.num_active_experts=0"],
     ["--set moe.num_active_experts=0", "field 'moe.num_active_experts'"]),
    (["cp", "--set", "hidden_size"], ["--set hidden_size", "expected KEY=VALUE"]),
    (["sweep", "scenarios/k3-h200-train-32k.yaml", "--scheduler", "tcp://127.0.0.1:1", "--set", "kda.num_heads=48"],
     ["--set", "--scheduler", "Dask"]),
])
def test_bad_overrides_are_one_line_naming_set(capsys, argv, needles):
    assert_one_line(*run_main(capsys, *argv), *needles)


def test_a_usage_error_after_set_leaves_no_override_behind(capsys):
    code, _, err = run_main(capsys, "model-info", "--model", K3, "--set", "kda.num_heads=48", "--no-such-option")
    assert code == 2
    from k3sim.configs import overrides

    assert overrides.current() == ()


def test_cp_counts_the_overridden_layers_and_heads(capsys):
    cp = ["cp", "--seq-len", "256K", "--cp", "4"]
    base = json_of(capsys, *cp)
    var = json_of(capsys, *cp, "--set", "kda.num_heads=48", "--set", "full_attn_layers=every:8")
    assert (base["num_kda_layers"], base["num_mla_layers"]) == (69, 24)
    assert (var["num_kda_layers"], var["num_mla_layers"]) == (82, 11)
    # the KCP fold exchanges each head's 128 x 128 fp32 state: half the heads, half the bytes
    assert var["kda_layer_state_recv_bytes_per_rank"] * 2 == base["kda_layer_state_recv_bytes_per_rank"]


def test_set_is_refused_where_no_model_is_read(capsys):
    assert_one_line(*run_main(capsys, "pipeline", "--uniform-costs", "1,2", "--encoder-policy", "none", "--set",
                              "kda.num_heads=48"), "--set", "no model is read")
