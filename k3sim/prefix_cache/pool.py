"""Unified paged block pool: MLA KV pages and KDA state pages of one byte size, one free list, refcounts, LRU.

The free list has two ends (as in vLLM's free block queue, docs/design/prefix_caching.md): pages holding nothing
are handed out first; free pages that still hold cached content sit behind them in LRU order and are evicted
(their index entries dropped through `on_evict`) only when no empty page is left. Unbounded pools grow instead.
Plain lists and ints: this is the simulator's hot path.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

FREE, MLA, KDA = 0, 1, 2


class PoolExhausted(RuntimeError):
    """Every page is referenced; the caller must wait (admission reserves pages so this is a bug otherwise)."""


class BlockPool:
    def __init__(self, num_pages: int | None):
        self.capacity = num_pages  # None: unbounded
        self.refcount: list[int] = []
        self.kind: list[int] = []
        self.generation: list[int] = []  # bumped on every allocation: detects a hit whose page was reused
        self.empty: list[int] = []
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.reserved = 0  # pages promised to admitted requests, not yet allocated
        self.on_evict: Callable[[int], None] = lambda page: None
        self.evictions = 0
        self.evictions_by_kind = [0, 0, 0]

    @property
    def num_pages(self) -> int:
        return len(self.refcount)

    def num_free(self) -> int:
        """Pages an allocation could obtain now (empty + evictable + never created)."""
        grow = (self.capacity - len(self.refcount)) if self.capacity is not None else 1 << 60
        return len(self.empty) + len(self.lru) + grow

    def available(self) -> int:
        return self.num_free() - self.reserved

    def allocate(self, kind: int) -> int:
        if self.empty:
            page = self.empty.pop()
        elif self.capacity is None or len(self.refcount) < self.capacity:
            page = len(self.refcount)
            self.refcount.append(0)
            self.kind.append(FREE)
            self.generation.append(0)
        elif self.lru:
            page, _ = self.lru.popitem(last=False)
            self.evictions += 1
            self.evictions_by_kind[self.kind[page]] += 1
            self.on_evict(page)
        else:
            raise PoolExhausted("no free page")
        self.refcount[page] = 1
        self.kind[page] = kind
        self.generation[page] += 1
        return page

    def allocate_n(self, kind: int, n: int) -> list[int]:
        """n pages at once (a KDA state slot): empty pages in bulk, then one `allocate` (which may evict and so
        refill the empty end) at a time."""
        empty, rc, kd, gen = self.empty, self.refcount, self.kind, self.generation
        out: list[int] = []
        while len(out) < n:
            take = min(n - len(out), len(empty))
            if take:
                chunk = empty[-take:]
                del empty[-take:]
                for p in chunk:
                    rc[p] = 1
                    kd[p] = kind
                    gen[p] += 1
                out += chunk
                continue
            grow = n - len(out) if self.capacity is None else min(n - len(out), self.capacity - len(rc))
            if grow > 0:
                first = len(rc)
                rc.extend([1] * grow)
                kd.extend([kind] * grow)
                gen.extend([1] * grow)
                out.extend(range(first, first + grow))
            else:
                out.append(self.allocate(kind))
        return out

    def incref_n(self, pages: list[int]) -> None:
        rc, lru = self.refcount, self.lru
        for p in pages:
            if rc[p] == 0:
                del lru[p]
            rc[p] += 1

    def decref_n(self, pages: list[int], cached: bool) -> None:
        rc = self.refcount
        for p in pages:
            rc[p] -= 1
        if rc[pages[0]] == 0:  # a slot's pages always share one refcount
            if cached:
                lru = self.lru
                for p in pages:
                    lru[p] = None
            else:
                kd = self.kind
                for p in pages:
                    kd[p] = FREE
                self.empty.extend(pages)

    def uncache_n(self, pages: list[int]) -> None:
        lru, kd, empty = self.lru, self.kind, self.empty
        for p in pages:
            if p in lru:
                del lru[p]
                kd[p] = FREE
                empty.append(p)

    def incref(self, page: int) -> None:
        if self.refcount[page] == 0:
            del self.lru[page]  # a pinned page leaves the free list
        self.refcount[page] += 1

    def decref(self, page: int, cached: bool) -> None:
        """Drop one reference; at zero the page becomes free: LRU tail if it holds cached content, else empty."""
        rc = self.refcount[page] - 1
        self.refcount[page] = rc
        if rc == 0:
            if cached:
                self.lru[page] = None
            else:
                self.kind[page] = FREE
                self.empty.append(page)

    def uncache(self, page: int) -> None:
        """A free page lost its cache entry: move it from the LRU to the empty end."""
        if page in self.lru:
            del self.lru[page]
            self.kind[page] = FREE
            self.empty.append(page)

    def check(self) -> None:
        """Invariants: refcounts >= 0; free <=> refcount 0; no page both free and referenced; conservation."""
        n = len(self.refcount)
        free = set(self.empty)
        assert len(free) == len(self.empty), "page twice in the empty list"
        assert not (free & self.lru.keys()), "page both empty and in the LRU"
        free |= self.lru.keys()
        for p in range(n):
            rc = self.refcount[p]
            assert rc >= 0, f"negative refcount on page {p}"
            assert (rc == 0) == (p in free), f"page {p}: refcount {rc} but free={p in free}"
        assert self.capacity is None or n <= self.capacity, "pool grew past its capacity"
        assert len(free) + sum(1 for rc in self.refcount if rc > 0) == n, "pages not conserved"
        assert self.reserved >= 0, "negative reservation"
