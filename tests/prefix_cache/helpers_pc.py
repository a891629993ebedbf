"""Small drivers for the cache without the simpy loop: the tests control exactly what happens in a step."""

from __future__ import annotations

from k3sim.prefix_cache.cache import HybridPrefixCache, ReqState
from k3sim.prefix_cache.config import CacheConfig


def tiny_config(policy: str = "decoupled", *, hash_block: int = 2, physical_block: int = 4, groups: int = 1,
                pages: int | None = None, **switches) -> CacheConfig:
    """1 byte of MLA KV per token and one page per KDA group state: page counts are easy to reason about."""
    page_bytes = physical_block
    return CacheConfig(policy, hash_block, physical_block, 1, page_bytes * groups, groups,
                       None if pages is None else pages * page_bytes, **switches)


def serve(cache: HybridPrefixCache, keys: list[int], L: int, O: int = 0) -> ReqState:
    """Admit, prefill in one step, land it, release: a request that comes and goes alone."""
    rs = cache.admit(keys, L, O)
    assert isinstance(rs, ReqState), rs
    cache.schedule_prefill(rs, 1 << 30)
    cache.end_step()
    cache.grow_decode(rs, max(O, 1))
    cache.release(rs)
    cache.check()
    return rs
