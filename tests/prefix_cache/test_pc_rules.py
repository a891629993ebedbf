"""Each consistency rule switched off shows the failure it prevents; switched on, the failure cannot happen."""

from pathlib import Path

import pytest

from k3sim.prefix_cache.cache import HybridPrefixCache, ReqState
from k3sim.serving.replay import replay
from k3sim.workloads import read_mooncake
from helpers_pc import serve, tiny_config

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.mark.parametrize("rule_on", [True, False])
def test_rule1_pin_hits_before_allocation(rule_on):
    """Without pinning first, the private copy page is taken from the LRU head: the very checkpoint just hit."""
    cache = HybridPrefixCache(tiny_config(pages=7, pin_before_allocate=rule_on))
    serve(cache, [1, 2, 3], 6)  # cached: checkpoint@3 (LRU head), its half-full page, its full page
    serve(cache, [11, 12, 13], 6)  # unrelated, fills the pool: no empty page left but C's state page
    rs = cache.admit([1, 2, 3, 4, 5], 10, 0)  # hits 6 tokens, partial block -> allocates a private copy
    assert isinstance(rs, ReqState) and rs.hit_hb == 3
    assert cache.stats.evicted_hits == (0 if rule_on else 1)
    if rule_on:
        cache.check()


@pytest.mark.parametrize("rule_on", [True, False])
def test_rule2_fence_blocks_until_their_bytes_land(rule_on):
    """Two requests with one prefix in the same step: the second must not read what the first has not written."""
    cache = HybridPrefixCache(tiny_config(fence_unlanded=rule_on))
    a = cache.admit([1, 2, 3], 6, 0)
    cache.schedule_prefill(a, 100)  # registers endpoints 1..3 and a checkpoint, landing at the end of the step
    b = cache.admit([1, 2, 3, 4], 8, 0)
    assert cache.stats.stale_reads == (0 if rule_on else 1)
    assert cache.stats.fenced_lookups == (1 if rule_on else 0)
    assert b.hit_hb == (0 if rule_on else 3)
    cache.end_step()
    c = cache.admit([1, 2, 3, 5], 8, 0)  # next step: landed, a legitimate hit
    assert c.hit_hb == 3 and cache.stats.stale_reads == (0 if rule_on else 1)


@pytest.mark.parametrize("rule_on", [True, False])
def test_rule3_evicting_one_group_invalidates_its_siblings(rule_on):
    """Group 0's checkpoint page is evicted; without atomic sibling invalidation the checkpoint stays indexed
    and a later hit restores groups 1 and 2 with group 0 missing."""
    cache = HybridPrefixCache(tiny_config(groups=3, pages=9, invalidate_siblings=rule_on))
    serve(cache, [1, 2, 3], 6)  # 8 pages; LRU: ckpt g0, g1, g2, then the two KV pages; 3 empty (private state)
    serve(cache, [50], 1, 4)  # 2 KV pages: the 9th page, then group 0's checkpoint page is evicted
    assert cache.stats.checkpoints_evicted == 1
    assert (3 in cache.ckpt_index) == (not rule_on)
    rs = cache.admit([1, 2, 3, 4, 5], 10, 0)
    assert isinstance(rs, ReqState)
    assert cache.stats.partial_restores == (0 if rule_on else 1)
    assert rs.hit_hb == (0 if rule_on else 3)
    if rule_on:
        cache.check()


def _slice_replay(**switches):
    from k3sim.prefix_cache.config import CacheConfig

    cfg = CacheConfig("decoupled", 512, 2048, 27648, 449372160, 3, 40e9, **switches)
    return replay(read_mooncake(TRACES / "conversation_head300.jsonl"), cfg, check_every=50)


def test_replay_rules_on_has_no_failures_and_fence_off_reads_stale_bytes():
    on = _slice_replay()
    assert on.evictions > 0  # capacity is tight enough for races
    assert (on.stale_reads, on.evicted_hits, on.partial_restores) == (0, 0, 0)
    off = _slice_replay(fence_unlanded=False)
    assert off.stale_reads > 0  # requests at t=0 share hash id 0 in the same step
