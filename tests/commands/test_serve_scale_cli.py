"""`k3sim serve` with the serving-at-scale layout options (issue 21 item 8), in-process: the options replace
the scenario's layout (attention DP, EP, kernels, TBO, MTP), the JSON reports each pool's layout, and bad
input is one line naming the option, exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

KL = "scenarios/kimi-linear-48b-h200.yaml"  # one H200, TP1: fast
K3 = "scenarios/default.yaml"  # TP8 PP2 EP8 on 16 GPUs


def serve_json(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, "serve", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_attention_dp_options_replace_the_scenario_layout(capsys):
    d = serve_json(capsys, "--scenario", KL, "--workload", "chat", "--requests", "30", "--attention-dp", "4",
                   "--ep", "4", "--replicas", "1", "--tbo", "--routing-zipf", "0.5")
    lay = d["layouts"]["mixed"]
    assert (lay["dp"], lay["ep"], lay["tp"], lay["gpus"], lay["tbo"], lay["routing_zipf"]) == (4, 4, 1, 4, True, 0.5)
    assert d["gpus"] == 4 and d["replicas"] == {"mixed": 1} and d["requests"] == 30


def test_mtp_options_reach_the_serving_section(capsys):
    base = serve_json(capsys, "--scenario", KL, "--workload", "chat", "--requests", "30")
    mtp = serve_json(capsys, "--scenario", KL, "--workload", "chat", "--requests", "30", "--mtp", "2",
                     "--acceptance", "0.8")
    assert mtp["mtp"] == {"drafts": 2, "acceptance": 0.8} and base["mtp"]["drafts"] == 0
    # 1 + 0.8 + 0.64 = 2.44 tokens per verify step: fewer, costlier steps for the same requests
    assert mtp["steps"] < base["steps"]


@pytest.mark.parametrize("argv, option, words", [
    (("--attention-dp", "2", "--ep", "7", "--replicas", "1"), "--ep", "does not divide"),
    (("--attention-dp", "2", "--ep", "16", "--replicas", "1", "--ep-kernel", "foo"), "--ep-kernel", "Input should be"),
    (("--attention-dp", "2", "--ep", "16", "--replicas", "1", "--dispatch-dtype", "fp9"), "--dispatch-dtype",
     "Input should be"),
    (("--attention-dp", "2", "--ep", "16", "--replicas", "1", "--max-nodes-per-token", "5"), "--max-nodes-per-token",
     "exceeds the 2 node(s)"),
    (("--ep-kernel", "normal",), "--ep-kernel", "no replica of this fleet runs one"),
    (("--tbo-variant", "overlap"), "--tbo-variant", "no effect without tbo"),
    (("--attention-dp", "3"), "--attention-dp", "give --replicas N"),
    (("--attention-dp", "2", "--ep", "1000", "--replicas", "1"), "--ep", "larger than the 896 routed experts"),
    (("--attention-dp", "2", "--ep", "16", "--replicas", "1", "--ep-kernel", "low-latency"), "--ep-kernel",
     "exceeds the low-latency buffer"),  # raised inside the simulation (simpy copies the exception)
    (("--acceptance", "0.8"), "--acceptance", "no effect without mtp"),
    (("--mtp", "2"), "--mtp", "needs an acceptance rate"),
])
def test_bad_layout_options_are_one_line_naming_the_option(capsys, argv, option, words):
    code, out, err = run_main(capsys, "serve", "--scenario", K3, "--workload", "chat", "--requests", "5", *argv)
    line = assert_one_line(code, out, err, words)
    assert line.startswith(f"error: {option}: "), line
