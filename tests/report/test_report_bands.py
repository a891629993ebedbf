"""The report's headline figures carry their error bands and name the checks they come from (issue 24 item 4):
the training step's summary and plan JSON, and the serving search's recommendation (its DES run at both ends)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parents[1] / "planner"))
from conftest_helpers import kl_train  # noqa: E402

from k3sim.configs import load_hardware  # noqa: E402
from k3sim.configs.bands import step_band  # noqa: E402
from k3sim.planner.plan import plan  # noqa: E402
from k3sim.report import render  # noqa: E402

KL = "scenarios/kimi-linear-48b-h200.yaml"


def test_training_summary_and_json_carry_the_band_and_its_checks(tmp_path):
    res = plan(kl_train(tmp_path), sections=("memory", "step"))
    band = step_band(load_hardware("h200"), "train", "kimi-linear-48b")
    rows = dict(render._summary(res))
    t = res.training
    lo, hi = t.step_time_s * band.low_factor * 1e3, t.step_time_s * band.high_factor * 1e3  # a sub-second step: ms
    line = rows["error band (training step)"]
    assert t.step_time_s < 1 and line.startswith(f"step time {lo:.3g}-{hi:.3g} ms, ")
    assert f"MFU {100 * t.mfu / band.high_factor:.1f}-{100 * t.mfu / band.low_factor:.1f} %: from {band.checks} " \
           "training checks of kimi-linear-48b on h200" in line
    d = res.to_json()
    assert d["step_time_s_low"] <= d["step_time_s"] <= d["step_time_s_high"]
    assert d["mfu_low"] <= d["mfu"] <= d["mfu_high"]
    assert d["step_band"]["checks"] == band.checks


def test_the_recommendation_names_its_band_and_the_checks(tmp_path):
    from k3sim.planner.serve_search import SearchSpace, load_traffic, search
    from k3sim.report.search import search_sections, with_bands

    traffic = load_traffic(trace=None, workload="chat", arrival_rate=None, seed=0, n_requests=30, limit=None)
    space = SearchSpace((1,), tp=(1,), pp=(1,), dp=(1,), max_batch=(64,), schedulers=("vllm",))
    s = search(KL, traffic, slo_ttft_s=5.0, slo_tpot_s=0.05, space=space, screen_requests=30, finalists=1)
    r = s.recommendation
    secs = search_sections(SimpleNamespace(serving_search=s), tmp_path)
    extra = " ".join(secs[0]["extra"])
    assert f"p99 TTFT {r['ttft_s_low']:.3g}-{r['ttft_s_high']:.3g} s" in extra
    assert "47 decode checks of kimi-linear-48b on h200" in extra and "mixed prefill checks" in extra
    assert secs[0]["table"]["rows"][0][-1].startswith(f"{r['ttft_s_low']:.3g}-{r['ttft_s_high']:.3g} s / ")
    res = SimpleNamespace(training=None, serving_search=s)
    line = dict(with_bands(res, []))["error band (serving)"]
    assert line.startswith(f"p99 TTFT {r['ttft_p99_s_low'] * 1e3:.3g}-{r['ttft_p99_s_high'] * 1e3:.3g} ms, p99 TPOT "
                           f"{r['tpot_p99_s_low'] * 1e3:.3g}-{r['tpot_p99_s_high'] * 1e3:.3g} ms, goodput ")
    assert "the simulation run again at both ends" in line and "decode: 47 decode checks" in line
