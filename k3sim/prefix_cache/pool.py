"""Unified paged block pool: MLA KV pages and KDA state pages of one byte size, one free list, refcounts, LRU.

The free list has two ends (as in vLLM's free block queue, docs/design/prefix_caching.md): pages holding nothing
are handed out first; free pages that still hold cached content sit behind them in LRU order and are evicted
(their index entries dropped through `on_evict`) only when no empty page is left. Unbounded pools grow instead.

A KDA state slot of several pages is one *unit*: its pages are pinned, freed, cached and evicted together, so
only its first page stands in the LRU (the others are "parked" behind it) and only its first page's refcount is
kept (a pin or release is one operation however many pages the state takes: a TensorRT-LLM snapshot of K3 is
32 pages of 512 tokens); the other pages' counts are reset when the unit's pages go back to the empty end.
Plain lists and ints: this is the simulator's hot path.

Eviction picks the oldest free cached entry (LRU), or with `victim_window` > 0 the entry of lowest utility
among the leaves (`is_leaf`: no cached entry depends on it) of the `victim_window` oldest: recency rank +
alpha x `value` (FLOP a hit on it saves per byte, set by the cache), each min-max normalised over those
candidates (Marconi's eviction, MLSys 2025, section 4.2, which evicts radix-tree nodes with at most one
child; over a window of the LRU order as sampled-LRU caches do, so one eviction costs O(window)).
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice
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
        self.lru: OrderedDict[int, None] = OrderedDict()  # free cached pages (units: first page only), oldest first
        self.unit: dict[int, list[int]] = {}  # first page -> all pages of a multi-page unit
        self.parked = 0  # free cached pages standing behind their unit's first page
        self.reserved = 0  # pages promised to admitted requests, not yet allocated
        self.on_evict: Callable[[int], None] = lambda page: None
        self.evictions = 0
        self.evictions_by_kind = [0, 0, 0]
        self.victim_window = 0  # 0: plain LRU; else flop-aware over this many oldest candidates
        self.alpha = 1.0
        self.value: dict[int, float] = {}  # head page -> FLOP saved per byte by a hit on its content
        self.is_leaf: Callable[[int], bool] = lambda page: True  # flop-aware: nothing cached depends on it

    @property
    def num_pages(self) -> int:
        return len(self.refcount)

    def num_free(self) -> int:
        """Pages an allocation could obtain now (empty + evictable + never created)."""
        grow = (self.capacity - len(self.refcount)) if self.capacity is not None else 1 << 60
        return len(self.empty) + len(self.lru) + self.parked + grow

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
            page = self._victim()
            k = self.kind[page]
            members = self.unit.pop(page, None)
            if members is not None:  # the rest of the unit becomes empty (their refcounts are already 0)
                rest = members[1:]
                self.parked -= len(rest)
                self.empty.extend(rest)
            self.evictions += 1 if members is None else len(members)
            self.evictions_by_kind[k] += 1 if members is None else len(members)
            self.on_evict(page)
        else:
            raise PoolExhausted("no free page")
        self.refcount[page] = 1
        self.kind[page] = kind
        self.generation[page] += 1
        return page

    def _victim(self) -> int:
        """Remove and return the free cached entry to evict (see the module docstring)."""
        lru = self.lru
        if self.victim_window <= 1 or len(lru) == 1:
            return lru.popitem(last=False)[0]
        leaf = self.is_leaf
        cands = [p for p in islice(lru, self.victim_window) if leaf(p)]
        if len(cands) < 2:  # no choice among leaves: the oldest leaf, else the oldest entry
            page = cands[0] if cands else next(iter(lru))
            del lru[page]
            return page
        value = self.value
        vals = [value.get(p, 0.0) for p in cands]
        lo = min(vals)
        span = max(vals) - lo
        scale = self.alpha / span if span > 0 else 0.0
        last = len(cands) - 1
        best, best_u = cands[0], float("inf")
        for i, (p, v) in enumerate(zip(cands, vals)):
            u = i / last + scale * (v - lo)
            if u < best_u:
                best, best_u = p, u
        del lru[best]
        return best

    def allocate_n(self, kind: int, n: int) -> list[int]:
        """A unit of n pages (a KDA state slot): empty pages in bulk, growth in bulk, then one `allocate` (which
        may evict and so refill the empty end) at a time. Only the first page carries the refcount, the kind and a
        new generation; the others keep refcount 0, so they go back to the empty end as they are."""
        empty, rc, kd, gen = self.empty, self.refcount, self.kind, self.generation
        if not empty and self.capacity is None:  # fast path: an unbounded pool grows by the whole unit
            first = len(rc)
            rc.append(1)
            rc.extend([0] * (n - 1))
            kd.extend([kind] * n)
            gen.extend([1] * n)
            out = list(range(first, first + n))
            if n > 1:
                self.unit[first] = out
            return out
        out: list[int] = []
        need = n
        while need:
            take = need if need < len(empty) else len(empty)
            if take:
                chunk = empty[-take:]
                del empty[-take:]
                out += chunk
                need -= take
                continue
            grow = need if self.capacity is None else min(need, self.capacity - len(rc))
            if grow > 0:
                first = len(rc)
                rc.extend([0] * grow)
                kd.extend([kind] * grow)
                gen.extend([1] * grow)
                out.extend(range(first, first + grow))
                need -= grow
            else:
                page = self.allocate(kind)  # evicts: a unit's other pages refill the empty end
                rc[page] = 0
                out.append(page)
                need -= 1
        # a page taken from the empty end held nothing anyone pins; the unit's identity is its first page's
        # generation (a hit's pages and slots change owner only through an eviction, which bumps it)
        head = out[0]
        rc[head] = 1
        kd[head] = kind
        gen[head] += 1
        if n > 1:
            self.unit[head] = out
        return out

    def incref_n(self, pages: list[int]) -> None:
        """Pin a unit: its first page's refcount stands for all its pages."""
        rc, head = self.refcount, pages[0]
        if rc[head] == 0:
            del self.lru[head]  # the unit leaves the free list
            self.parked -= len(pages) - 1
        rc[head] += 1

    def decref_n(self, pages: list[int], cached: bool) -> None:
        rc, head = self.refcount, pages[0]
        rc[head] -= 1
        if rc[head] == 0:  # a unit's pages share its first page's refcount
            if cached:
                self.lru[pages[0]] = None
                self.parked += len(pages) - 1
            else:
                self._to_empty(pages)

    def uncache_n(self, pages: list[int]) -> None:
        """A free cached unit lost its cache entry: all its pages go to the empty end."""
        if pages[0] in self.lru:
            del self.lru[pages[0]]
            self.parked -= len(pages) - 1
            self._to_empty(pages)

    def _to_empty(self, pages: list[int]) -> None:
        self.kind[pages[0]] = FREE  # a unit's other pages carry neither a kind nor a refcount
        self.refcount[pages[0]] = 0
        self.empty.extend(pages)
        if len(pages) > 1:
            del self.unit[pages[0]]

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
        """Invariants: refcounts >= 0; free <=> refcount 0; no page both free and referenced; conservation;
        a unit's pages share one refcount and only its first page stands in the LRU."""
        n = len(self.refcount)
        rcs = list(self.refcount)
        free = set(self.empty)
        assert len(free) == len(self.empty), "page twice in the empty list"
        assert not (free & self.lru.keys()), "page both empty and in the LRU"
        parked = 0
        for head, pages in self.unit.items():
            assert pages[0] == head and not (free & set(pages)), f"unit {head} split"
            for p in pages[1:]:
                rcs[p] = rcs[head]  # a unit's count is its first page's
            if head in self.lru:
                parked += len(pages) - 1
                assert not (free & set(pages[1:])), "parked page also empty"
                free |= set(pages[1:])
        assert parked == self.parked, "parked count drifted"
        free |= self.lru.keys()
        for p in range(n):
            rc = rcs[p]
            assert rc >= 0, f"negative refcount on page {p}"
            assert (rc == 0) == (p in free), f"page {p}: refcount {rc} but free={p in free}"
        assert self.capacity is None or n <= self.capacity, "pool grew past its capacity"
        assert len(free) + sum(1 for rc in rcs if rc > 0) == n, "pages not conserved"
        assert self.reserved >= 0, "negative reservation"
