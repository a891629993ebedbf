"""`k3sim pipeline` through the CLI: JSON keys and values, files, bad input as one line + exit 2."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli, run_cli_json


def test_uniform_interleaved_json_matches_megatron_formula():
    out = run_cli_json("pipeline", "--stages", "8", "--virtual", "2", "--microbatches", "16", "--schedule",
                       "interleaved-1f1b", "--uniform-costs", "1,2", "--encoder-policy", "none")
    assert out["bubble_ratio"] == pytest.approx(7 / 32)
    assert out["step_time_s"] == pytest.approx(16 * 3 * (1 + 7 / 32))
    assert out["encoder_hidden_share"] is None
    assert len(out["idle_per_stage_s"]) == 8 and len(out["peak_in_flight_per_stage"]) == 8
    assert out["peak_in_flight_per_stage"][0] == pytest.approx(8 * (1 + 7 / 16))


def test_zb_h1_and_encoder_cost_via_cli(tmp_path):
    out = run_cli_json("pipeline", "--stages", "4", "--microbatches", "8", "--schedule", "zb-h1",
                       "--uniform-costs", "1,1,1", "--encoder-policy", "serial", "--encoder-cost", "0.5",
                       "--trace", str(tmp_path / "t.json"))
    assert out["text_bubble_ratio"] == pytest.approx(3 / 24)
    assert out["step_time_s"] == pytest.approx(out["text_step_time_s"] + 8 * (0.5 + 1.0))
    assert out["encoder_hidden_share"] == pytest.approx(0.0)
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_model_derived_example_from_the_issue():
    out = run_cli_json("pipeline", "--stages", "8", "--virtual", "2", "--microbatches", "16",
                       "--schedule", "interleaved-1f1b")
    for key in ("step_time_s", "bubble_ratio", "encoder_hidden_share", "idle_per_stage_s",
                "peak_in_flight_per_stage", "activation_bytes_per_stage"):
        assert key in out
    assert out["step_time_s"] >= out["text_step_time_s"] > 0
    assert 0 <= out["encoder_hidden_share"] <= 1
    assert all(b > 0 for b in out["activation_bytes_per_stage"])
    a = out["extra"]["attn_res"]
    assert a["saved_bytes_per_microbatch"] > 0 and a["cached_bytes_per_microbatch"] < a["resend_all_bytes_per_microbatch"]


@pytest.mark.parametrize("args,option", [
    (["--stages", "4", "--virtual", "2", "--microbatches", "6", "--schedule", "interleaved-1f1b"], "--microbatches"),
    (["--virtual", "0", "--schedule", "interleaved-1f1b"], "--virtual"),
    (["--stages", "50", "--virtual", "2", "--schedule", "interleaved-1f1b", "--microbatches", "50"], "--stages"),
    (["--uniform-costs", "-1,2", "--encoder-policy", "none"], "--uniform-costs"),
    (["--uniform-costs", "1;2", "--encoder-policy", "none"], "--uniform-costs"),
    (["--uniform-costs", "1,2", "--encoder-cost", "-0.5"], "--encoder-cost"),
])
def test_bad_input_is_one_line_and_exit_2(args, option):
    proc = run_cli("pipeline", *args)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and option in lines[0], proc.stderr
