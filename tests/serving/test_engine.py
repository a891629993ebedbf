"""The engine on hand-worked timelines (constant step costs), preemption, Little's law, determinism."""

from __future__ import annotations

import gc
import math

import pytest

from k3sim.serving.entities import Request
from k3sim.serving.run import ServeSetup, simulate
from k3sim.workloads.request import TraceRequest

from serving_helpers import constant, linear, scenario  # noqa: F401  (scenario: a fixture)


def _req(t, L, O, first_id):
    n = -(-L // 512)
    return TraceRequest(t, L, O, block_ids=list(range(first_id, first_id + n)))


def _frame(res):
    return res.frame().set_index("request")


def test_two_requests_one_chunk_budget(scenario):
    """Budget 1000 tokens, every step 1 s. A (1500 prompt, 3 out) at 0, B (400, 2) at 0.5.
    step 1 [0,1]: A chunk 1000. step 2 [1,2]: A's last 500 + B admitted with the 500 left (its 400): both
    finish prefill -> first tokens at 2. step 3 [2,3]: decode A, B (B's 2nd token: done at 3).
    step 4 [3,4]: decode A (3rd token: done at 4)."""
    setup = ServeSetup.from_scenario(scenario({"engine": {"token_budget": 1000, "pool_bytes": "unbounded",
                                                          "pp_microbatches": False}}))  # one engine
    res = simulate(setup, [_req(0.0, 1500, 3, 0), _req(0.5, 400, 2, 100)], step_seconds=constant(1.0))
    df = _frame(res)
    assert df.loc[0, "ttft_s"] == 2.0 and df.loc[0, "e2e_s"] == 4.0 and df.loc[0, "tpot_s"] == 1.0
    assert df.loc[1, "ttft_s"] == 1.5 and df.loc[1, "e2e_s"] == 2.5 and df.loc[1, "tpot_s"] == 1.0
    assert df.loc[0, "queue_s"] == 0.0 and df.loc[1, "queue_s"] == 0.5
    s = res.summary
    assert s["steps"] == 4 and s["sim_seconds"] == 4.0
    # Little: 6.5 request-seconds over 4 s = 1.625 = (2 / 4 s) x 3.25 s
    assert s["mean_requests_in_system"] == pytest.approx(1.625) and s["mean_e2e_s"] == pytest.approx(3.25)


def test_decodes_ride_along_and_take_budget(scenario):
    """Budget 4: A (3 prompt, 4 out) alone, then B (5 prompt) arrives while A decodes: A's decode takes 1 of
    the 4 tokens, so B's prefill goes 3 + 2 over two steps (a chunked prefill next to a running decode)."""
    setup = ServeSetup.from_scenario(scenario({"engine": {"token_budget": 4, "pool_bytes": "unbounded",
                                                          "hash_block_tokens": 512}}))
    res = simulate(setup, [_req(0.0, 3, 4, 0), _req(1.0, 5, 2, 10)], step_seconds=constant(1.0))
    df = _frame(res)
    # A: prefill [0,1] (first token at 1), decodes at 2, 3, 4 -> done at 4. B arrives at 1: chunk 3 in [1,2],
    # chunk 2 in [2,3] -> first token at 3, decode [3,4] -> done at 4.
    assert df.loc[0, "first_token_s"] == 1.0 and df.loc[0, "completion_s"] == 4.0
    assert df.loc[1, "first_token_s"] == 3.0 and df.loc[1, "completion_s"] == 4.0


def test_sarathi_caps_the_chunk_at_the_tpot_slo(scenario):
    """Step cost 0.1 s + 1e-4 s per token; SLO 0.16 s: the largest chunk (a multiple of the 512-token hash
    block) within it is 512 tokens (0.1512 s); a 2048-token prompt then takes 4 steps instead of one."""
    body = {"engine": {"pool_bytes": "unbounded", "scheduler": "sarathi"}, "slo_tpot_s": 0.16}
    res = simulate(ServeSetup.from_scenario(scenario(body)), [_req(0.0, 2048, 1, 0)], step_seconds=linear(0.1, 1e-4))
    assert _frame(res).loc[0, "ttft_s"] == pytest.approx(4 * 0.1512)
    body["engine"]["scheduler"] = "vllm"
    res = simulate(ServeSetup.from_scenario(scenario(body)), [_req(0.0, 2048, 1, 0)], step_seconds=linear(0.1, 1e-4))
    assert _frame(res).loc[0, "ttft_s"] == pytest.approx(0.1 + 0.2048)


def test_preemption_by_recompute_when_memory_runs_out(scenario):
    """A pool that admits both prompts but not both outputs: the later request is preempted, recomputes
    prompt + generated tokens (its prompt pages still cached), and everything finishes."""
    page = 1024 * 27648  # K3 default page at TP 8: 1024 tokens x 27,648 B
    # 9 pages per GPU hold ~16 whole-model pages at PP 2 (a GPU holds about half the layers). Admission
    # takes 3 KDA state pages + ceil(2049 / 1024) = 3 prompt pages per request (12 for both); finishing
    # needs ceil(6048 / 1024) = 6 KV pages + 3 state pages each (18 for both): more than the pool.
    body = {"engine": {"pool_bytes": 9 * page, "watermark_fraction": 0.0, "pp_microbatches": False}}  # one pool
    setup = ServeSetup.from_scenario(scenario(body))
    assert 12 <= setup.pools[0].cache.num_pages < 18
    reqs = [_req(0.0, 2048, 4000, 0), _req(0.0, 2048, 4000, 100)]
    res = simulate(setup, reqs, step_seconds=constant(0.01))
    s = res.summary
    assert s["requests"] == 2 and s["preemptions"] >= 1
    assert s["little_law_relative_error"] < 1e-9
    df = _frame(res)
    assert df["preemptions"].sum() == s["preemptions"]
    # the same with outputs reserved at admission: no preemption, the second request waits instead
    body["engine"]["reserve_output"] = True
    res2 = simulate(ServeSetup.from_scenario(scenario(body)), reqs, step_seconds=constant(0.01))
    assert res2.summary["preemptions"] == 0 and res2.summary["requests"] == 2
    assert _frame(res2).loc[1, "queue_s"] > 0


def test_request_larger_than_the_pool_is_rejected_not_stalled(scenario):
    page = 1024 * 27648
    setup = ServeSetup.from_scenario(scenario({"engine": {"pool_bytes": 9 * page}}))
    res = simulate(setup, [_req(0.0, 30000, 10, 0), _req(1.0, 1000, 10, 100)], step_seconds=constant(0.01))
    assert res.summary["requests"] == 1 and res.summary["requests_rejected"] == 1


def test_littles_law_and_no_request_objects_left(scenario):
    from k3sim.serving.arrivals import synthetic_stream

    setup = ServeSetup.from_scenario(scenario({"engine": {"token_budget": 2048}}))
    res = simulate(setup, synthetic_stream(1500, seed=3, rate=40.0), step_seconds=linear(0.005, 2e-6))
    s = res.summary
    assert s["requests"] == 1500
    assert s["little_law_relative_error"] < 0.02
    assert s["mean_requests_in_system"] == pytest.approx(s["throughput_requests_per_s"] * s["mean_e2e_s"], rel=0.02)
    gc.collect()
    assert not any(type(o) is Request for o in gc.get_objects())  # only the compact records remain
    assert len(res.records) == 1500 and res.records.completion_s.typecode == "d"


def test_determinism_under_a_seed(scenario):
    from k3sim.serving.arrivals import retime, synthetic_stream

    setup = ServeSetup.from_scenario(scenario({"engine": {"token_budget": 2048}}))

    def run(seed):
        reqs = retime(synthetic_stream(400, seed=1, rate=5.0), "gamma", 30.0, seed=seed, cv=2.0)
        return simulate(setup, reqs, step_seconds=linear(0.005, 2e-6)).frame()

    a, b, c = run(7), run(7), run(8)
    assert a.equals(b)
    assert not a["arrival_s"].equals(c["arrival_s"])


def test_low_load_ttft_is_one_prefill_and_tpot_is_decode_at_batch_1(scenario):
    """Requests 1000 s apart on the real step model: TTFT = the step model's time of the prompt's chunks;
    TPOT = `k3sim decode` at batch 1 at the request's mean context (within the context bucketing, 1 %)."""
    from k3sim.decode import decode_step
    from k3sim.step import StepCostModel, StepLayout

    setup = ServeSetup.from_scenario(scenario({"engine": {"pool_bytes": "unbounded"}}))
    L, O = 12000, 40
    res = simulate(setup, [_req(0.0, L, O, 0), _req(1000.0, L, O, 500)])
    df = _frame(res)
    layout = StepLayout(tp=8, pp=2, ep=8)
    scm = StepCostModel(setup.model, setup.hw, layout)
    prefill = scm.step_seconds(0, 0, ((8192, 0),)) + scm.step_seconds(0, 0, ((L - 8192, 8192),))
    assert df["ttft_s"].tolist() == pytest.approx([prefill] * 2, rel=0.01)
    tpot = decode_step(setup.model, setup.hw, layout, 1, L + O // 2).tpot_s
    assert df["tpot_s"].tolist() == pytest.approx([tpot] * 2, rel=0.01)
    assert math.isclose(res.summary["token_hit_rate"], 0.0)


def test_pp_microbatches_run_pp_engines_on_shares_of_the_pool(scenario):
    """PP 2 with micro-batches in flight (the default): two engines per replica, each with half the pool; two
    requests that arrive together then prefill side by side (both first tokens at 1 s). Off, one engine: A
    fills step 1's 8192-token budget; in step 2 A's decode takes one token, so B prefills 8191 and its last
    token in step 3, and the result warns that each stage idles half the time."""
    reqs = [_req(0.0, 8192, 2, 0), _req(0.0, 8192, 2, 100)]
    off_setup = ServeSetup.from_scenario(scenario({"engine": {"pp_microbatches": False}}))
    off = simulate(off_setup, reqs, step_seconds=constant(1.0))
    assert sorted(off.frame()["first_token_s"]) == [1.0, 3.0]
    assert off.summary["batches_in_flight"] == {"mixed": 1}
    assert len(off.summary["warnings"]) == 1 and "stage idles 1/2" in off.summary["warnings"][0]
    setup = ServeSetup.from_scenario(scenario({}))
    res = simulate(setup, reqs, step_seconds=constant(1.0))
    assert sorted(res.frame()["first_token_s"]) == [1.0, 1.0]
    assert sorted(res.frame()["replica"]) == [0, 1]
    assert res.summary["batches_in_flight"] == {"mixed": 2} and res.summary["warnings"] == []
    assert setup.pools[0].pp_engines == 2 and off_setup.pools[0].pp_engines == 1
