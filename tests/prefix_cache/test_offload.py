"""The host-memory (and SSD) tier under the GPU pool (issue 24 item 8): eviction GPU -> host -> SSD -> drop, a hit
in a lower tier restored over the host link before the request's prefill may start, the hit split by tier.

Tiny pools of 1 byte of KV per token and 4-token pages (`helpers_pc.tiny_config`): page counts and bytes are
worked out by hand in each test."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from helpers_pc import ks, serve, tiny_config
from k3sim.errors import InputError
from k3sim.prefix_cache.cache import HybridPrefixCache, ReqState
from k3sim.prefix_cache.config import CacheConfig
from k3sim.prefix_cache.offload import HOST_LINK_ACHIEVED, host_link

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "traces" / "conversation_head300.jsonl"


def _evicted_then_rehit(policy: str, pages: int, host_bytes: float, bw: float):
    """Request A (9 tokens: hash blocks of 2, pages of 4), then an unrelated B of 9 tokens that evicts all of A
    from the pool into the host tier, then A's prompt again; returns (cache, C's state)."""
    cache = HybridPrefixCache(tiny_config(policy, pages=pages, host_capacity_bytes=host_bytes,
                                          host_bandwidth_bytes_per_s=bw))
    a, b = ks(4, 0, 1), ks(4, 0, 2)
    serve(cache, a, 9)
    serve(cache, b, 9)
    cache.clock = lambda: 10.0
    rs = cache.admit(a, 9, 1)
    assert isinstance(rs, ReqState)
    return cache, rs


def test_a_kv_page_evicted_to_host_is_restored_and_its_prefill_waits_for_the_transfer():
    """Full attention, a 3-page pool: A's two whole pages (keys 0-1, 2-3; its third holds token 8 only, no key) go
    to the host tier when B needs the pool (2 x 4 B = 8 B, the tier's size). A's prompt again: both pages are found
    in host memory, hit = 8 tokens (4 hash blocks of 2); the restore moves 2 pages x 4 B = 8 B at 4 B/s = 2 s,
    queued at t = 10 s, so the prefill of the one token left may start at t = 12 s and not before."""
    cache, rs = _evicted_then_rehit("full-attention", pages=3, host_bytes=8, bw=4.0)
    host = cache.offload.levels[0]
    assert rs.hit_tokens == 8 and rs.computed == 8
    assert rs.ready_s == pytest.approx(12.0)
    assert host.restored_entries == 2 and host.restored_bytes == 8 and host.restore_s == pytest.approx(2.0)
    assert cache.stats.lower_hit_tokens == [8, 0]  # a GPU-only lookup finds nothing: every hit token is host's
    cache.clock = lambda: 11.99
    assert cache.schedule_prefill(rs, 100) == 0  # the bytes have not landed
    cache.clock = lambda: 12.0
    assert cache.schedule_prefill(rs, 100) == 1 and rs.computed == 9
    cache.end_step()
    # the restored pages are GPU pages again, indexed there and gone from the tier (exclusive): a new lookup finds
    # them in the GPU pool
    assert cache.offload.kv.keys().isdisjoint(cache.mla_index.keys())
    hit, _, pages, _, _, _ = cache.match(ks(4, 0, 1), 9)
    assert hit == 8 and all(p >= 0 for p in pages)
    cache.grow_decode(rs, 1)
    cache.release(rs)
    cache.check()


def test_a_checkpoint_moves_down_whole_and_a_hybrid_hit_restores_pages_and_state():
    """Decoupled, one state group (4 B of state = one page), a 5-page pool: A leaves pages 0-3 of KV (keys 0-3) and
    a checkpoint at token 8 (key 3). B evicts all three into a 12 B host tier (the checkpoint first: it was
    released to the LRU when its step landed, before A's pages at A's end). A again: KV of hash blocks 0-3 and the
    checkpoint from host, hit = 8 tokens; bytes = 2 pages x 4 B + 4 B of state = 12 B at 4 B/s = 3 s. The
    checkpoint is copied into the private state and stays in its tier; the pages leave it."""
    cache, rs = _evicted_then_rehit("decoupled", pages=5, host_bytes=12, bw=4.0)
    host = cache.offload.levels[0]
    assert rs.hit_tokens == 8 and rs.ready_s == pytest.approx(13.0)
    assert host.restored_bytes == 12 and host.restore_s == pytest.approx(3.0)
    assert ks(4, 0, 1)[3] in cache.offload.ck  # the checkpoint is still there for the next request
    assert not any(k in cache.offload.kv for k in ks(4, 0, 1))
    cache.check()


def test_the_host_tier_is_lru_and_drops_what_does_not_fit():
    """A 4 B tier holds one page. A's pages leave the pool oldest first: block 1's page (released first, A's tail)
    goes down, then block 0's pushes it out (dropped: no tier below). A again: block 0 from host memory, block 1
    nowhere, so the hit is 4 tokens and the restore 4 B at 4 B/s = 1 s, from t = 10 s."""
    cache, rs = _evicted_then_rehit("full-attention", pages=3, host_bytes=4, bw=4.0)
    host = cache.offload.levels[0]
    assert host.evicted_entries == 1 and host.evicted_bytes == 4
    assert rs.hit_tokens == 4 and rs.ready_s == pytest.approx(11.0)
    cache.check()


def test_an_ssd_tier_takes_what_host_memory_evicts_and_restores_at_its_own_bandwidth():
    """Host 4 B (one page) over SSD 8 B: block 1's page goes down first and block 0's pushes it on to the SSD. A
    again: block 0 from host (4 B at 4 B/s = 1 s), block 1 from SSD (4 B at 1 B/s = 4 s), one after the other on
    the link from t = 10 s: ready at 15 s. The hit's 8 tokens split: 4 beyond a GPU-only lookup that GPU + host
    find (host), 4 more that only the SSD adds."""
    cache, rs = _evicted_then_rehit_ssd()
    host, ssd = cache.offload.levels
    assert rs.hit_tokens == 8 and rs.ready_s == pytest.approx(15.0)
    assert (host.restored_bytes, ssd.restored_bytes) == (4, 4)
    assert (host.restore_s, ssd.restore_s) == (pytest.approx(1.0), pytest.approx(4.0))
    assert cache.stats.lower_hit_tokens == [4, 4]
    cache.check()


def _evicted_then_rehit_ssd():
    cache = HybridPrefixCache(tiny_config("full-attention", pages=3, host_capacity_bytes=4,
                                          host_bandwidth_bytes_per_s=4.0, ssd_capacity_bytes=8,
                                          ssd_bandwidth_bytes_per_s=1.0))
    a, b = ks(4, 0, 1), ks(4, 0, 2)
    serve(cache, a, 9)
    serve(cache, b, 9)
    assert cache.offload.kv[a[1]].level == 0 and cache.offload.kv[a[3]].level == 1
    cache.clock = lambda: 10.0
    return cache, cache.admit(a, 9, 1)


def test_a_recomputed_prefix_leaves_the_tier():
    """KV pages live in one tier. Decoupled with an 8 B tier: A's checkpoint goes down first and is pushed out by
    A's second page, so A again finds its KV in host memory but no state to restore: hit 0, the prompt is
    prefilled again, and the keys it registers in the GPU pool are forgotten below."""
    cache, rs = _evicted_then_rehit("decoupled", pages=5, host_bytes=8, bw=4.0)
    a = ks(4, 0, 1)
    assert rs.hit_tokens == 0 and all(k in cache.offload.kv for k in a)
    assert cache.schedule_prefill(rs, 100) == 8  # the K3 design ends the chunk where the KV match ends (junction)
    assert not any(k in cache.offload.kv for k in a) and all(k in cache.mla_index for k in a)
    cache.check()


def test_a_tier_too_small_for_any_entry_changes_nothing():
    """Offload code on, nothing ever kept: every demotion passes the 1 B tier by and is dropped, so the replay of
    the first 300 conversation requests is the GPU-only one, figure for figure."""
    from k3sim.serving.replay import SchedulerConfig, StepCost, replay
    from k3sim.workloads import read_mooncake

    base = CacheConfig("decoupled", 512, 1024, 27648, 449372160, 3, 300 * 1024 * 27648)
    tiny = dataclasses.replace(base, host_capacity_bytes=1.0, host_bandwidth_bytes_per_s=55e9)
    sched, cost = SchedulerConfig(8192, 64), StepCost(tokens_per_s=2e5)
    off = replay(read_mooncake(TRACE), base, sched, cost)
    on = replay(read_mooncake(TRACE), tiny, sched, cost, check_every=5)
    for f in ("token_hit_rate", "requests", "evictions", "steps", "simulated_s", "ttft_p50_s", "ttft_p99_s",
              "checkpoints_written", "prefill_tokens_saved", "lookup_probes"):
        assert getattr(on, f) == getattr(off, f), f
    assert on.token_hit_rate_gpu == off.token_hit_rate and on.token_hit_rate_host == 0.0
    assert on.offload["host"]["demoted_entries"] == 0 and on.offload["host"]["evicted_entries"] == 0


def test_an_unbounded_host_tier_recovers_what_an_unbounded_pool_hits():
    """Everything the 1,000-page pool evicts stays reachable in a host tier larger than the trace: the hit rate is
    the unbounded pool's to within 0.5 point (the replays differ only in timing: a restore delays its request)."""
    from k3sim.serving.replay import SchedulerConfig, StepCost, replay
    from k3sim.workloads import read_mooncake

    base = CacheConfig("decoupled", 512, 1024, 27648, 449372160, 3, 1000 * 1024 * 27648)
    sched, cost = SchedulerConfig(8192, 64), StepCost(tokens_per_s=2e5)
    gpu = replay(read_mooncake(TRACE), base, sched, cost)
    unb = replay(read_mooncake(TRACE), dataclasses.replace(base, capacity_bytes=None), sched, cost)
    tier = replay(read_mooncake(TRACE), dataclasses.replace(base, host_capacity_bytes=1e13,
                                                            host_bandwidth_bytes_per_s=55e9), sched, cost,
                  check_every=3)
    assert gpu.token_hit_rate < unb.token_hit_rate - 0.02  # the bounded pool loses reuse
    assert tier.token_hit_rate == pytest.approx(unb.token_hit_rate, abs=0.005)
    assert tier.token_hit_rate_gpu + tier.token_hit_rate_host == pytest.approx(tier.token_hit_rate)
    assert tier.host_restore_s == pytest.approx(tier.host_restore_bytes / 55e9)
    assert tier.requests_restored > 0 and tier.restore_wait_s_mean >= tier.host_restore_s / tier.requests_restored


@pytest.mark.parametrize("field,value", [("host_capacity_bytes", -1.0), ("host_capacity_bytes", math.nan),
                                         ("host_capacity_bytes", math.inf), ("ssd_capacity_bytes", -5.0)])
def test_bad_tier_sizes_are_refused_naming_the_field(field, value):
    with pytest.raises(InputError) as err:
        CacheConfig("full-attention", 2, 4, 1, 0, 1, 12.0, **{field: value}, host_bandwidth_bytes_per_s=1.0,
                    ssd_bandwidth_bytes_per_s=1.0)
    assert err.value.field == field


def test_a_tier_needs_a_bandwidth_and_a_bounded_pool():
    with pytest.raises(InputError) as err:
        CacheConfig("full-attention", 2, 4, 1, 0, 1, 12.0, host_capacity_bytes=8.0)
    assert err.value.field == "host_bandwidth_bytes_per_s"
    with pytest.raises(InputError) as err:
        CacheConfig("full-attention", 2, 4, 1, 0, 1, None, host_capacity_bytes=8.0, host_bandwidth_bytes_per_s=1.0)
    assert err.value.field == "host_capacity_bytes" and "unbounded" in err.value.reason


def test_the_host_link_is_the_datasheet_peak_at_the_measured_share():
    """H200: PCIe Gen5 x16, 64 GB/s one way by the datasheet; the share is the committed measurement's median
    pinned 1 GiB host-to-device copy (55.05 GB/s, 86 %); a profile without the figure is refused."""
    from k3sim.configs import load_hardware

    measured = json.loads((ROOT / "reports/prefix_cache/host_link/h200_host_link.json").read_text())
    row = next(r for r in measured["copies"] if r["bytes"] == 2 ** 30 and r["pinned"] and r["direction"] == "h2d")
    assert HOST_LINK_ACHIEVED["h200"][0] == pytest.approx(row["bytes_per_s_median"], rel=1e-3)
    link = host_link(load_hardware("h200"), source="--host-pool-bytes")
    assert link.peak_bytes_per_s == 64e9 and link.efficiency == pytest.approx(55.05 / 64)
    with pytest.raises(InputError) as err:
        host_link(load_hardware("b200"), source="--host-pool-bytes")
    assert err.value.source == "--host-pool-bytes" and "host link" in err.value.reason
