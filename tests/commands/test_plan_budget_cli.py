"""`k3sim plan SCENARIO --tokens N --days D`: the token budget's answer in the JSON, the text and the report; a
budget no layout meets writes its report, then one line and exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "planner"))
from conftest_helpers import kl_train  # noqa: E402


def test_plan_with_a_token_budget_answers_the_smallest_cluster(cli, tmp_path):
    out = tmp_path / "r"
    proc = cli("plan", kl_train(tmp_path), "--tokens", "1e10", "--days", "1", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    b = json.loads(proc.stdout)["token_budget"]
    assert b["met"] and b["tokens"] == 1e10 and b["days"] == 1.0
    assert b["required_tokens_per_s"] == 1e10 / 86_400
    c = b["chosen"]
    assert b["gpus"] == c["gpus"] and b["days_taken"] == c["days"] <= 1.0 and b["runner_up"]["days"] >= c["days"]
    assert c["tokens_per_step"] == 16 * 4096   # the scenario's global batch, kept on every cluster
    assert json.loads((out / "plan.json").read_text())["token_budget"] == b
    md = (out / "report.md").read_text()
    assert "## Token budget: the smallest cluster" in md and f"{c['gpus']:,} GPUs" in md
    assert "## Token budget: clusters swept" in md and "<h2 id=\"token_budget\">" in (out / "report.html").read_text()


def test_plan_text_prints_the_answer_and_the_scenario_fields_work(cli, tmp_path):
    path = kl_train(tmp_path, training="  tokens: 1.0e10\n  days: 1")
    proc = cli("plan", path, "--no-report")
    assert proc.returncode == 0, proc.stderr
    assert "token budget" in proc.stdout and "smallest cluster" in proc.stdout and "runner-up" in proc.stdout
    assert "115,741 tokens/s" in proc.stdout   # 1e10 tokens / 86,400 s
    # --days overrides training.days: half a day needs twice the rate
    proc = cli("plan", path, "--no-report", "--days", "0.5", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["token_budget"]["required_tokens_per_s"] == 1e10 / 43_200


def test_a_budget_no_layout_meets_writes_the_report_then_exits_2(cli, tmp_path):
    out = tmp_path / "r"
    proc = cli("plan", kl_train(tmp_path), "--tokens", "1e11", "--days", "1", "--max-gpus", "64", "--out", out)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and err.startswith("error: --days: 1e+11 tokens in 1 days need 1,157,407 tokens/s")
    assert "the best layout on up to 64 GPUs" in err and "GPUs) trains" in err and "days" in err
    md = (out / "report.md").read_text()
    assert "Not met:" in md and "best found" in md
    proc = cli("plan", kl_train(tmp_path), "--tokens", "1e11", "--days", "1", "--max-gpus", "64", "--no-report",
               "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["token_budget"]["met"] is False
