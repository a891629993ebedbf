"""The two-level lookup and the granularity example of MISSION.md section 5."""

import pytest

from k3sim.errors import InputError
from k3sim.prefix_cache.cache import HybridPrefixCache
from k3sim.prefix_cache.config import CacheConfig, kda_groups_for
from helpers_pc import serve, tiny_config

MLA_B, KDA_B = 27648, 449372160  # K3 sizes (bytes): MLA KV per token, KDA state + conv per request


def k3(policy: str, hash_block: int = 512, physical_block: int = 6144, capacity=None) -> CacheConfig:
    return CacheConfig(policy, hash_block, physical_block, MLA_B, KDA_B, 3, capacity)


def keys_for(prefix_id: int, shared_hb: int, total_hb: int, tail_id: int) -> list[int]:
    """Chained keys: the first `shared_hb` hash blocks identical across tail ids, then distinct."""
    return [(prefix_id, j) for j in range(shared_hb)] + [(prefix_id, tail_id, j) for j in range(shared_hb, total_hb)]


@pytest.mark.parametrize("policy,expected", [("decoupled", 2560), ("full-attention", 2560), ("coarse", 0)])
def test_mission_example_2800_shared_tokens(policy, expected):
    """A request shares its first 2800 tokens with a cached prefix: the hit is 2560 = 5 x 512, deep inside a
    6144-token block (decoupled), and nothing under coarse 6144-token blocks."""
    cache = HybridPrefixCache(k3(policy))
    first = keys_for(0, 5, 2800 // 512, tail_id=1)  # 5 full shared hash blocks, then the 6th differs...
    # the cached request is 2800 tokens: its 5 complete hash blocks are shared, the 6th (partial) is not hashed
    serve(cache, first, 2800, 10)
    second = keys_for(0, 5, 9000 // 512, tail_id=2)
    rs = cache.admit(second, 9000, 10)
    assert rs.hit_hb * cache.B_h == expected
    assert rs.computed == expected  # prefill resumes there


def test_half_full_page_endpoints_and_checkpoint_in_every_group():
    cfg = tiny_config(groups=3)
    cache = HybridPrefixCache(cfg)
    rs = serve(cache, [1, 2, 3], 6)  # pages [4 tokens][2 tokens]; endpoints 1,2 then 3 in the half-full page
    assert len(rs.blocks) == 0 and cache.pool.num_pages >= 2
    first, second = cache.mla_index[1], cache.mla_index[3]
    assert cache.mla_index[2] == first != second  # endpoint 3 registered on the half-full second page
    assert cache.page_keys[first] == [1, 2] and cache.page_keys[second] == [3] and 3 in cache.ckpt_index
    assert all(s >= 0 for s in cache.ckpt_index[3].slots) and len(cache.ckpt_index[3].slots) == 3
    hit, mla_end, pages, src, ck, stale = cache.lookup([1, 2, 3, 4, 5], 10)
    assert (hit, mla_end) == (3, 3) and len(pages) == 1 and src >= 0 and ck is cache.ckpt_index[3]


def test_hit_is_clamped_to_the_last_checkpoint_below_the_mla_match():
    cache = HybridPrefixCache(tiny_config(junction_checkpoints=False))
    serve(cache, [1, 2, 3, 4], 8)  # checkpoint only at the prompt end (key 4)
    rs = cache.admit([1, 2, 3, 9, 9], 10, 0)  # MLA matches 3 hash blocks, no checkpoint there
    assert rs.hit_hb == 0
    assert cache.stats.mla_match_tokens == 6


def test_junction_checkpoint_makes_the_branch_point_reusable():
    cache = HybridPrefixCache(tiny_config())
    serve(cache, [1, 2, 3, 4], 8)
    serve(cache, [1, 2, 3, 7, 8], 10)  # misses at 0, keeps a checkpoint at the junction (key 3)
    rs = cache.admit([1, 2, 3, 5, 6], 10, 0)
    assert rs.hit_hb == 3


def test_at_least_one_token_is_recomputed():
    cache = HybridPrefixCache(tiny_config("full-attention"))
    serve(cache, [1, 2, 3, 4], 8)
    rs = cache.admit([1, 2, 3, 4], 8, 0)
    assert rs.hit_hb == 3


def test_bad_granularity_and_groups():
    with pytest.raises(InputError, match="does not divide"):
        k3("decoupled", 500, 6144)
    assert kda_groups_for(69, 24) == 3 and kda_groups_for(0, 24) == 0
    with pytest.raises(InputError, match="one request needs"):
        k3("decoupled", capacity=1e6).check_capacity()
    assert k3("coarse", 512, 6144).effective_hash_block_tokens == 6144
    assert k3("decoupled").pages_per_group_state == 1  # 150 MB group state in one 170 MB page
    assert k3("decoupled", 512, 512).pages_per_group_state == 11


def test_k3_sizes_used_in_these_tests_come_from_the_model_config():
    """MLA_B / KDA_B above are not typed in to match: they are what the K3 config gives (27 KiB/token of MLA
    latent KV over all MLA layers; KDA recurrent state + short-conv window over all KDA layers)."""
    from k3sim.configs import load_model
    from k3sim.prefix_cache.config import config_from_model

    c = config_from_model(load_model("models/kimi-k3.yaml"), "decoupled", 512, 6144)
    assert (c.mla_kv_bytes_per_token, c.kda_state_bytes_per_request, c.num_kda_groups) == (MLA_B, KDA_B, 3)
