"""The serving search (issue 24 item 1): candidates, necessary-condition bounds, the DES on the survivors, the
cheapest layout meeting the SLOs or the closest with the SLO it misses, the front, determinism."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.planner.serve_search import (SearchSpace, Traffic, binding, candidates, describe, gpu_counts, layout_of,
                                        load_traffic, pareto, search)
from k3sim.workloads.request import TraceRequest

KL = "scenarios/kimi-linear-48b-h200.yaml"
SMALL = SearchSpace((1, 2), tp=(1, 2), pp=(1,), dp=(1,), max_batch=(64,), schedulers=("vllm",))


@pytest.fixture(scope="module")
def traffic():
    return load_traffic(trace=None, workload="chat", arrival_rate=None, seed=0, n_requests=40, limit=None)


def test_gpu_counts_are_small_powers_then_whole_nodes():
    assert gpu_counts(32, 8) == (1, 2, 4, 8, 16, 24, 32)
    assert gpu_counts(12, 8) == (1, 2, 4, 8, 12)
    assert gpu_counts(4, 8) == (1, 2, 4)


def test_candidates_cover_fleets_of_every_size(monkeypatch):
    from k3sim.configs import resolve_scenario

    model = resolve_scenario(KL)[1]
    pts = candidates(model, SMALL)
    # 1 GPU: TP1. 2 GPUs: TP1 x2 replicas (colocated, 1:1 P:D), TP2 with EP2 or without EP
    assert [(p["gpus"], p["tp"], p["ep"], p["replicas"], p["prefill_replicas"]) for p in pts] == [
        (1, 1, 1, 1, 0), (2, 1, 1, 2, 0), (2, 1, 1, 2, 1), (2, 2, 1, 1, 0), (2, 2, 2, 1, 0)]
    assert [p["index"] for p in pts] == list(range(5))
    assert describe(pts[2]) == "2 x (TP1), 1 prefill : 1 decode, batch 64, vllm"


def test_two_batch_overlap_where_attention_dp_meets_ep():
    p = {"tp": 4, "pp": 1, "dp": 2, "ep": 8}
    assert layout_of(p)["tbo"] is True
    assert "tbo" not in layout_of({**p, "dp": 1, "ep": 4})


def test_traffic_counts_prompt_work_an_unbounded_cache_cannot_save():
    """Request 2 shares its first block with request 1 (512 tokens saved), request 3 none (ids differ at 0)."""
    reqs = [TraceRequest(0.0, 1024, 10, block_ids=[1, 2]), TraceRequest(1.0, 1024, 30, block_ids=[1, 3]),
            TraceRequest(2.0, 600, 20, block_ids=[4, 5])]
    t = Traffic.of(reqs, "hand")
    assert t.mean_new_prompt_tokens == pytest.approx((1024 + 512 + 600) / 3)
    assert t.mean_output_tokens == pytest.approx(20.0)
    assert t.rate_per_s == pytest.approx(1.0)  # 2 gaps over 2 s
    assert t.median_context_tokens == pytest.approx(1024 + 10 / 2)


def test_time_scale_keeps_the_trace_gaps(tmp_path):
    from k3sim.serving.arrivals import time_scaled

    reqs = [TraceRequest(10.0, 512, 1, block_ids=[1]), TraceRequest(14.0, 512, 1, block_ids=[2])]
    assert [r.arrival_s for r in time_scaled(reqs, 0.5)] == [5.0, 7.0]  # the gap halves: twice the rate
    with pytest.raises(InputError, match="positive factor"):
        list(time_scaled(reqs, 0.0))


def test_search_answers_the_cheapest_layout_meeting_the_slos(traffic):
    res = search(KL, traffic, slo_ttft_s=5.0, slo_tpot_s=0.05, space=SMALL, screen_requests=20, finalists=2)
    assert res.candidates == 5 and len(res.screened) == 5
    assert res.meets_slo and res.recommendation["gpus"] == 1  # one GPU holds the model and meets loose SLOs
    assert res.recommendation["ttft_s"] <= 5.0 and res.recommendation["tpot_s"] <= 0.05
    assert len(res.finals) == 2 and all(r["requests"] == 40 for r in res.finals)  # the finalists ran everything
    assert res.verdict().startswith("1 GPUs: 1 x (TP1)")
    front = res.front
    assert front and all(a["ttft_p99_s"] <= b["ttft_p99_s"] for a, b in zip(front, front[1:]))
    data = res.to_json()
    assert data["meets_slo"] is True and data["simulated"] == 5


def test_unreachable_tpot_is_pruned_by_its_floor_and_answered_in_one_line(traffic):
    res = search(KL, traffic, slo_ttft_s=5.0, slo_tpot_s=1e-4, space=SMALL, screen_requests=20)
    assert not res.meets_slo and res.pruned == {"TPOT floor": 5} and res.screened == []
    assert "no candidate could be simulated" in res.verdict() and "TPOT floor" in res.verdict()


def test_a_tight_ttft_slo_names_the_closest_and_the_slo_it_misses(traffic):
    res = search(KL, traffic, slo_ttft_s=1e-3, slo_tpot_s=0.05, space=SMALL, screen_requests=20, finalists=2)
    assert not res.meets_slo and res.closest is not None
    assert "TTFT" in binding(res.closest, res) and "x the 0.001 s SLO" in binding(res.closest, res)
    assert res.verdict().startswith("no layout meets the SLOs; closest:")


def test_a_budget_no_layout_fits_names_the_option(traffic):
    from k3sim.planner.serve_search import search as s

    with pytest.raises(InputError) as e:
        s("scenarios/default.yaml", traffic, slo_ttft_s=5.0, slo_tpot_s=0.05, gpus=2,
          space=SearchSpace((1, 2), tp=(1, 2), pp=(1,), dp=(1,), max_batch=(64,), schedulers=("vllm",)))
    assert e.value.source == "--gpus" and "holds the model" in str(e.value)


def test_search_is_the_same_serial_and_on_two_processes(traffic):
    kw = dict(slo_ttft_s=5.0, slo_tpot_s=0.05, space=SMALL, screen_requests=20, finalists=2)
    a, b = search(KL, traffic, **kw), search(KL, traffic, workers=2, **kw)
    assert a.screened == b.screened and a.finals == b.finals and a.recommendation == b.recommendation


def test_pareto_keeps_rows_no_other_beats_on_both_axes():
    rows = [{"index": 0, "ttft_p99_s": 1.0, "goodput_requests_per_s_per_gpu": 1.0},
            {"index": 1, "ttft_p99_s": 2.0, "goodput_requests_per_s_per_gpu": 0.5},   # beaten by 0 on both
            {"index": 2, "ttft_p99_s": 3.0, "goodput_requests_per_s_per_gpu": 2.0}]
    assert [r["index"] for r in pareto(rows)] == [0, 2]
