"""Flop-aware (Marconi-style) eviction: the prefill FLOP model, its configuration, and a whole replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k3sim.errors import InputError
from k3sim.kernels.ops import kda_fwd_flop_per_token_head
from k3sim.prefix_cache.config import CacheConfig
from k3sim.prefix_cache.flops import PrefillFlops, prefill_flops

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "tests" / "data" / "traces" / "conversation_head300.jsonl")


def test_k3_prefill_flops_from_its_config():
    """Linear: 2 FLOP per active weight, LM head excluded, plus chunk KDA's own work on 69 layers x 96
    heads; quadratic: 24 MLA layers x 96 heads x (128 + 64 + 128) per causal (query, key) pair."""
    from k3sim.configs import load_model
    from k3sim.memory.params import count_params

    m = load_model(str(ROOT / "models" / "kimi-k3.yaml"))
    rep = count_params(m)
    lm_head = next(r.active_params for r in rep.rows if r.component == "lm_head")
    f = prefill_flops(m)
    assert f.linear_flop_per_token == pytest.approx(2 * (rep.active_params - lm_head)
                                                    + 69 * 96 * kda_fwd_flop_per_token_head())
    assert f.attention_flop_per_token_pair == 24 * 96 * 320
    assert 200e9 < f.linear_flop_per_token < 215e9  # about 2 x 104B active
    # tokens [1000, 3000): 2000 linear + 3000 x 3001 - 1000 x 1001 = 8,002,000 causal pairs
    assert f(0) == 0 and f.span(1000, 3000) == pytest.approx(2000 * f.linear_flop_per_token
                                                             + 8_002_000 * f.attention_flop_per_token_pair)
    t = 65536  # doubling a prefix adds the attention term 2 t^2 x pair on top of twice the linear work
    assert f(2 * t) - 2 * f(t) == pytest.approx(f.attention_flop_per_token_pair * 2 * t * t)


@pytest.mark.parametrize("kw, field", [
    (dict(eviction="lfu"), "eviction"),
    (dict(eviction_alpha=-1.0), "eviction_alpha"),
    (dict(eviction_alpha=float("nan")), "eviction_alpha"),
    (dict(eviction_window=0), "eviction_window"),
    (dict(eviction="flop-aware"), "eviction"),  # without the model's FLOP per token there is nothing to weigh
])
def test_bad_eviction_settings_name_their_field(kw, field):
    with pytest.raises(InputError) as err:
        CacheConfig("decoupled", 2, 4, 1, 4, 1, None, **kw)
    assert err.value.field == field


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "k3sim", "prefix-cache", "--trace", CONV, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_flop_aware_replay_reports_flop_saved_and_bad_options_exit_2():
    lru = json.loads(_cli("--capacity-bytes", "20e9", "--json").stdout)
    fa = _cli("--capacity-bytes", "20e9", "--eviction", "flop-aware", "--eviction-alpha", "0.5", "--json")
    assert fa.returncode == 0, fa.stderr
    fa = json.loads(fa.stdout)
    assert fa["eviction"] == "flop-aware" and lru["eviction"] == "lru"
    for r in (lru, fa):
        assert 0 < r["prefill_flop_saved_fraction"] < 1 and r["evictions"] > 0
        assert r["stale_reads"] == r["evicted_hits"] == r["partial_restores"] == 0
    for args, needle in ((("--eviction", "lfu"), "--eviction:"),
                         (("--eviction", "flop-aware", "--eviction-alpha", "-2"),
                          "--eviction-alpha: field 'eviction_alpha': must be a finite number >= 0"),
                         (("--eviction-alpha", "2"), "flop-aware only")):  # LRU has no alpha to weigh
        proc = _cli(*args)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_flop_aware_replay_keeps_every_invariant():
    """A tight pool under flop-aware eviction: cache.check (refcounts, index, the chain links both ways)
    after every step, and no consistency-rule failure."""
    from k3sim.prefix_cache.setup import make_config
    from k3sim.serving.replay import replay
    from k3sim.workloads import read_mooncake

    cfg = make_config(ROOT / "models" / "kimi-k3.yaml", "decoupled", 512, 6144, 20e9, eviction="flop-aware",
                      eviction_alpha=0.5)
    res = replay(read_mooncake(CONV), cfg, check_every=1, keep_cache=True, record_requests=True)
    cache = res.extra["cache"]
    assert res.evictions > 0 and res.stale_reads == res.evicted_hits == res.partial_restores == 0
    assert cache.mla_parent  # chains were tracked, and checked at every step
    assert 0 < res.prefill_flop_saved_fraction < 1
    # the FLOP accounting follows the per-request hits: sum of f(hit) over sum of f(prompt), admitted requests only
    f = PrefillFlops(cfg.prefill_flop_linear, cfg.prefill_flop_pair)
    per = res.extra["per_request"]
    assert len(per) == res.requests and sum(h for _, h in per) == res.prefill_tokens_saved
    assert res.prefill_flop_saved == pytest.approx(sum(f(h) for _, h in per))
    assert res.prefill_flop_saved_fraction == pytest.approx(res.prefill_flop_saved / sum(f(L) for L, _ in per))


def test_prefill_flops_is_a_plain_polynomial():
    f = PrefillFlops(10.0, 1.0)
    assert f(3) == 10 * 3 + 3 * 4 and f.span(1, 3) == (30 + 12) - (10 + 2)


def test_closed_form_equals_the_per_query_sum():
    """Query i (0-based) of a causal prefill attends to i + 1 keys: summing the per-token cost query by query
    gives the closed form linear x t + pair x t (t + 1), pair = H (d_qk + d_v) per MLA layer (2 FLOP per MAC)."""
    H, d_qk, d_v, layers, linear = 3, 6, 4, 2, 50.0
    f = PrefillFlops(linear, layers * H * (d_qk + d_v))
    for t in (1, 2, 7, 40):
        by_query = sum(linear + layers * H * 2 * (d_qk + d_v) * (i + 1) for i in range(t))
        assert f(t) == pytest.approx(by_query)


def test_toy_model_prefill_flops_by_hand():
    """The 4-layer toy of tests/memory (10,070 active parameters, counted by hand there; lm_head 100 x 16):
    linear = 2 (10070 - 1600) + 3 KDA layers x 2 heads x chunk-KDA work at head dim 4 (C = 64):
    5 x 2 x 64 x 4 + 3 x 2 x 4 x 4 + 64^2 / 3 = 4021.33 per token-head; pair = 1 MLA layer x 2 heads x (4+2+4)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("memory_toys", ROOT / "tests" / "memory" / "memory_toys.py")
    toys = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toys)
    f = prefill_flops(toys.toy_model())
    assert f.linear_flop_per_token == pytest.approx(2 * (10070 - 1600) + 6 * (2560 + 96 + 4096 / 3))
    assert f.attention_flop_per_token_pair == 20


def test_cache_values_and_chain_ends_by_hand():
    """f(t) = 10 t + t (t + 1), page = 4 tokens of 1 B. After [1 2 | 3 4] is served: page P0 saves f(4) = 60 FLOP
    (15/B), P1 saves f(8) - f(4) = 92 (23/B), the checkpoint at 8 tokens saves f(8) = 152 over one 4 B slot
    (38/B). LRU holds C, P1, P0 (oldest first). P0 is the cheapest, but P1 continues from it: not a chain end.
    Between C (u = 0 + 2 x 1) and P1 (u = 1 + 2 x 0), alpha 2 evicts P1; plain LRU would evict C."""
    from k3sim.prefix_cache.cache import HybridPrefixCache
    from helpers_pc import serve, tiny_config

    cache = HybridPrefixCache(tiny_config(pages=4, eviction="flop-aware", eviction_alpha=2.0,
                                          prefill_flop_linear=10.0, prefill_flop_pair=1.0))
    serve(cache, [1, 2, 3, 4], 8)
    p0, p1, c = cache.mla_index[2], cache.mla_index[4], cache.ckpt_index[4].slots[0]
    c = cache.slot_pages[c][0]
    assert list(cache.pool.lru) == [c, p1, p0]
    assert (cache.pool.value[p0], cache.pool.value[p1], cache.pool.value[c]) == (15.0, 23.0, 38.0)
    assert cache.mla_parent == {p1: p0} and cache.mla_children == {p0: {p1}}
    rs = cache.admit([], 1, 0)  # private state takes the one empty page; its KV page must evict
    cache.schedule_prefill(rs, 4)
    assert p1 not in cache.page_keys and p0 in cache.page_keys and 4 in cache.ckpt_index
    assert cache.mla_children == {} and cache.mla_parent == {}  # P0 is a chain end now
    cache.check()


def test_flop_aware_chain_link_goes_to_the_indexed_page_not_a_private_recompute():
    """B shares A's first 5 hash blocks but no checkpoint inside them, so B recomputes its first two
    physical blocks into private pages (the prefix is already indexed on A's pages). B's third page
    continues A's chain: a lookup reaches it through A's page of block 1, which must count as its parent
    (else A's page could be evicted as a chain end and strand B's page)."""
    from helpers_pc import serve, tiny_config

    from k3sim.prefix_cache.cache import HybridPrefixCache

    cache = HybridPrefixCache(tiny_config("decoupled", hash_block=2, physical_block=4, groups=1, pages=64,
                                          eviction="flop-aware", prefill_flop_linear=10.0, prefill_flop_pair=1.0))
    a_keys = [101, 102, 103, 104, 105, 106]
    b_keys = [101, 102, 103, 104, 105, 206, 207, 208]
    serve(cache, a_keys, 12)
    rs = cache.admit(b_keys, 16, 0)
    while rs.computed < 16:  # B's chunks end at the junction (10 tokens), then run to the prompt end
        cache.schedule_prefill(rs, 1 << 30)
        cache.end_step()
    cache.check()
    a_block1 = cache.mla_index[a_keys[3]]
    b_block2 = cache.mla_index[b_keys[5]]
    assert rs.hit_hb == 0 and b_block2 == rs.blocks[2] and rs.blocks[1] != a_block1
    assert cache.mla_parent[b_block2] == a_block1 and not cache.pool.is_leaf(a_block1)
