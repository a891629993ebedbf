"""Routers, P/D disaggregation (transfer bytes and timeline), hit rate against the prefix-cache replay,
p99 TTFT against the arrival rate."""

from __future__ import annotations

import itertools

import pytest

from k3sim.serving.run import ServeSetup, simulate
from k3sim.workloads.request import TraceRequest

from serving_helpers import TRACE, constant, linear, scenario  # noqa: F401  (scenario: a fixture)


def _req(t, L, O, ids):
    return TraceRequest(t, L, O, block_ids=list(ids))


def test_pd_transfer_bytes_grow_with_context_only_through_the_mla_layers():
    from k3sim.configs import load_model
    from k3sim.serving.fleet import pd_transfer_bytes, pd_transfer_rows

    k3 = load_model("models/kimi-k3.yaml")
    rows = {r.component: r.bytes for r in pd_transfer_rows(k3, 10000)}
    # K3: 24 MLA layers x 10,000 tokens x 576 elements x 2 B; one KDA state (69 x 96 x 128 x 128 x 4 B) and
    # one conv state (69 x 3 x 96 x 384 x 2 B) whatever the context
    assert rows == {"mla_kv": 24 * 10000 * 576 * 2, "kda_state": 434_110_464, "conv_state": 15_261_696}
    for ctx in (1, 4096, 131072):
        assert pd_transfer_bytes(k3, ctx + 1000) - pd_transfer_bytes(k3, ctx) == 24 * 1000 * 576 * 2
    assert pd_transfer_bytes(k3, 0) == 434_110_464 + 15_261_696


def test_pd_timeline(scenario):
    """1:1 P/D, each step 1 s. A request (600 prompt, 3 out): prefill step [0,1] on P gives the first token;
    its KV moves (transfer time from the model); D decodes tokens 2 and 3 in two steps."""
    setup = ServeSetup.from_scenario(scenario({"replicas": 2, "engine": {"pool_bytes": "unbounded"},
                                               "disaggregation": {"prefill": {"replicas": 1},
                                                                  "decode": {"replicas": 1}}}, num_gpus=32))
    res = simulate(setup, [_req(0.0, 600, 3, [0, 1])], step_seconds=constant(1.0))
    df = res.frame()
    t = df.loc[0, "transfer_s"]
    assert t > 0 and df.loc[0, "first_token_s"] == 1.0
    assert df.loc[0, "completion_s"] == pytest.approx(1.0 + t + 2.0)
    assert df.loc[0, "replica"] == 0 and df.loc[0, "decode_replica"] == 0
    from k3sim.serving.fleet import pd_transfer_bytes

    assert res.summary["transfer_bytes"] == pd_transfer_bytes(setup.model, 601)  # prompt + first token
    # across nodes (16 + 16 GPUs > one 8-GPU NVLink domain): the bytes striped over 16 GPU pairs, each pair one
    # send/recv of the one collective model over the NIC link (not the NVLink-measured send/recv)
    import math

    from k3sim.comm import collective_time

    hw, per_link = setup.hw, math.ceil(pd_transfer_bytes(setup.model, 601) / 16)
    assert t == collective_time("send_recv", per_link, 2, hw, gpus_per_node=1, convention="barrier").seconds
    # the NIC is slower than NVLink, and no link beats its datasheet bandwidth
    assert t > collective_time("send_recv", per_link, 2, hw, convention="barrier").seconds
    assert t > per_link / hw.scaleout_bandwidth_bytes_per_s


def test_pd_fleet_serves_a_trace_with_littles_law(scenario):
    setup = ServeSetup.from_scenario(scenario({"replicas": 3, "disaggregation": {"prefill": {"replicas": 1},
                                                                                "decode": {"replicas": 2}},
                                               "engine": {"pp_microbatches": False}}, num_gpus=48))
    from k3sim.workloads.mooncake import read_mooncake

    res = simulate(setup, read_mooncake(TRACE, limit=200), step_seconds=linear(0.01, 2e-5))
    s = res.summary
    df = res.frame()
    one_token = int((df["output_tokens"] == 1).sum())  # answered by the prefill replica: nothing moves
    assert s["requests"] == 200 and s["transfers"] == 200 - one_token and s["little_law_relative_error"] < 0.02
    assert set(df.loc[df["output_tokens"] > 1, "decode_replica"]) == {0, 1}


def test_round_robin_and_least_loaded(scenario):
    """One engine per replica (pp micro-batches off), so replica and engine indices coincide."""
    one = {"pp_microbatches": False}
    reqs = [_req(0.1 * i, 1024, 50, [10 * i, 10 * i + 1]) for i in range(6)]
    rr = simulate(ServeSetup.from_scenario(scenario({"replicas": 3, "router": "round-robin", "engine": one},
                                                    num_gpus=48)),
                  reqs, step_seconds=constant(0.05)).frame().sort_values("request")
    assert rr["replica"].tolist() == [0, 1, 2, 0, 1, 2]
    ll = simulate(ServeSetup.from_scenario(scenario({"replicas": 3, "router": "least-loaded", "engine": one},
                                                    num_gpus=48)),
                  reqs, step_seconds=constant(0.05)).frame().sort_values("request")
    assert ll["replica"].tolist()[:3] == [0, 1, 2]  # each new request goes to an empty replica first
    # where the two differ: A (1000 outputs, 50 s of 0.05 s steps) holds replica 0; B, C, D (2 outputs: done
    # 0.1 s after arriving) come 1 s apart, each finding loads [1, 0, 0]: least-loaded sends all three to the
    # lowest-index empty replica, round-robin goes on turning
    reqs = [_req(0.0, 1024, 1000, [0, 1]), *(_req(float(i), 1024, 2, [10 * i, 10 * i + 1]) for i in (1, 2, 3))]
    for router, want in (("least-loaded", [0, 1, 1, 1]), ("round-robin", [0, 1, 2, 0])):
        setup = ServeSetup.from_scenario(scenario({"replicas": 3, "router": router, "engine": one}, num_gpus=48))
        df = simulate(setup, reqs, step_seconds=constant(0.05)).frame().sort_values("request")
        assert df["replica"].tolist() == want, router


def test_prefix_aware_router_follows_the_cached_prefix(scenario):
    """A conversation's second turn goes to the replica holding its first turn; past the load cap it does not."""
    first = [_req(0.0, 4096, 5, range(0, 8)), _req(0.0, 4096, 5, range(100, 108))]
    follow = [_req(50.0, 6144, 5, [*range(100, 108), 200, 201, 202, 203])]
    setup = ServeSetup.from_scenario(scenario({"replicas": 2, "router": "prefix-aware"}, num_gpus=32))
    df = simulate(setup, first + follow, step_seconds=constant(0.05)).frame().set_index("request")
    assert df.loc[2, "replica"] == df.loc[1, "replica"]
    assert df.loc[2, "hit_tokens"] == 4096 - 512 or df.loc[2, "hit_tokens"] == 4096


def test_unbounded_hit_rate_equals_the_prefix_cache_replay(scenario):
    """Same trace, same cache geometry, unbounded pool: the serving engine's token hit rate is the prefix-cache
    command's (the cached content depends on which prompts came before, not on the step times)."""
    from k3sim.serving.replay import replay
    from k3sim.workloads.mooncake import read_mooncake

    # one engine, one cache (pp micro-batches off): the replay's single cache
    setup = ServeSetup.from_scenario(scenario({"engine": {"pool_bytes": "unbounded", "pp_microbatches": False}}))
    reqs = list(read_mooncake(TRACE, limit=600))
    res = simulate(setup, reqs, step_seconds=linear(0.005, 5e-6))
    ref = replay(reqs, setup.pools[0].cache)
    assert res.summary["token_hit_rate"] == pytest.approx(ref.token_hit_rate, abs=0.002)
    assert res.summary["token_hit_rate"] > 0.1  # 15 % on the first 600 requests: a real signal


def test_p99_ttft_does_not_fall_as_the_rate_rises(scenario):
    from k3sim.serving.arrivals import retime
    from k3sim.workloads.mooncake import read_mooncake

    setup = ServeSetup.from_scenario(scenario({"engine": {"pp_microbatches": False}}))  # one engine's queue
    p99 = []
    for rate in (0.5, 1, 2, 4, 8):
        reqs = retime(read_mooncake(TRACE, limit=250), "poisson", rate, seed=0)
        p99.append(simulate(setup, reqs, step_seconds=linear(0.02, 2e-5)).summary["ttft_p99_s"])
    assert all(b >= a for a, b in itertools.pairwise(p99)), p99
    assert p99[-1] > 3 * p99[0]


def test_prefix_aware_load_cap():
    """The replica with the longest cached prefix wins unless it is more than `load_cap` requests above the
    least loaded one; then the choice falls back among the replicas within the cap."""
    import simpy

    from k3sim.serving.entities import Request
    from k3sim.serving.fleet import Fleet

    class Stub:
        def __init__(self, idx, load, keys):
            self.idx, self._load = idx, load
            self.cache = type("C", (), {"mla_index": {k: 0 for k in keys}})()

        def load(self):
            return self._load

    fleet = Fleet(simpy.Environment(), router="prefix-aware", load_cap=4)
    fleet.common = []  # the requests routed before shared no leading block: every cached block counts
    req = Request(0, 0.0, 2048, 10, [11, 12, 13, 14])
    fleet.front = [Stub(0, 2, []), Stub(1, 6, [11, 12, 13]), Stub(2, 3, [11])]
    assert fleet.route(req).idx == 1  # 3 cached blocks, load 6 <= 2 + 4
    fleet.front[1]._load = 7
    assert fleet.route(req).idx == 2  # over the cap: the next-longest prefix among the rest


def test_pd_decode_replica_does_not_jump_past_a_new_arrival(scenario):
    """A decode replica busy with a long output must take in a request that arrives (and is prefilled) later
    within a step of its KV landing, not when its decode-only stretch ends (steps of 1 s)."""
    setup = ServeSetup.from_scenario(scenario({"replicas": 2, "engine": {"pool_bytes": "unbounded"},
                                               "disaggregation": {"prefill": {"replicas": 1},
                                                                  "decode": {"replicas": 1}}}, num_gpus=32))
    reqs = [_req(0.0, 600, 50, [0, 1]), _req(10.5, 600, 3, [5, 6])]
    df = simulate(setup, reqs, step_seconds=constant(1.0)).frame().set_index("request")
    assert df.loc[1, "first_token_s"] == 11.5  # the prefill replica was idle: one step
    # lands at 11.5 + transfer, joins at the decode replica's next step boundary (<= 1 s), two decode steps
    assert df.loc[1, "completion_s"] <= 11.5 + df.loc[1, "transfer_s"] + 1.0 + 2.0
    assert df.loc[0, "completion_s"] > 45


def test_knee_is_the_lowest_rate_served_below_95_percent():
    from k3sim.serving.report import knee_rate

    # 0.95 x 2 = 1.9 <= 1.95 (kept up); 0.95 x 3 = 2.85 > 2.5 (the queue grows): the knee is 3, whatever the order
    assert knee_rate([3.0, 1.0, 2.0, 4.0], [2.5, 1.0, 1.95, 2.6]) == 3.0
    assert knee_rate([1.0, 2.0], [1.0, 1.9]) is None  # exactly 95 % still counts as keeping up
