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
    # Every stage is busy or idle for the whole step; the encoder adds exactly what it does not hide.
    assert all(s["busy_s"] + s["idle_s"] == pytest.approx(out["step_time_s"]) for s in out["stage"])
    assert out["step_time_s"] - out["text_step_time_s"] == pytest.approx(out["encoder_overhead_s"])
    assert out["encoder_hidden_share"] == pytest.approx(1 - out["encoder_overhead_s"] / out["encoder_compute_s"])
    assert 0 < out["encoder_overhead_s"] < out["encoder_compute_s"]
    # Megatron interleaved warm-up: rank s holds (p - s - 1) x 2 + (v - 1) x p + 1 chunks = 11.5 - s
    # micro-batches at its peak (p 8, v 2); activations scale with it at one micro-batch's bytes per stage.
    assert out["peak_in_flight_per_stage"] == [11.5 - s for s in range(8)]
    per_mb = [b / n for b, n in zip(out["activation_bytes_per_stage"], out["peak_in_flight_per_stage"])]
    assert per_mb == pytest.approx([per_mb[0]] * 8) and per_mb[0] > 0
    # AttnRes block: 4096 tokens x hidden 7168 x 2 B (bf16) / tp 8; each hop carries whole blocks
    a = out["extra"]["attn_res"]
    assert a["block_bytes"] == 4096 * 7168 * 2 / 8
    assert a["resend_all_bytes_per_microbatch"] == sum(a["hop_blocks_resend_all"]) * a["block_bytes"]
    assert a["cached_bytes_per_microbatch"] == sum(a["hop_blocks_cached"]) * a["block_bytes"]
    assert a["saved_bytes_per_microbatch"] == a["resend_all_bytes_per_microbatch"] - a["cached_bytes_per_microbatch"]
    # ceil(93 / 12) = 8 blocks: the last of the 15 hops resends all 8; the cache never sends more than that
    assert a["hop_blocks_resend_all"][-1] == 8 and max(a["hop_blocks_cached"]) < 8
    assert all(c <= r for c, r in zip(a["hop_blocks_cached"], a["hop_blocks_resend_all"]))


@pytest.mark.parametrize("args,option", [
    (["--stages", "4", "--virtual", "2", "--microbatches", "6", "--schedule", "interleaved-1f1b"], "--microbatches"),
    (["--virtual", "0", "--schedule", "interleaved-1f1b"], "--virtual"),
    (["--stages", "50", "--virtual", "2", "--schedule", "interleaved-1f1b", "--microbatches", "50"], "--stages"),
    (["--uniform-costs", "-1,2", "--encoder-policy", "none"], "--uniform-costs"),
    (["--uniform-costs", "1;2", "--encoder-policy", "none"], "--uniform-costs"),
    (["--uniform-costs", "1,2", "--encoder-cost", "-0.5"], "--encoder-cost"),
    (["--uniform-costs", "1,2", "--encoder-policy", "none", "--gantt", "no-such-dir/g.png"], "--gantt"),
    (["--uniform-costs", "1,2", "--encoder-policy", "none", "--trace", "no-such-dir/t.json"], "--trace"),
    (["--uniform-costs", "1,2", "--encoder-policy", "none", "--trace", "."], "--trace"),
])
def test_bad_input_is_one_line_and_exit_2(args, option):
    proc = run_cli("pipeline", *args)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and option in lines[0], proc.stderr
