"""`k3sim plan --tokens N --days D` on bad input (issue 22): values outside their bounds, half a budget, a budget
for a serving scenario, and a budget no layout meets: one line naming the option or field, exit 2, no report."""

from __future__ import annotations

import pytest

from hostile_helpers import ROOT, assert_one_line, run_main

TRAIN = ROOT / "scenarios/k3-h200-train-32k.yaml"
SERVE = ROOT / "scenarios/default.yaml"


@pytest.mark.parametrize("argv, needles", [
    (["--tokens", "1e20", "--days", "60"], ["--tokens:", "outside [1,000,000, 1e+15] tokens"]),
    (["--tokens", "1000", "--days", "60"], ["--tokens:", "at least 1,000,000"]),
    (["--tokens", "nan", "--days", "60"], ["--tokens:", "finite"]),
    (["--tokens", "15e12", "--days", "0"], ["--days:", "at least 0.01"]),
    (["--tokens", "15e12", "--days", "1e5"], ["--days:", "outside [0.01, 3,650] days"]),
    (["--tokens", "15e12", "--days", "inf"], ["--days:", "finite"]),
    (["--tokens", "15e12", "--days", "60", "--max-gpus", "0"], ["--max-gpus:", "positive"]),
    (["--tokens", "15e12", "--days", "60", "--max-gpus", "2000000"], ["--max-gpus:", "outside [1, 1,048,576] GPUs"]),
    (["--days", "60"], ["--days:", "no token count is given", "add --tokens N"]),
    (["--tokens", "15e12"], ["--tokens:", "no wall-clock time", "add --days D"]),
    (["--max-gpus", "4096"], ["--max-gpus:", "no token budget is given"]),
])
def test_bad_budget_options_are_one_line(tmp_path, capsys, argv, needles):
    out = tmp_path / "r"
    assert_one_line(*run_main(capsys, "plan", TRAIN, *argv, "--out", out), *needles)
    assert not out.exists()


def test_a_budget_for_a_serving_scenario_is_refused(tmp_path, capsys):
    out = tmp_path / "r"
    assert_one_line(*run_main(capsys, "plan", SERVE, "--tokens", "15e12", "--days", "60", "--out", out),
                    "--tokens:", "workload.mode is serve", "plan a train scenario")
    assert not out.exists()


def test_half_a_budget_in_the_scenario_names_the_field(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(TRAIN.read_text().replace("../models", str(ROOT / "models"))
                    .replace("workload:", "training:\n  tokens: 1.5e13\nworkload:"))
    assert_one_line(*run_main(capsys, "plan", path, "--no-report"), str(path), "field 'training.tokens'",
                    "add training.days or --days")
    # the scenario's days with --tokens on the command line is a whole budget: no refusal of --tokens
    path.write_text(TRAIN.read_text().replace("../models", str(ROOT / "models"))
                    .replace("workload:", "training:\n  days: 1\nworkload:"))
    code, _, err = run_main(capsys, "plan", path, "--no-report", "--tokens", "1e15", "--max-gpus", "1024")
    assert code == 2 and "--tokens:" in err and "100 % MFU" in err  # 1e15 tokens in a day need far more GPUs


def test_a_budget_no_layout_meets_names_the_best_layout(tmp_path, capsys):
    """K3 at 32K: 15T tokens in 60 days on at most 8,192 GPUs: no layout of the sweep grid meets it; the line
    gives the best layout's GPUs, tokens/s and days (the plan's table is printed first, as for a layout that
    does not fit; --json prints the data instead, with the same exit code)."""
    code, out, err = run_main(capsys, "plan", TRAIN, "--tokens", "15e12", "--days", "60", "--max-gpus", "8192",
                              "--no-report")
    assert code == 2 and "best found" in out
    line = assert_one_line(code, "", err, "--days:", "need 2,893,519 tokens/s", "the best layout on up to 8,192 GPUs",
                           "tokens/s:", "days")
    assert "8,192 GPUs) trains" in line or "4,096 GPUs) trains" in line
    days = float(line.split("tokens/s: ")[1].split(" days")[0])
    assert days > 60
