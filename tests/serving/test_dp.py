"""Attention-DP serving: the replica's step from its ranks' batches, the lockstep engine, the DP balancer, P/D
pools with their own layouts, MTP in serving, MLA-only models' cache policy."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.serving.run import ServeSetup, simulate
from k3sim.workloads.request import TraceRequest

from serving_helpers import constant, scenario  # noqa: F401  (scenario: a fixture)

KL48_DP2 = {"model": "kimi-linear-48b", "parallelism": {"tp": 1, "dp": 2, "ep": 2}, "num_gpus": 2}
UNBOUNDED = {"engine": {"pool_bytes": "unbounded"}}


def _req(t, L, O, first_id):
    return TraceRequest(t, L, O, block_ids=list(range(first_id, first_id + -(-L // 512))))


def _frame(res):
    return res.frame().set_index("request")


class FakeDP:
    """A DPStepCost-shaped clock: local = 0.1 s + 1 ms per token of the rank; expert side = 0.1 ms per token of
    the group + 0.1 ms per token of its busiest rank (prefill) or per decode of it (decode-only)."""

    q, group = 1, 2

    def local(self, nd, cs, pf):
        return 0.1 + 1e-3 * (nd + sum(c for c, _ in pf))

    def expert(self, prefill, tokens, busiest):
        return 1e-4 * tokens + 1e-4 * busiest

    def __call__(self, nd, cs, pf=()):
        tok = nd + sum(c for c, _ in pf)
        return self.local(nd, cs, pf) + self.expert(bool(pf), 2 * tok, tok if pf else nd)


# ----------------------------------------------------------------------------- the step of an attention-DP replica
@pytest.mark.parametrize("model, par", [("kimi-linear-48b", {"tp": 1, "dp": 4, "ep": 4}),
                                        ("kimi-k2", {"tp": 1, "dp": 32, "ep": 32}),
                                        ("kimi-k2", {"tp": 1, "dp": 32, "ep": 32, "tbo": True})])
def test_dp_parts_add_up_to_the_step_model_at_uniform_load(model, par):
    """Every rank with the same batch: local + routed(dp x tokens) + dispatch(tokens) is the step model's time
    of that rank batch, to rounding where the tables hold exact evaluations (up to 16 decodes or tokens a rank,
    the reference context 4096, group totals on the grid: 4 x 2^k), on the fast path's own kernel grid. The
    routed part made for the replica's total is the routed rows of the rank batch (the step model prices a rank
    batch's experts at tokens x dp)."""
    from k3sim.configs import Parallelism, load_hardware, load_model
    from k3sim.serving.stepcost import DPStepCost, step_seconds_for

    m, hw = load_model(f"models/{model}.yaml"), load_hardware("h200")
    fast = step_seconds_for(m, hw, Parallelism(**par))
    assert isinstance(fast, DPStepCost) and fast.group == par["dp"]
    for nd, pf in ((1, ()), (8, ()), (16, ()), (0, ((16, 0),)), (0, ((4, 0),))):
        assert fast(nd, nd * 4096, pf) == pytest.approx(fast.scm.step_seconds(nd, nd * 4096, pf), rel=1e-12)
    if not par.get("tbo"):
        res = fast.scm.breakdown(8, 8 * 4096)
        routed = sum(r.seconds for r in res.rows if r.component.startswith("routed_experts"))
        assert fast.routed_decode(8 * par["dp"]) == pytest.approx(routed, rel=1e-9)


def test_dp_fast_path_against_the_step_model():
    """Mixed, decode-only and prefill-only rank batches at uniform load: within 1 % of `StepCostModel`."""
    from k3sim.configs import Parallelism, load_hardware, load_model
    from k3sim.serving.stepcost import step_seconds_for

    m, hw, par = load_model("models/kimi-k3.yaml"), load_hardware("h200"), Parallelism(tp=8, dp=4, ep=32)
    fast, exact = step_seconds_for(m, hw, par), step_seconds_for(m, hw, par, fast=False)
    for nd, cs, pf in ((1, 4096, ()), (37, 37 * 20000, ()), (0, 0, ((8192, 0),)), (100, 100 * 12000, ((8092, 4096),)),
                       (60, 60 * 20000, ((3000, 9000), (5000, 0)))):
        assert fast(nd, cs, pf) == pytest.approx(exact(nd, cs, pf), rel=0.01), (nd, cs, pf)


def test_group_clock_max_local_plus_the_slowest_groups_expert_side():
    """Ranks 0, 1 (EP group 0) and 3 (group 1), one with prefill: max local = rank 3's 0.1 + 0.3 = 0.4 s;
    group 0 holds 4 + 102 tokens, busiest 102 -> 0.0106 + 0.0102; group 1: 300, 300 -> 0.03 + 0.03 = 0.06:
    0.46 s. Decode-only ranks 0, 1: local 0.104; 6 tokens, busiest 4 decodes -> 0.0006 + 0.0004: 0.105 s."""
    from k3sim.serving.dp import GroupClock

    clock = GroupClock(FakeDP())
    assert clock([(0, 4, 400, ()), (1, 2, 200, ((100, 0),)), (3, 0, 0, ((300, 0),))]) == pytest.approx(0.46)
    assert clock([(0, 4, 400, ()), (1, 2, 200, ())]) == pytest.approx(0.105)
    plain = GroupClock(lambda nd, cs, pf: 1.0 + nd)  # a model-free clock: each rank's whole step, the max
    assert plain([(0, 4, 400, ()), (1, 2, 200, ())]) == 5.0


# ----------------------------------------------------------------------------- the lockstep engine and the balancer
def test_ranks_step_in_lockstep_and_an_idle_rank_waits_for_the_step(scenario):
    """Steps of 1 s. A (100 prompt, 3 out) at 0 goes to rank 0; B (100, 2) at 0.5 to the idle rank 1, which
    starts it at the group's next step: B prefills in [1, 2] beside A's first decode, both finish at 3.
    Two replicas of one rank each would have answered B at 1.5."""
    setup = ServeSetup.from_scenario(scenario(UNBOUNDED, **KL48_DP2))
    df = _frame(simulate(setup, [_req(0.0, 100, 3, 0), _req(0.5, 100, 2, 10)], step_seconds=constant(1.0)))
    assert df["rank"].tolist() == [0, 1] and df["replica"].tolist() == [0, 0]
    assert df.loc[0, "first_token_s"] == 1.0 and df.loc[0, "completion_s"] == 3.0
    assert df.loc[1, "scheduled_s"] == 1.0 and df.loc[1, "first_token_s"] == 2.0 and df.loc[1, "completion_s"] == 3.0


def test_step_is_the_busiest_rank_plus_the_shared_expert_side(scenario):
    """A (100 prompt) on rank 0 and B (300) on rank 1 prefill in one step: max local 0.1 + 0.3 s, expert side
    0.1 ms x 400 tokens + 0.1 ms x 300 (busiest): 0.47 s; one output token each, so both finish then."""
    setup = ServeSetup.from_scenario(scenario(UNBOUNDED, **KL48_DP2))
    df = _frame(simulate(setup, [_req(0.0, 100, 1, 0), _req(0.0, 300, 1, 10)], step_seconds=lambda i: FakeDP()))
    assert df["rank"].tolist() == [0, 1]
    assert df["completion_s"].tolist() == pytest.approx([0.47, 0.47])


def test_balancer_by_outstanding_prefill_tokens_then_cache(scenario):
    """A (4000) -> rank 0; B (1000) -> rank 1; C (1000) -> rank 1 (1000 + 1000 outstanding < 4000 + 1000).
    Later, at level load, D (A's 7 full blocks and 1512 tokens more) goes to rank 0, whose cache holds A's
    3584 tokens: 1512 uncached tokens there against 5096 on rank 1."""
    setup = ServeSetup.from_scenario(scenario(UNBOUNDED, **KL48_DP2))
    reqs = [_req(0.0, 4000, 2, 0), _req(0.0, 1000, 2, 100), _req(0.0, 1000, 2, 200),
            TraceRequest(50.0, 5096, 2, block_ids=[*range(0, 7), 299, 300, 301])]
    df = _frame(simulate(setup, reqs, step_seconds=constant(0.1)))
    assert df["rank"].tolist() == [0, 1, 1, 0]
    assert df.loc[3, "hit_tokens"] == 3584


def test_uniform_load_throughput_is_the_per_rank_figure_times_dp(scenario):
    """The issue's test. Four ranks, each given 8 identical requests (600-token prompts, 64 outputs) at 0 by
    the balancer: every step every rank runs the same batch, so the replica serves 4x what one rank of that
    layout serves alone under the same step model (a one-rank engine on the DP layout's per-rank step time),
    and its decode TPOT is `k3sim decode`'s at 8 sequences per rank (the step model's per-rank figure)."""
    from k3sim.decode import decode_step
    from k3sim.serving.run import _step_fn
    from k3sim.step import StepLayout

    dp4 = ServeSetup.from_scenario(scenario(UNBOUNDED, model="kimi-linear-48b", parallelism={"tp": 1, "dp": 4, "ep": 4},
                                            num_gpus=4, name="dp4.yaml"))
    fn = _step_fn(dp4, dp4.pools[0])
    one = ServeSetup.from_scenario(scenario(UNBOUNDED, model="kimi-linear-48b", parallelism={"tp": 1}, num_gpus=1,
                                            name="one.yaml"))
    reqs = lambda n: [_req(0.0, 600, 64, 10 * i) for i in range(n)]  # noqa: E731
    a = simulate(dp4, reqs(32)).summary
    b = simulate(one, reqs(8), step_seconds=lambda i: fn).summary
    assert a["requests"] == 32 and a["gpus"] == 4 and b["gpus"] == 1
    assert a["sim_seconds"] == b["sim_seconds"]
    assert a["throughput_output_tokens_per_s_per_gpu"] == pytest.approx(b["throughput_output_tokens_per_s_per_gpu"],
                                                                        rel=1e-12)
    assert a["throughput_requests_per_s"] == pytest.approx(4 * b["throughput_requests_per_s"], rel=1e-12)
    layout = StepLayout.from_parallelism(dp4.pools[0].parallelism)
    tpot = decode_step(dp4.model, dp4.hw, layout, 8, 600 + 32, memory_cap=False).tpot_s
    assert a["tpot_p50_s"] == pytest.approx(tpot, rel=0.01)


def test_each_rank_owns_the_per_rank_pool(scenario):
    """Every rank gets the pool the memory plan gives one rank (`pools[0].cache`), not a share of one pool nor
    the replica's total: a prompt one page larger than a rank's pool is refused, one that fits is served."""
    body = {"engine": {"pool_bytes": 2e9}}
    setup = ServeSetup.from_scenario(scenario(body, **KL48_DP2))
    cfg = setup.pools[0].cache
    fits = (cfg.num_pages - cfg.groups * cfg.pages_per_group_state) * cfg.physical_block_tokens - 1  # + 1 output
    reqs = [_req(0.0, fits, 1, 0), _req(0.0, fits + cfg.physical_block_tokens, 1, 10 ** 6)]
    s = simulate(setup, reqs, step_seconds=constant(1.0)).summary
    assert s["requests"] == 1 and s["requests_rejected"] == 1


def test_one_rank_replica_keeps_the_single_engine(scenario):
    """dp = 1 builds the plain engine and the separable step cost of before (answers unchanged: the existing
    serving tests and a before/after comparison of real runs, bit for bit)."""
    from k3sim.serving.run import _step_fn
    from k3sim.serving.stepcost import DPStepCost, SeparableStepCost

    setup = ServeSetup.from_scenario(scenario(UNBOUNDED, model="kimi-linear-48b", parallelism={"tp": 1}, num_gpus=1))
    fn = _step_fn(setup, setup.pools[0])
    assert type(fn) is SeparableStepCost and not isinstance(fn, DPStepCost) and fn.q == 1 and fn.draft is None


# ----------------------------------------------------------------------------- P/D pools with their own layouts
def test_pd_pools_use_their_own_layouts(scenario):
    """Prefill pool TP1 x attention-DP2 (two ranks), decode pool TP2: each pool's step cost is its own layout,
    the prefill replica has two ranks, and a request's KV moves from its rank's one GPU (one link)."""
    from k3sim.predict import predict_kernel_time
    from k3sim.serving.fleet import pd_transfer_bytes
    from k3sim.serving.run import _step_fn
    from k3sim.serving.stepcost import DPStepCost, SeparableStepCost

    body = {"replicas": 2, **UNBOUNDED, "disaggregation": {
        "prefill": {"replicas": 1, "parallelism": {"tp": 1, "dp": 2, "ep": 2}},
        "decode": {"replicas": 1, "parallelism": {"tp": 2, "ep": 2}}}}
    setup = ServeSetup.from_scenario(scenario(body, model="kimi-linear-48b", parallelism={"tp": 1}, num_gpus=4))
    pf, dec = (_step_fn(setup, p) for p in setup.pools)
    assert isinstance(pf, DPStepCost) and pf.layout.attention_dp == 2 and pf.layout.tp == 1
    assert type(dec) is SeparableStepCost and dec.layout.attention_dp == 1 and dec.layout.tp == 2
    res = simulate(setup, [_req(0.0, 600, 3, 0), _req(0.0, 600, 3, 10)], step_seconds=constant(1.0))
    df = _frame(res)
    assert df["rank"].tolist() == [0, 1] and res.summary["transfers"] == 2
    b = pd_transfer_bytes(setup.model, 601)
    one_link = predict_kernel_time("send_recv", {"bytes": b, "gpus": 2}, hardware=setup.hw).seconds
    assert df.loc[0, "transfer_s"] == one_link


def test_pd_decode_pool_with_attention_dp_ranks(scenario):
    """Decode pool TP1 x attention-DP2: the two KV hand-offs go to the ranks with the fewest pinned KV bytes
    (A's pages are on rank 0 when B's hand-off comes), each rank steps once both have landed: A and B finish
    two decode steps (1 s each) after the transfer."""
    body = {"replicas": 2, **UNBOUNDED, "disaggregation": {
        "prefill": {"replicas": 1, "parallelism": {"tp": 2, "ep": 2}},
        "decode": {"replicas": 1, "parallelism": {"tp": 1, "dp": 2, "ep": 2}}}}
    setup = ServeSetup.from_scenario(scenario(body, model="kimi-linear-48b", parallelism={"tp": 1}, num_gpus=4))
    res = simulate(setup, [_req(0.0, 600, 3, 0), _req(0.0, 600, 3, 10)], step_seconds=constant(1.0))
    df = _frame(res)
    t = df.loc[0, "transfer_s"]
    assert df["first_token_s"].tolist() == [1.0, 1.0] and df["transfer_s"].tolist() == [t, t]
    assert df["completion_s"].tolist() == pytest.approx([3.0 + t, 3.0 + t])
    assert res.summary["steps"] == 1 + 2 + 2  # the prefill step, two decode steps on each rank


def test_pp_microbatches_with_attention_dp_are_refused(scenario):
    with pytest.raises(InputError, match="pp_microbatches"):
        ServeSetup.from_scenario(scenario({"engine": {"pp_microbatches": True}}, model="kimi-linear-48b",
                                          parallelism={"tp": 1, "pp": 2, "dp": 2, "ep": 2}, num_gpus=4))


# ----------------------------------------------------------------------------- MTP
def test_mtp_advances_by_the_expected_accepted_tokens(scenario):
    """One draft accepted half the time: 1.5 tokens per step in expectation, banked as a fraction. After the
    prefill's first token (t = 1), the decodes emit 1, 2, 1, 2 tokens (1.5, 2.0, 1.5, 2.0 banked): 7 tokens at
    5 s; without MTP the 6 remaining tokens take 6 steps (7 s). Coalesced stretches give the same answer."""
    body = {**UNBOUNDED, "mtp": 1, "acceptance": 0.5}
    res = simulate(ServeSetup.from_scenario(scenario(body)), [_req(0.0, 100, 7, 0)], step_seconds=constant(1.0))
    assert _frame(res).loc[0, "completion_s"] == 5.0
    res = simulate(ServeSetup.from_scenario(scenario(UNBOUNDED)), [_req(0.0, 100, 7, 0)], step_seconds=constant(1.0))
    assert _frame(res).loc[0, "completion_s"] == 7.0


def test_mtp_in_attention_dp_ranks(scenario):
    body = {**UNBOUNDED, "mtp": 2, "acceptance": 1.0}  # 3 tokens a step: 1 + 3 + 3 + 3 = 10 tokens by t = 4
    setup = ServeSetup.from_scenario(scenario(body, **KL48_DP2))
    df = _frame(simulate(setup, [_req(0.0, 100, 10, 0), _req(0.0, 100, 10, 10)], step_seconds=constant(1.0)))
    assert df["completion_s"].tolist() == [4.0, 4.0] and df["rank"].tolist() == [0, 1]


def test_mtp_step_cost_verifies_q_tokens_and_adds_the_drafts():
    """With mtp = 1 a decode step feeds 2 tokens per sequence and adds the draft pass: the fast path is the
    step model at tokens_per_decode 2 plus `mtp_draft_seconds` (exact on the context grid), within 1 %."""
    from k3sim.configs import Parallelism, load_hardware, load_model
    from k3sim.decode.model import mtp_draft_seconds
    from k3sim.serving.stepcost import step_seconds_for

    m, hw = load_model("models/kimi-k2.yaml"), load_hardware("h200")
    for par in (Parallelism(tp=8, ep=8), Parallelism(tp=1, dp=32, ep=32)):
        fast = step_seconds_for(m, hw, par, mtp=1)
        plain = step_seconds_for(m, hw, par)
        draft = mtp_draft_seconds(m, hw, fast.layout, 16, timer=fast.timer, mtp=1, context=4096)
        assert fast.draft_seconds(16, 4096) == pytest.approx(draft, rel=1e-12) and draft > 0
        want = fast.scm.step_seconds(16, 16 * 4096, tokens_per_decode=2) + draft
        assert fast(16, 16 * 4096) == pytest.approx(want, rel=1e-9)
        assert fast(16, 16 * 4096) > plain(16, 16 * 4096)
        exact = step_seconds_for(m, hw, par, mtp=1, fast=False)
        for nd, cs, pf in ((37, 37 * 20000, ()), (20, 20 * 9000, ((3000, 1024),))):
            assert fast(nd, cs, pf) == pytest.approx(exact(nd, cs, pf), rel=0.01)


# ----------------------------------------------------------------------------- MLA-only models
def test_mla_only_model_serves_with_full_attention_by_default(scenario):
    k2 = {"model": "kimi-k2", "parallelism": {"tp": 8, "ep": 8}, "num_gpus": 8}
    setup = ServeSetup.from_scenario(scenario(UNBOUNDED, **k2))
    assert setup.pools[0].cache.policy == "full-attention"
    with pytest.raises(InputError) as err:
        ServeSetup.from_scenario(scenario(UNBOUNDED, **k2), cache_policy="decoupled")
    assert str(err.value).startswith("--cache-policy: ") and "--cache-policy full-attention" in str(err.value)
    assert "--policy " not in str(err.value)
    path = scenario({"engine": {"pool_bytes": "unbounded", "cache_policy": "coarse"}}, **k2)
    with pytest.raises(InputError) as err:
        ServeSetup.from_scenario(path)
    assert err.value.source == str(path) and err.value.field == "serving.engine.cache_policy"
