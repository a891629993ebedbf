import pytest

from k3sim.prefix_cache.pool import FREE, KDA, MLA, BlockPool, PoolExhausted


def test_empty_pages_before_lru_and_lru_order():
    pool = BlockPool(3)
    evicted = []
    pool.on_evict = evicted.append
    a, b, c = (pool.allocate(MLA) for _ in range(3))
    pool.decref(a, cached=True)
    pool.decref(b, cached=True)
    pool.decref(c, cached=False)  # holds nothing: handed out first
    assert pool.allocate(MLA) == c and evicted == []
    assert pool.allocate(MLA) == a and evicted == [a]  # then the least recently freed cached page
    pool.check()


def test_pinned_page_leaves_free_list_and_exhaustion():
    pool = BlockPool(1)
    p = pool.allocate(KDA)
    pool.decref(p, cached=True)
    pool.incref(p)
    assert p not in pool.lru
    with pytest.raises(PoolExhausted):
        pool.allocate(MLA)
    pool.decref(p, cached=False)
    assert pool.kind[p] == FREE and pool.empty == [p]
    pool.check()


def test_bulk_allocation_matches_single_and_grows_unbounded():
    pool = BlockPool(None)
    pages = pool.allocate_n(KDA, 5)
    # a unit's count is its first page's (one pin or release per unit, however many pages it takes)
    assert pages == [0, 1, 2, 3, 4] and pool.refcount[0] == 1 and not any(pool.refcount[1:])
    pool.decref_n(pages, cached=True)
    assert list(pool.lru) == [0] and pool.parked == 4  # one LRU entry per unit
    pool.check()
    pool.uncache_n(pages)
    assert sorted(pool.empty) == pages and pool.parked == 0
    pool.check()


def test_evicting_a_unit_frees_all_its_pages():
    pool = BlockPool(6)
    evicted = []
    pool.on_evict = evicted.append
    unit = pool.allocate_n(KDA, 3)
    pool.decref_n(unit, cached=True)
    others = [pool.allocate(MLA) for _ in range(3)]  # grows to capacity
    assert evicted == [] and pool.num_free() == 3
    p = pool.allocate(MLA)  # nothing empty, nothing to grow: the unit is evicted as a whole
    assert evicted == [unit[0]] and p == unit[0] and sorted(pool.empty) == sorted(unit[1:])
    assert pool.evictions == 3 and pool.evictions_by_kind[KDA] == 3
    pool.check()
    assert others


def test_check_catches_a_page_both_free_and_referenced():
    pool = BlockPool(2)
    p = pool.allocate(MLA)
    pool.empty.append(p)  # corrupt on purpose
    with pytest.raises(AssertionError):
        pool.check()


def _pool_with_free_cached(values: list[float], window: int = 8, alpha: float = 1.0) -> tuple[BlockPool, list[int]]:
    pool = BlockPool(len(values))
    pool.victim_window, pool.alpha = window, alpha
    pages = [pool.allocate(MLA) for _ in values]
    for p, v in zip(pages, values):
        pool.value[p] = v
        pool.decref(p, cached=True)  # freed oldest first
    return pool, pages


def test_flop_aware_eviction_trades_recency_against_flop_per_byte():
    """utility = recency rank + alpha x FLOP-per-byte, min-max normalised over the candidates: with equal
    weight the oldest of two pages survives when it saves far more per byte; LRU evicts it."""
    pool, (old, new) = _pool_with_free_cached([10.0, 1.0], alpha=2.0)  # old: 0 + 2 x 1 = 2; new: 1 + 0 = 1
    evicted = []
    pool.on_evict = evicted.append
    pool.allocate(MLA)
    assert evicted == [new]
    pool, (old, new) = _pool_with_free_cached([10.0, 1.0], alpha=0.5)  # old: 0.5 < new: 1 -> recency wins
    evicted = []
    pool.on_evict = evicted.append
    pool.allocate(MLA)
    assert evicted == [old]
    pool.check()


def test_flop_aware_eviction_only_looks_at_the_window_and_at_leaves():
    pool, pages = _pool_with_free_cached([5.0, 5.0, 0.0], window=2)  # the cheap page is outside the window
    evicted = []
    pool.on_evict = evicted.append
    pool.allocate(MLA)
    assert evicted == [pages[0]]  # equal values: the older of the two in the window
    pool, pages = _pool_with_free_cached([0.0, 9.0, 9.0])
    pool.is_leaf = lambda p: p != pages[0]  # something cached continues from the cheapest page
    evicted = []
    pool.on_evict = evicted.append
    pool.allocate(MLA)
    assert evicted == [pages[1]]
    pool.check()
