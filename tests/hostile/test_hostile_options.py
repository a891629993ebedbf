"""Hostile command-line options: one line naming the option, exit 2, nothing written, quickly (issue 11)."""

from __future__ import annotations

import json
import time

import pytest

from hostile_helpers import ROOT, assert_one_line, run_main

K3 = "models/kimi-k3.yaml"
CONV = ROOT / "tests/data/traces/conversation_head300.jsonl"


@pytest.mark.parametrize("argv, needles", [
    # memory: fields that have no effect in the mode were accepted and ignored
    (["memory", "--model", K3, "--tp", "8", "--pp", "2", "--ep", "8", "--zero-stage", "3"],
     ["--zero-stage:", "no effect in mode serve"]),
    (["memory", "--model", K3, "--tp", "8", "--pp", "2", "--ep", "8", "--micro-batch", "4"],
     ["--micro-batch:", "mode train only"]),
    (["memory", "--model", K3, "--mode", "train", "--tp", "8", "--pp", "16", "--ep", "64", "--dp", "64",
      "--context", "32768", "--prefill-chunk", "4096"], ["--prefill-chunk:", "mode serve only"]),
    # a "does not fit" from --prefill-chunk 1e11 advised raising pp or ep: the chunk is now bounded
    (["memory", "--model", K3, "--tp", "8", "--pp", "2", "--ep", "8", "--prefill-chunk", "100000000000"],
     ["--prefill-chunk:", "less than or equal"]),
    (["memory", "--model", K3, "--tp", "8", "--pp", "2", "--ep", "8", "--context", str(10 ** 15)],
     ["--context:", "less than or equal"]),
    (["memory", "--model", K3, "--tp", "100000"], ["--tp:", "less than or equal"]),
    (["memory", "--model", K3, "--tp", "true"], ["--tp", "integer"]),
    # cp blamed the kernel field T for --seq-len; a 1e18 sweep exited 0 with skipped rows
    (["cp", "--seq-len", "1e15"], ["--seq-len:", "outside", "tokens"]),
    (["cp", "--seq-len", "1G", "--cp", "2"], ["--seq-len:", "reached from --seq-len"]),
    (["cp", "--tp", "7"], ["--tp:", "tp=7 does not divide the 96 KDA heads"]),
    # prefix-cache ran with --tp 7 although 96 KDA heads do not divide (memory and cp refuse)
    (["prefix-cache", "--trace", CONV, "--tp", "7"], ["--tp:", "tp=7 does not divide the 96 KDA heads"]),
    (["prefix-cache", "--trace", CONV, "--tp", "1000"], ["--tp:", "does not divide"]),
    (["prefix-cache", "--trace", CONV, "--capacity-bytes", "1e30"], ["--capacity-bytes:", "outside"]),
    (["prefix-cache", "--trace", CONV, "--hash-block", str(2 ** 40)], ["--hash-block:", "outside"]),
    (["prefix-cache", "--trace", CONV, "--requests", "50"], ["--requests:", "synthetic --workload only"]),
    (["prefix-cache", "--trace", ROOT / "data"], ["--trace", "is a directory"]),
    # tp=16 on H200 (8-GPU NVLink domain) ran without a cluster in memory / decode / cp / pipeline
    (["memory", "--model", K3, "--tp", "16", "--pp", "2", "--ep", "8"], ["--tp:", "8-GPU NVLink domain of h200"]),
    (["decode", "--tp", "16", "--pp", "2", "--ep", "8"], ["--tp:", "8-GPU NVLink domain of h200"]),
    # decode at scale (issue 21): EP past the expert slots, node-limited routing past the EP group's nodes,
    # low-latency kernels past their buffer
    (["decode", "--model", "models/deepseek-v3.yaml", "--tp", "1", "--pp", "1", "--ep", "512", "--attention-dp",
      "512"], ["--ep:", "256 routed experts + 0 redundant slots"]),
    (["decode", "--model", "models/deepseek-v3.yaml", "--tp", "1", "--pp", "1", "--ep", "16", "--attention-dp", "16",
      "--max-nodes-per-token", "4"], ["--max-nodes-per-token:", "2 node(s)"]),
    (["decode", "--model", "models/deepseek-v3.yaml", "--tp", "1", "--pp", "1", "--ep", "16", "--attention-dp", "16",
      "--ep-kernel", "low-latency", "--batch", "256", "--context", "1024"], ["--ep-kernel:", "low-latency buffer"]),
    (["cp", "--tp", "16"], ["--tp:", "8-GPU NVLink domain of h200"]),
    (["pipeline", "--tp", "16", "--stages", "4"], ["--tp", "8-GPU NVLink domain of h200"]),
    (["kernel-time", "moe_grouped_bf16", "--set", "E=8", "--set", "topk=16", "--set", "B=4", "--set", "K=64",
      "--set", "N=64"], ["topk"]),
])
def test_bad_option_is_one_line_naming_it(capsys, argv, needles):
    assert_one_line(*run_main(capsys, *argv), *needles)


def test_a_billion_synthetic_requests_are_refused_at_once(capsys):
    """Reached 8.5 GB in 30 s before; now the documented bound refuses it before generating anything."""
    t0 = time.perf_counter()
    assert_one_line(*run_main(capsys, "prefix-cache", "--workload", "chat", "--requests", "1000000000"),
                    "--requests:", "100,000", "stream")
    assert time.perf_counter() - t0 < 30  # a hang guard (it grew to GBs before), not a speed test


def test_a_huge_output_length_in_a_trace_is_refused_by_line(tmp_path, capsys):
    """A trace line with output_length 1e15 ran past 60 s at 6.9 GB."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1000000000000000, '
                     '"hash_ids": [1, 2]}\n')
    t0 = time.perf_counter()
    assert_one_line(*run_main(capsys, "prefix-cache", "--trace", trace, "--strict"),
                    str(trace), "line 1", "output_length 1,000,000,000,000,000 exceeds 16,777,216 tokens")
    # without --strict the line is skipped, and a trace with no valid request is still an error
    assert_one_line(*run_main(capsys, "prefix-cache", "--trace", trace), "no valid request", "output_length")
    assert time.perf_counter() - t0 < 30  # a hang guard (it ran past 60 s before), not a speed test


def test_a_sweep_with_no_runnable_point_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert_one_line(*run_main(capsys, "prefix-cache", "--trace", CONV, "--sweep", "--capacities", "1",
                              "--physical-blocks", "512", "--policies", "decoupled", "--out", out),
                    "--capacities", "below what one request needs")
    assert not out.exists()
    assert_one_line(*run_main(capsys, "cp", "--sweep", "--seq-lens", "1e18", "--out", out), "--seq-lens:")
    assert not out.exists()


def test_no_arguments_print_help_not_a_bare_error(capsys):
    for argv in ([], ["calibrate"]):
        code, out, err = run_main(capsys, *argv)
        assert code == 0 and err == "" and out.startswith("Usage: k3sim"), (argv, out, err)


def test_help_shows_defaults_and_no_bool_types(capsys):
    """rich markup swallowed `[default: ...]` written in help texts and printed `<bool>` on every flag."""
    code, out, err = run_main(capsys, "cp", "--help")
    assert code == 0 and err == ""
    text = " ".join(out.split())
    for default in ("[default: 1M]", "[default: kcp]", "[default: allgather-kv]", "[default: latent]"):
        assert default in text, default
    assert "<bool>" not in out
    code, out, _ = run_main(capsys, "prefix-cache", "--help")
    assert "[default: 1]" in " ".join(out.split()) and "<bool>" not in out
    code, out, _ = run_main(capsys, "calibrate", "validate", "--help")
    assert "[default:./k3sim-out/calibration/]" in "".join(out.split()) and str(ROOT) not in out


# ------------------------------------------------------------------------------------------ issue 19: bounds and fixes
UNIFORM = ("--uniform-costs", "1,2")


@pytest.mark.parametrize("argv, needles", [
    # `pipeline --stages 10000` ran past a minute; uniform costs of 1e308 gave null results
    (["pipeline", "--stages", "10000", *UNIFORM, "--encoder-policy", "none"], ["--stages:", "outside [1, 256]"]),
    (["pipeline", "--stages", "200", "--microbatches", "2000", *UNIFORM, "--encoder-policy", "none"],
     ["--microbatches:", "800,000 compute ops", "131,072", "give fewer"]),
    (["pipeline", "--stages", "64", "--microbatches", "1024", "--schedule", "zb-h1", *UNIFORM,
      "--encoder-policy", "none"], ["--microbatches:", "x 3", "give fewer"]),
    (["pipeline", "--uniform-costs", "1e308,1e308", "--encoder-policy", "none"], ["--uniform-costs:", "outside"]),
    (["pipeline", "--uniform-costs", "1,2,1e300", "--encoder-policy", "none", "--schedule", "zb-h1"],
     ["--uniform-costs:", "outside [0, 1,000,000,000] s"]),
    (["pipeline", *UNIFORM, "--encoder-cost", "1e9"], ["--encoder-cost:", "stage forwards"]),
    # --encoder-upfront 1e9 was clamped to the micro-batch count
    (["pipeline", *UNIFORM, "--encoder-cost", "0.5", "--encoder-upfront", "1000000000"],
     ["--encoder-upfront:", "give 0 to 16"]),
    (["pipeline", *UNIFORM, "--encoder-cost", "0.5", "--encoder-upfront", "-1"], ["--encoder-upfront:", "give 0"]),
    (["pipeline", "--seq-len", str(2 ** 31)], ["--seq-len:", "outside"]),
    # `plan --serving-requests` errors said --requests
    (["plan", "--serving-requests", "1000000", "--no-report"], ["--serving-requests:", "outside [1, 100,000]"]),
    (["sweep", ROOT / "scenarios/default.yaml", "--requests", "1000000"], ["--requests:", "outside [1, 100,000]"]),
    # a serve layout's virtual stages had no effect on the serving simulation
    (["memory", "--model", K3, "--tp", "8", "--pp", "2", "--ep", "8", "--virtual-stages", "2"],
     ["--virtual-stages:", "no effect in mode serve"]),
])
def test_issue19_bad_option_is_one_line_naming_it(capsys, argv, needles):
    assert_one_line(*run_main(capsys, *argv), *needles)


TRAIN_LAYOUT = ("--mode", "train", "--tp", "8", "--pp", "16", "--ep", "64", "--dp", "64", "--context", "32768")


@pytest.mark.parametrize("extra", [("--no-recompute",), ("--micro-batch", "64"), ("--pp", "4", "--ep", "8")])
def test_memory_that_does_not_fit_names_options_that_were_computed_to_fit(capsys, extra):
    """`memory --no-recompute` said only "does not fit"; now the line names single-option changes, and each
    one named really fits (re-run with it: exit 0, fits)."""
    argv = ["memory", "--model", K3, *TRAIN_LAYOUT, *extra]
    line = assert_one_line(*run_main(capsys, *argv), "does not fit", "fits with --")
    fixes = line.split("fits with ", 1)[1].split(" or ")
    assert fixes
    if "--no-recompute" in extra:
        assert fixes[0].startswith("--recompute (")
    for fix in fixes:
        words = fix.split(" (")[0].split()
        base = [a for a in argv if a != "--no-recompute"] if words[0] == "--recompute" else argv
        if words[0] != "--recompute" and words[0] in base:  # the option replaces the value given
            i = base.index(words[0])
            base = base[:i] + base[i + 2:]
        code, out, err = run_main(capsys, *base, *words, "--json")
        assert code == 0 and json.loads(out)["fits"], (fix, err)
