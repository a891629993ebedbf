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


def ks(n: int, shared: int, tail: int) -> list:
    """Chained keys of n hash blocks: the first `shared` equal across tails ('p', j), the rest this tail's own."""
    return [("p", j) for j in range(shared)] + [("t", tail, j) for j in range(shared, n)]


def serve_chunks(cache: HybridPrefixCache, keys: list, L: int, budgets: list[int], O: int = 1) -> ReqState:
    """Admit, prefill one chunk of each budget per step (each step landed), decode O tokens, release."""
    rs = cache.admit(keys, L, O)
    assert isinstance(rs, ReqState), rs
    for b in budgets:
        cache.schedule_prefill(rs, b)
        cache.end_step()
        if rs.computed >= L:
            break
    assert rs.computed == L, (rs.computed, L)
    cache.grow_decode(rs, O)
    cache.release(rs)
    cache.end_step()
    cache.check()
    return rs


def run_main(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `k3sim argv...` through the real entry point, in-process."""
    from k3sim.cli import main

    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err
