"""`k3sim plan --workload/--trace ... --slo-ttft --slo-tpot`: the serving search through the real CLI (in-process):
the answer in JSON, the report led by the recommendation, and each bad input one line naming its option."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

KL = str(ROOT / "scenarios" / "kimi-linear-48b-h200.yaml")
SEARCH = ["--workload", "chat", "--requests", "30", "--screen-requests", "20", "--finalists", "2", "--workers", "1"]


def test_search_answers_in_json_and_writes_a_report_led_by_the_answer(tmp_path, capsys):
    out = tmp_path / "rep"
    code, stdout, err = run_main(capsys, "plan", KL, *SEARCH, "--slo-ttft", "5", "--slo-tpot", "0.05", "--out",
                                 str(out), "--json")
    assert code == 0, err
    d = json.loads(stdout)
    assert d["meets_slo"] is True and d["search"]["recommendation"]["gpus"] == 1
    assert d["verdict"].startswith("1 GPUs: 1 x (TP1)")
    md = (out / "report.md").read_text()
    assert md.index("## Recommendation") < md.index("## Memory") if "## Memory" in md else "## Recommendation" in md
    assert (out / "figures" / "search_front.png").exists()


def test_unmet_slos_exit_0_or_2_with_require_slo(capsys):
    code, stdout, _ = run_main(capsys, "plan", KL, *SEARCH, "--slo-ttft", "0.001", "--slo-tpot", "0.05",
                               "--no-report", "--json")
    assert code == 0 and json.loads(stdout)["meets_slo"] is False
    assert_one_line(*run_main(capsys, "plan", KL, *SEARCH, "--slo-ttft", "0.001", "--slo-tpot", "0.05", "--no-report",
                              "--require-slo"), "--require-slo:", "no layout meets the SLOs; closest", "TTFT")


@pytest.mark.parametrize("argv, needles", [
    (["--slo-ttft", "5"], ["--slo-ttft:", "serving-search option", "--trace FILE or --workload NAME"]),
    (["--gpus", "8"], ["--gpus:", "serving-search option"]),
    ([*SEARCH, "--slo-percentile", "95"], ["--slo-percentile:", "50, 90, 99"]),
    ([*SEARCH, "--arrival-rate", "1", "--time-scale", "2"], ["--time-scale:", "give one"]),
    (["--workload", "nope"], ["--workload:", "unknown workload 'nope'"]),
    (["--trace", "/nonexistent/trace.jsonl"], ["--trace", "/nonexistent/trace.jsonl"]),
])
def test_bad_search_options_are_one_line(argv, needles, capsys):
    assert_one_line(*run_main(capsys, "plan", KL, *argv, "--no-report"), *needles)


def test_a_budget_that_holds_no_layout_names_gpus(capsys):
    assert_one_line(*run_main(capsys, "plan", str(ROOT / "scenarios" / "default.yaml"), *SEARCH, "--gpus", "4",
                              "--no-report"), "--gpus:", "holds the model and one request", "the smallest budget that does: --gpus 16")


def test_a_training_scenario_is_refused_for_a_serving_search(capsys):
    assert_one_line(*run_main(capsys, "plan", str(ROOT / "scenarios" / "k3-h200-train-32k.yaml"), *SEARCH,
                              "--no-report"), "--workload:", "needs a serving scenario")
