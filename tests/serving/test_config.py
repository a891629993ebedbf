"""The scenario's `serving:` section: pools with their own layouts, bad splits, defaults from the scenario."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.serving.run import ServeSetup, default_physical_block
from serving_helpers import scenario  # noqa: F401  (a fixture)


def test_default_section_and_page_size(scenario):
    s = ServeSetup.from_scenario(scenario(None))
    pool = s.pools[0]
    assert (pool.role, pool.replicas, s.gpus) == ("mixed", 1, 16)
    # K3 at TP 8: one KDA group's state + conv per GPU = (434,110,464 + 15,261,696) / 8 / 3 B = 18,723,840 B
    # = 677.2 tokens of MLA KV (27,648 B/token): the smallest multiple of 512 above is 1024
    assert pool.cache.physical_block_tokens == 1024 == default_physical_block(s.model, 512, 8, "decoupled")
    assert pool.cache.pages_per_group_state == 1
    # TP 1: 149.79 MB = 5417.6 tokens -> 11 x 512 = 5632
    assert default_physical_block(s.model, 512, 1, "decoupled") == 5632


def test_pd_pools_with_their_own_layouts(scenario):
    body = {"replicas": 3, "disaggregation": {
        "prefill": {"replicas": 1, "parallelism": {"tp": 8, "pp": 4, "ep": 8}},
        "decode": {"replicas": 2}}}
    s = ServeSetup.from_scenario(scenario(body, num_gpus=64))
    assert [(p.role, p.replicas, p.parallelism.pp) for p in s.pools] == [("prefill", 1, 4), ("decode", 2, 2)]
    assert s.gpus == 32 + 2 * 16


def test_bad_sections(scenario):
    with pytest.raises(InputError, match="does not add up"):
        ServeSetup.from_scenario(scenario({"replicas": 3, "disaggregation": {"prefill": {"replicas": 1},
                                                                            "decode": {"replicas": 1}}}))
    with pytest.raises(InputError, match="pool_bytes"):
        ServeSetup.from_scenario(scenario({"engine": {"pool_bytes": -1.0}}))
    with pytest.raises(InputError, match="serving"):
        ServeSetup.from_scenario(scenario(None, mode="train"))
    with pytest.raises(InputError, match="--disaggregate"):
        ServeSetup.from_scenario(scenario(None), disaggregate="1:1")  # 16 GPUs = one replica


def test_replay_gets_the_real_contexts_from_a_model_cost():
    """The prefix-cache replay hands a model cost each step's decode context sum and (chunk, prefix) pairs."""
    from k3sim.prefix_cache.config import CacheConfig
    from k3sim.serving.replay import SchedulerConfig, replay
    from k3sim.workloads.request import TraceRequest

    seen = []

    class Cost:
        def step(self, nd, cs, pf):
            seen.append((nd, cs, pf))
            return 1.0

    reqs = [TraceRequest(0.0, 1500, 3, block_ids=[1, 2, 3])]
    replay(reqs, CacheConfig("decoupled", 512, 1024, 27648, 434_110_464, 3), SchedulerConfig(1000, 8), Cost())
    # chunk 1000 from 0 (stopped at the hash-aligned boundary the cache picks), the rest from 1000; then decodes
    assert seen[0] == (0, 0, ((1000, 0),)) and seen[1] == (0, 0, ((500, 1000),))
    assert seen[2] == (1, 1501, ())
