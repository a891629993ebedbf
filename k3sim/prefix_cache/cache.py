"""The hybrid KDA+MLA prefix cache: chained-hash index over MLA pages, KDA checkpoints in per-group slots,
the two-level lookup, the checkpoint policy, and the three consistency rules.

Vocabulary: positions are counted in hash blocks (`hb`) of `B_h` tokens; a physical block (one page) holds
`r = B_p / B_h` hash blocks. Key j = chained hash of hash blocks 0..j, so finding key j proves the whole prefix
of (j+1)*B_h tokens. Everything here is plain dicts, lists and ints: it is the replay's hot path.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3sim.prefix_cache.config import CacheConfig
from k3sim.prefix_cache.flops import PrefillFlops
from k3sim.prefix_cache.pool import KDA, MLA, BlockPool


@dataclass
class CacheStats:
    lookups: int = 0
    lookup_probes: int = 0  # index probes (dict lookups) made by the two-level lookup
    requests_admitted: int = 0
    requests_with_hit: int = 0
    hit_tokens: int = 0
    prefill_flop_requested: float = 0.0  # prefill FLOP of every admitted prompt, whole model
    prefill_flop_saved: float = 0.0  # of which the hits skipped
    mla_match_tokens: int = 0  # what the MLA level alone would have reused
    checkpoints_written: int = 0
    checkpoints_skipped: int = 0  # no free page beyond reservations: best effort
    checkpoints_recycled: int = 0
    checkpoints_evicted: int = 0
    checkpoint_pages_peak: int = 0
    # failures the consistency rules prevent (stay 0 with the rules on)
    evicted_hits: int = 0  # rule 1: a hit page reused by the request's own allocation
    stale_reads: int = 0  # rule 2: a hit on bytes that had not landed yet
    fenced_lookups: int = 0  # lookups that stopped at bytes still in flight (rule 2 doing its job)
    partial_restores: int = 0  # rule 3: a checkpoint restored with a group missing


class Ckpt:
    """One KDA checkpoint at a boundary: a read-only slot per KDA cache group (-1 once that group's slot is gone)."""

    __slots__ = ("key", "slots", "ready", "kept", "cached")

    def __init__(self, key: int, ready: int, kept: bool):
        self.key = key
        self.slots: list[int] = []
        self.ready = ready  # first step whose lookups may read it (it is written by the forward of ready-1)
        self.kept = kept  # turn boundary or junction: released to the LRU; else transient, recycled when superseded
        self.cached = True


class ReqState:
    """A request's private view: its block table, private KDA state, progress, and what it pins."""

    __slots__ = ("keys", "L", "O", "blocks", "state_slots", "computed", "hit_hb", "reg_hb", "turn_hb",
                 "junction_tok", "transient", "reserve_left", "generated", "total_blocks", "arrival_s")

    def __init__(self, keys: list[int], L: int, O: int, arrival_s: float = 0.0):
        self.keys = keys
        self.L = L
        self.O = O
        self.blocks: list[int] = []
        self.state_slots: list[int] = []
        self.computed = 0
        self.hit_hb = 0
        self.reg_hb = 0
        self.turn_hb = 0
        self.junction_tok = -1
        self.transient: Ckpt | None = None
        self.reserve_left = 0
        self.generated = 0
        self.total_blocks = 0
        self.arrival_s = arrival_s


WAIT, REJECT = "wait", "reject"


class HybridPrefixCache:
    def __init__(self, cfg: CacheConfig):
        self.cfg = cfg
        self.B_h = cfg.effective_hash_block_tokens
        self.B_p = cfg.physical_block_tokens
        self.r = self.B_p // self.B_h
        self.G = cfg.groups
        self.k = cfg.pages_per_group_state
        self.coarse = cfg.policy == "coarse"
        self.retain = cfg.retention_interval_tokens if self.G else 0
        self.pool = BlockPool(cfg.num_pages)
        self.pool.on_evict = self._on_evict
        self.flops = PrefillFlops(cfg.prefill_flop_linear, cfg.prefill_flop_pair)
        self.flop_aware = cfg.eviction == "flop-aware"
        # flop-aware: the chain of MLA pages (page -> the page of the previous physical block of its prefix), so
        # that only chain ends are eviction candidates: a page others continue from is never evicted first
        self.mla_parent: dict[int, int] = {}
        self.mla_children: dict[int, set[int]] = {}
        if self.flop_aware:
            self.pool.victim_window = cfg.eviction_window
            self.pool.alpha = cfg.eviction_alpha
            self.pool.is_leaf = lambda page: page not in self.mla_children
        self.mla_index: dict[int, int] = {}  # key -> page holding that prefix endpoint
        self.mla_ready: dict[int, int] = {}  # key -> first step its bytes have landed
        self.page_keys: dict[int, list[int]] = {}  # MLA page -> keys registered on it (alias endpoints)
        self.ckpt_index: dict[int, Ckpt] = {}
        self.slot_pages: dict[int, list[int]] = {}
        self.slot_ckpt: dict[int, Ckpt | None] = {}  # None: a request's private running state
        self.page_slot: dict[int, int] = {}
        self._next_slot = 0
        self.ckpt_pages = 0
        self.step = 0
        self.stats = CacheStats()
        self._step_writes: list[Ckpt] = []
        self._step_unpins: list[tuple[int, int]] = []  # (0, page) | (1, slot): copy sources, released when landed
        self._recycle: list[Ckpt] = []

    # ---------------------------------------------------------------- slots
    def _alloc_slot(self, ckpt: Ckpt | None) -> int:
        sid = self._next_slot
        self._next_slot += 1
        pages = self.pool.allocate_n(KDA, self.k)
        self.slot_pages[sid] = pages
        self.slot_ckpt[sid] = ckpt
        self.page_slot[pages[0]] = sid  # only a unit's first page can be evicted
        if ckpt is not None:
            self.ckpt_pages += self.k
            if self.ckpt_pages > self.stats.checkpoint_pages_peak:
                self.stats.checkpoint_pages_peak = self.ckpt_pages
        return sid

    def _forget_slot(self, sid: int) -> None:
        del self.page_slot[self.slot_pages.pop(sid)[0]]
        if self.slot_ckpt.pop(sid) is not None:
            self.ckpt_pages -= self.k

    def _slot_incref(self, sid: int) -> None:
        self.pool.incref_n(self.slot_pages[sid])

    def _slot_decref(self, sid: int) -> None:
        pages = self.slot_pages[sid]
        ck = self.slot_ckpt[sid]
        cached = ck is not None and ck.cached
        self.pool.decref_n(pages, cached)
        if not cached and self.pool.refcount[pages[0]] == 0:
            self._forget_slot(sid)

    def _drop_ckpt(self, ck: Ckpt) -> None:
        """Remove a checkpoint from the index; free slots nobody pins go to the empty end of the free list."""
        if not ck.cached:
            return
        ck.cached = False
        if self.ckpt_index.get(ck.key) is ck:
            del self.ckpt_index[ck.key]
        for sid in ck.slots:
            if sid >= 0 and sid in self.slot_pages:
                pages = self.slot_pages[sid]
                if self.pool.refcount[pages[0]] == 0:
                    self.pool.uncache_n(pages)
                    self._forget_slot(sid)

    # ---------------------------------------------------------------- eviction
    def _on_evict(self, page: int) -> None:
        if self.pool.kind[page] == MLA:
            if self.flop_aware:
                par = self.mla_parent.pop(page, None)
                if par is not None:
                    sib = self.mla_children[par]
                    sib.discard(page)
                    if not sib:
                        del self.mla_children[par]
                for c in self.mla_children.pop(page, ()):
                    del self.mla_parent[c]
            for key in self.page_keys.pop(page, ()):
                if self.mla_index.get(key) == page:
                    del self.mla_index[key]
                    del self.mla_ready[key]
            return
        sid = self.page_slot[page]
        ck = self.slot_ckpt[sid]
        self._forget_slot(sid)  # the pool already moved the slot's other pages to the empty end
        if ck is None:  # private state is never in the LRU
            raise AssertionError("private KDA state evicted")
        self.stats.checkpoints_evicted += 1
        ck.slots[ck.slots.index(sid)] = -1
        if self.cfg.invalidate_siblings or all(s < 0 for s in ck.slots):  # rule 3
            self._drop_ckpt(ck)

    # ---------------------------------------------------------------- lookup
    def lookup(self, keys: list[int], L: int) -> tuple[int, int, list[int], int, Ckpt | None, bool]:
        """Two-level lookup -> (hit_hb, mla_end_hb, whole-block pages, partial source page, checkpoint, stale).

        MLA: whole physical blocks by chained hash, then the hash endpoints inside the first missing block.
        KDA: the longest endpoint within the MLA match holding a checkpoint (one index probe: rule 3 keeps an
        indexed checkpoint present in every group). At least one prompt token is always recomputed (logits).
        """
        B_h, r = self.B_h, self.r
        cap = (L - 1) // B_h
        idx, ready, step = self.mla_index, self.mla_ready, self.step
        fence = self.cfg.fence_unlanded
        probes = 0
        unready_hb = 1 << 62  # first prefix length (hash blocks) that relied on unlanded bytes
        fenced = False
        pages: list[int] = []
        nb = cap // r
        k = 0
        while k < nb:
            key = keys[(k + 1) * r - 1]
            probes += 1
            p = idx.get(key)
            if p is None:
                break
            if ready[key] > step:
                if fence:
                    fenced = True
                    break
                unready_hb = min(unready_hb, (k + 1) * r)
            pages.append(p)
            k += 1
        mla_end = k * r
        src = -1
        if r > 1:
            for j in range(min((k + 1) * r - 2, cap - 1), k * r - 1, -1):
                probes += 1
                key = keys[j]
                p = idx.get(key)
                if p is not None:
                    if ready[key] > step:
                        if fence:
                            fenced = True
                            continue
                        unready_hb = min(unready_hb, j + 1)
                    mla_end = j + 1
                    src = p
                    break
        ck = None
        if self.G:
            hit = 0
            ckpts = self.ckpt_index
            for j in range(mla_end - 1, -1, -1):
                probes += 1
                c = ckpts.get(keys[j])
                if c is not None:
                    if c.ready > step:
                        if fence:
                            fenced = True
                            continue
                        unready_hb = min(unready_hb, j + 1)
                    hit = j + 1
                    ck = c
                    break
        else:
            hit = mla_end
        self.stats.lookups += 1
        self.stats.lookup_probes += probes
        if fenced:
            self.stats.fenced_lookups += 1
        m = hit // r
        if hit % r:
            src = pages[m] if m < k else src
        else:
            src = -1
        return hit, mla_end, pages[:m], src, ck, hit >= unready_hb

    # ---------------------------------------------------------------- admission
    def admit(self, keys: list[int], L: int, O: int, arrival_s: float = 0.0) -> ReqState | str:
        """Look up, pin the hit, reserve every page the request will need, allocate its private state.

        Returns the request's state, WAIT (not enough free pages now) or REJECT (larger than the pool)."""
        cfg, pool, r, G, k = self.cfg, self.pool, self.r, self.G, self.k
        hit, mla_end, hit_pages, src, ck, stale = self.lookup(keys, L)
        total_blocks = -(-(L + O) // self.B_p)
        shared = len(hit_pages)
        need = total_blocks - shared + G * k
        pin_pages = list(hit_pages)
        if src >= 0:
            pin_pages.append(src)
        ck_slots = [s for s in ck.slots if s >= 0] if ck is not None else []
        for s in ck_slots:
            pin_pages.extend(self.slot_pages[s])
        if pool.capacity is not None and need + len(pin_pages) > pool.capacity:
            return REJECT  # could not fit even in an otherwise empty pool
        pins_from_free = 0
        rc = pool.refcount
        seen = set()
        for p in pin_pages:
            if rc[p] == 0 and p not in seen:
                pins_from_free += 1
                seen.add(p)
        if need + pins_from_free > pool.available():
            return WAIT
        rs = ReqState(keys, L, O, arrival_s)
        rs.total_blocks = total_blocks
        gens = [pool.generation[p] for p in pin_pages]
        if cfg.pin_before_allocate:  # rule 1: pin the hit in all groups before any allocation
            self._pin(rs, hit_pages, src, ck_slots)
        rs.state_slots = [self._alloc_slot(None) for _ in range(G)]  # private running state (copy target)
        partial = hit % r != 0
        if partial:
            rs.blocks.append(pool.allocate(MLA))  # private copy of the shared half-block (copy-on-write)
        if not cfg.pin_before_allocate:
            ck_slots = [s for s in ck_slots if s in self.slot_pages]
            self._pin(rs, hit_pages, src, ck_slots)
        if any(pool.generation[p] != g for p, g in zip(pin_pages, gens)) or (
            ck is not None and len(ck_slots) < sum(1 for s in ck.slots if s >= 0)
        ):
            self.stats.evicted_hits += 1
        if ck is not None and (not ck.cached or any(s < 0 for s in ck.slots)):
            self.stats.partial_restores += 1
        if stale:
            self.stats.stale_reads += 1
        rs.blocks = hit_pages + rs.blocks  # block table: shared whole blocks, then the private partial copy
        rs.reserve_left = total_blocks - len(rs.blocks)
        pool.reserved += rs.reserve_left
        rs.computed = hit * self.B_h
        rs.hit_hb = rs.reg_hb = hit
        rs.turn_hb = L // self.B_h
        if cfg.junction_checkpoints and G and not self.coarse and mla_end > hit:
            rs.junction_tok = mla_end * self.B_h
        st = self.stats
        st.requests_admitted += 1
        st.hit_tokens += hit * self.B_h
        st.prefill_flop_requested += self.flops(L)
        if hit:
            st.prefill_flop_saved += self.flops(hit * self.B_h)
        st.mla_match_tokens += mla_end * self.B_h
        if hit:
            st.requests_with_hit += 1
        return rs

    def _pin(self, rs: ReqState, hit_pages: list[int], src: int, ck_slots: list[int]) -> None:
        for p in hit_pages:
            self.pool.incref(p)  # held until the request completes
        if src >= 0:
            self.pool.incref(src)  # copy source: held until the copy lands
            self._step_unpins.append((0, src))
        for s in ck_slots:
            self._slot_incref(s)
            self._step_unpins.append((1, s))

    # ---------------------------------------------------------------- prefill / decode
    def schedule_prefill(self, rs: ReqState, budget: int) -> int:
        """Schedule one chunk of at most `budget` tokens; register the endpoints and checkpoints it produces
        (visible to lookups from the next step on). Returns the tokens scheduled."""
        s, L = rs.computed, rs.L
        if s >= L or budget <= 0:
            return 0
        e = min(L, s + budget)
        J = rs.junction_tok
        if s < J < e:
            e = J  # end the chunk at the junction so its checkpoint lands there (vLLM align-mode style)
        I = self.retain
        if I and not self.coarse:
            nxt = (s // I + 1) * I
            if nxt < e:
                e = nxt
        B_h, B_p, pool = self.B_h, self.B_p, self.pool
        need_blocks = -(-e // B_p)
        blocks = rs.blocks
        while len(blocks) < need_blocks:
            blocks.append(pool.allocate(MLA))
            rs.reserve_left -= 1
            pool.reserved -= 1
        hb_end = e // B_h
        if hb_end > rs.reg_hb:
            idx, ready, pk, keys, r = self.mla_index, self.mla_ready, self.page_keys, rs.keys, self.r
            nxt = self.step + 1
            for j in range(rs.reg_hb, hb_end):
                key = keys[j]
                if key not in idx:
                    p = blocks[j // r]
                    idx[key] = p
                    ready[key] = nxt
                    lst = pk.get(p)
                    if lst is None:
                        pk[p] = [key]
                        if self.flop_aware:  # a hit through this page skips prefilling its tokens
                            b = j // r
                            pool.value[p] = self.flops.span(b * B_p, (b + 1) * B_p) / self.cfg.page_bytes
                            # the page a lookup reaches this one through: the one indexed for the previous
                            # block's last key (not necessarily this request's own copy of that block)
                            par = idx.get(keys[b * r - 1], -1) if b else -1
                            if par >= 0 and par != p and par in pk:
                                self.mla_parent[p] = par
                                self.mla_children.setdefault(par, set()).add(p)
                    else:
                        lst.append(key)
            rs.reg_hb = hb_end
        if self.G:
            if self.coarse:  # a checkpoint at every physical block boundary crossed, all kept
                for b in range(s // B_p + 1, e // B_p + 1):
                    self._write_ckpt(rs, b * self.r, kept=True)
            elif hb_end * B_h > s and hb_end > 0:  # the last hash-aligned position of this forward
                if rs.transient is not None:
                    self._recycle.append(rs.transient)  # superseded by progress
                    rs.transient = None
                kept = hb_end == rs.turn_hb or hb_end * B_h == J or (I > 0 and hb_end * B_h % I == 0)
                self._write_ckpt(rs, hb_end, kept)
        rs.computed = e
        return e - s

    def _write_ckpt(self, rs: ReqState, hb: int, kept: bool) -> None:
        key = rs.keys[hb - 1]
        if key in self.ckpt_index:
            return  # someone else already persisted this boundary
        if self.pool.available() < self.G * self.k:
            self.stats.checkpoints_skipped += 1
            return
        ck = Ckpt(key, self.step + 1, kept)
        ck.slots = [self._alloc_slot(ck) for _ in range(self.G)]  # new slots: cached ones stay read-only
        if self.flop_aware:  # a hit on this checkpoint skips the whole prefix; it holds G slots of k pages
            v = self.flops(hb * self.B_h) / (self.G * self.k * self.cfg.page_bytes)
            for sid in ck.slots:
                self.pool.value[self.slot_pages[sid][0]] = v
        self.ckpt_index[key] = ck
        self.stats.checkpoints_written += 1
        self._step_writes.append(ck)
        if not kept:
            rs.transient = ck

    def grow_decode(self, rs: ReqState, tokens: int) -> None:
        """Advance decode by `tokens`; KV pages for generated tokens come from the request's reservation."""
        rs.generated += tokens
        want = min(-(-(rs.L + rs.generated) // self.B_p), rs.total_blocks)
        pool = self.pool
        while len(rs.blocks) < want:
            rs.blocks.append(pool.allocate(MLA))
            rs.reserve_left -= 1
            pool.reserved -= 1

    def end_step(self, steps: int = 1) -> None:
        """The step's copies and forward have landed: release copy sources, hand kept checkpoints to the LRU,
        recycle superseded intermediates."""
        pool = self.pool
        for kind, x in self._step_unpins:
            if kind == 0:
                pool.decref(x, x in self.page_keys)
            elif x in self.slot_pages:
                self._slot_decref(x)
        self._step_unpins.clear()
        for ck in self._step_writes:
            if ck.kept:
                for sid in ck.slots:
                    if sid >= 0:
                        self._slot_decref(sid)
        self._step_writes.clear()
        for ck in self._recycle:
            self._release_transient(ck)
        self._recycle.clear()
        self.step += steps

    def _release_transient(self, ck: Ckpt) -> None:
        self.stats.checkpoints_recycled += 1
        self._drop_ckpt(ck)
        for sid in ck.slots:
            if sid >= 0 and sid in self.slot_pages:
                self._slot_decref(sid)

    def release(self, rs: ReqState) -> None:
        """Request completed: unpin its pages (tail first, so tails are evicted first), free private state."""
        pool, pk = self.pool, self.page_keys
        for p in reversed(rs.blocks):
            pool.decref(p, p in pk)
        rs.blocks = []
        for sid in rs.state_slots:
            self._slot_decref(sid)
        rs.state_slots = []
        if rs.transient is not None:
            if rs.transient in self._step_writes:
                self._recycle.append(rs.transient)
            else:
                self._release_transient(rs.transient)
            rs.transient = None
        pool.reserved -= rs.reserve_left
        rs.reserve_left = 0

    # ---------------------------------------------------------------- invariants
    def check(self) -> None:
        pool = self.pool
        pool.check()
        for key, p in self.mla_index.items():
            assert pool.kind[p] == MLA, f"index key on a non-MLA page {p}"
            assert key in self.page_keys.get(p, ()), "index key missing from its page"
        for p, keys in self.page_keys.items():
            assert keys and pool.kind[p] == MLA, f"page {p} has keys but is not an MLA page"
        for key, ck in self.ckpt_index.items():
            assert ck.cached and ck.key == key
            if self.cfg.invalidate_siblings:
                assert all(s >= 0 for s in ck.slots), "indexed checkpoint with a missing group"
            for s in ck.slots:
                if s >= 0:
                    assert all(pool.kind[p] == KDA for p in self.slot_pages[s])
        assert self.ckpt_pages == sum(
            len(self.slot_pages[s]) for s, c in self.slot_ckpt.items() if c is not None
        ), "checkpoint page count drifted"
        for p in pool.empty:
            assert p not in self.page_keys and p not in self.page_slot, f"empty page {p} still holds content"
        for c, par in self.mla_parent.items():  # flop-aware chain links join registered MLA pages both ways
            assert c in self.page_keys and par in self.page_keys and c in self.mla_children[par], "stale chain link"
        assert sum(map(len, self.mla_children.values())) == len(self.mla_parent), "chain links not symmetric"
        for sid, pages in self.slot_pages.items():
            assert self.page_slot[pages[0]] == sid and (len(pages) == 1 or pool.unit[pages[0]] is pages)
