"""`k3sim serve --bands`: the same requests served at both ends of the step model's error band (issue 24 item
4): the *_low / *_high figures bracket the run's own and name the checks; with --sweep-rate it is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

KL = str(ROOT / "scenarios" / "kimi-linear-48b-h200.yaml")


def test_bands_bracket_the_run_and_name_their_checks(capsys):
    code, out, err = run_main(capsys, "serve", "--scenario", KL, "--workload", "chat", "--requests", "30", "--bands",
                              "--json")
    assert code == 0, err
    d = json.loads(out)
    for k in ("ttft_p99_s", "tpot_p99_s", "ttft_p50_s", "goodput_requests_per_s"):
        assert d[f"{k}_low"] <= d[k] <= d[f"{k}_high"], k
    assert d["tpot_p99_s_high"] > d["tpot_p99_s"]  # Kimi-Linear's decode checks read low: the slow end is slower
    assert "decode checks of kimi-linear-48b on h200" in d["band"]["decode"]


def test_bands_with_a_rate_sweep_is_one_line(capsys):
    assert_one_line(*run_main(capsys, "serve", "--scenario", KL, "--workload", "chat", "--requests", "30", "--bands",
                              "--sweep-rate", "0.5,1"), "--bands:", "without --sweep-rate")
