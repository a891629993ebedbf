"""Error bands carried through the simulators (k3sim.planner.bands): figures scaled by a band, each step of the DES
scaled by its kind's factor (the attention-DP split kept), the DES at the band's ends ordering p99 TTFT, the serving
search's finalists with their bands, the training step's band and what its checks did not run, and `k3sim decode`'s
JSON fields and text line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from k3sim.configs import load_hardware
from k3sim.configs.bands import Band, step_band
from k3sim.planner import bands as B

KL = "scenarios/kimi-linear-48b-h200.yaml"


def _band(kind: str, lo: float, hi: float) -> Band:
    return Band(kind=kind, model="m", hardware="h200", profile="h200", basis="measured", calibration="measured",
                family="m", checks=3, error_min=lo, error_max=hi, families=("m",), configs=("c",), runs=("r",))


def test_figure_fields_scale_times_by_the_factors_and_rates_by_their_inverses():
    f = B.figure_fields(_band("decode", -0.2, 0.25), {"tpot_s": 0.05}, {"tokens_per_s": 100.0})
    # errors -20 % .. +25 %: measured in [P / 1.25, P / 0.8]
    assert f["tpot_s_low"] == pytest.approx(0.04) and f["tpot_s_high"] == pytest.approx(0.0625)
    assert f["tokens_per_s_low"] == pytest.approx(80.0) and f["tokens_per_s_high"] == pytest.approx(125.0)
    assert B.figure_fields(None, {"tpot_s": 0.05}, {}) == {"tpot_s_low": None, "tpot_s_high": None}


def test_each_step_is_scaled_by_its_kind_and_the_dp_split_is_kept():
    step = B.ScaledStep(lambda nd, cs, pf: 2.0, decode=1.5, prefill=3.0)
    assert step(8, 800, ()) == 3.0 and step(8, 800, ((512, 0),)) == 6.0
    dp = SimpleNamespace(local=lambda nd, cs, pf: 1.0, expert=lambda has_prefill, tokens, most: 0.5, q=2, group=4)
    s = B.ScaledStep(dp, decode=2.0, prefill=4.0)
    assert s.local(1, 1, ()) == 2.0 and s.local(1, 1, ((8, 0),)) == 4.0
    assert s.expert(False, 10, 1) == 1.0 and s.expert(True, 10, 1) == 2.0 and (s.q, s.group) == (2, 4)


@pytest.fixture(scope="module")
def chat30():
    from k3sim.workloads.synthetic import synthetic_workload

    return list(synthetic_workload("chat", 0, 30))


def test_the_des_at_the_band_ends_orders_p99_ttft(chat30, monkeypatch):
    """Kimi-Linear on one H200, 30 chat requests: a band that over- and under-predicts (fast end < 1 < slow end)
    gives p99 TTFT fast < point < slow."""
    from k3sim.serving.run import ServeSetup, simulate

    setup = ServeSetup.from_scenario(KL)
    monkeypatch.setattr(B, "serve_bands", lambda s: (_band("decode", -0.3, 0.25), _band("prefill", -0.4, 0.2)))
    assert B.end_factors(setup, "fast") == (pytest.approx(0.8), pytest.approx(1 / 1.2))
    point = simulate(setup, chat30).summary["ttft_p99_s"]
    fast = B.simulate_end(setup, chat30, "fast")["ttft_p99_s"]
    slow = B.simulate_end(setup, chat30, "slow")["ttft_p99_s"]
    assert fast < point < slow


def test_the_search_finalists_carry_their_bands():
    from k3sim.planner.serve_search import SearchSpace, load_traffic, search

    traffic = load_traffic(trace=None, workload="chat", arrival_rate=None, seed=0, n_requests=30, limit=None)
    space = SearchSpace((1,), tp=(1,), pp=(1,), dp=(1,), max_batch=(64,), schedulers=("vllm",))
    res = search(KL, traffic, slo_ttft_s=5.0, slo_tpot_s=0.05, space=space, screen_requests=30, finalists=1)
    r = res.recommendation
    for k in ("ttft_s", "tpot_s", "ttft_p99_s", "goodput_requests_per_s_per_gpu"):
        assert r[f"{k}_low"] <= r[k] <= r[f"{k}_high"]
    assert r["tpot_s_high"] > r["tpot_s"]  # the committed decode band reads the model low: a slower slow end
    assert r["band"]["decode"]["family"] == "kimi-linear-48b" and r["meets_slo_slow_end"] in (True, False)
    json.dumps(res.to_json())  # the bands travel in the plan JSON


def test_the_training_band_scales_the_step_and_names_what_its_checks_did_not_run():
    hw = load_hardware("h200")
    t = SimpleNamespace(step_time_s=10.0, tokens_per_s=1000.0, tokens_per_s_per_gpu=10.0, mfu=0.4, hfu=0.5,
                        options={"precision": "fp8", "moe_glue": "calibrated"})
    f = B.training_band(hw, "kimi-k3", t)
    band = step_band(hw, "train", "kimi-k3")
    assert f["step_time_s_high"] == pytest.approx(10.0 * band.high_factor) and f["step_time_s_low"] <= 10.0
    assert f["mfu_low"] == pytest.approx(0.4 / band.high_factor) and f["mfu_high"] >= 0.4
    assert f["step_band"]["not_checked"].endswith("not in them: fp8 GEMMs")
    assert "training checks of kimi-k3 on h200" in f["step_band"]["source"]


def test_decode_json_has_the_band_fields_and_the_text_names_the_checks(cli, cli_json):
    args = ["decode", "--model", "models/kimi-linear-48b.yaml", "--tp", "1", "--pp", "1", "--context", "4096",
            "--batch", "4"]
    d = cli_json(*args)
    assert d["tpot_s_low"] <= d["tpot_s"] < d["tpot_s_high"]
    assert d["tokens_per_s_per_gpu_low"] < d["tokens_per_s_per_gpu"] <= d["tokens_per_s_per_gpu_high"]
    band = step_band(load_hardware("h200"), "decode", "kimi-linear-48b")
    assert d["tpot_s_high"] == pytest.approx(d["tpot_s"] * band.high_factor)
    assert d["band"]["checks"] == band.checks and d["band"]["family"] == "kimi-linear-48b"
    text = " ".join(cli(*args).stdout.replace("│", " ").split())  # the table wraps long values over rows
    assert f"{d['tpot_s'] * 1e3:.3f} ms (band {d['tpot_s_low'] * 1e3:.3f}-{d['tpot_s_high'] * 1e3:.3f} ms from " \
           f"{band.checks} decode checks of kimi-linear-48b on h200" in text
