"""The hybrid prefix cache: chained-hash index over attention-KV pages, recurrent-state checkpoints in
per-group slots, the two-level lookup, the checkpoint policy of each engine, and the three consistency rules.

Vocabulary: positions are counted in hash blocks (`hb`) of `B_h` tokens; a physical block (one page) holds
`r = B_p / B_h` hash blocks. Key j = chained hash of hash blocks 0..j, so finding key j proves the whole prefix
of (j+1)*B_h tokens. A checkpoint sits at a token position `tok` (a hash boundary for the K3 design and vLLM,
anywhere for SGLang's chunk ends and TensorRT-LLM's intervals) and is indexed under the key of the hash block
that holds it: a request whose match covers that block can restore it, and its hit is `tok` (the nearest
restorable position below the match; the rest is prefilled again). Placement per policy: `config.MECHANISM`.
Names keep the KDA+MLA vocabulary (`MLA` pages hold every attention kind's KV, `KDA` pages every recurrent
kind's state). Everything here is plain dicts, lists and ints: it is the replay's hot path.

Offload tiers (`offload.py`, config `host_capacity_bytes` / `ssd_capacity_bytes`): what the pool evicts moves
down to host memory (then SSD); a lookup walks every tier, and a hit that needs a lower tier restores it before
the request's prefill may start (`ReqState.ready_s`, from `clock`, which the serving loop sets to its simpy
clock). Without a tier every path below is the GPU-only one, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3sim.prefix_cache.config import LEGACY_POLICIES, CacheConfig
from k3sim.prefix_cache.flops import PrefillFlops
from k3sim.prefix_cache.offload import OffloadStore
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
    checkpoints_donated: int = 0  # finished requests' states kept cached (SGLang), never matched in a trace
    checkpoint_pages_peak: int = 0  # pages of the pool states come from
    # failures the consistency rules prevent (stay 0 with the rules on)
    evicted_hits: int = 0  # rule 1: a hit page reused by the request's own allocation
    stale_reads: int = 0  # rule 2: a hit on bytes that had not landed yet
    fenced_lookups: int = 0  # lookups that stopped at bytes still in flight (rule 2 doing its job)
    partial_restores: int = 0  # rule 3: a checkpoint restored with a group missing
    # offload tiers: hit tokens beyond what a GPU-only (then GPU + host) lookup finds at admission
    lower_hit_tokens: list = field(default_factory=lambda: [0, 0])  # host, ssd
    restores: int = 0  # admissions that waited for a restore from a lower tier (or for one still landing)
    restore_wait_s: float = 0.0  # their waits summed (link queue included)


class Ckpt:
    """One state checkpoint at token `tok`: a read-only slot per state group (-1 once that group's slot is gone).
    `key` None: not indexed (a position the trace cannot prove shared, or a finished request's donated state)."""

    __slots__ = ("key", "slots", "ready", "kept", "cached", "tok", "held", "tier")

    def __init__(self, key: int | None, ready: int, kept: bool, tok: int = 0):
        self.key = key
        self.slots: list[int] = []
        self.ready = ready  # first step whose lookups may read it (it is written by the forward of ready-1)
        self.kept = kept  # turn boundary or junction: released to the LRU; else transient, recycled when superseded
        self.cached = True
        self.tok = tok
        self.held = False  # pinned by its request until superseded (vLLM align mode), then released to the LRU
        self.tier = 0  # 0: in the GPU pool; 1 + offload level: a copy below it (`offload.OffloadStore`)


class ReqState:
    """A request's private view: its block table, private KDA state, progress, and what it pins."""

    __slots__ = ("keys", "L", "O", "blocks", "state_slots", "computed", "hit_hb", "reg_hb", "turn_hb",
                 "junction_tok", "transient", "reserve_left", "generated", "total_blocks", "arrival_s",
                 "hit_tokens", "held", "ready_s")

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
        self.hit_tokens = 0
        self.held: Ckpt | None = None
        self.ready_s = 0.0  # a restore from a lower tier lands then: no prefill before (0: nothing to wait for)


WAIT, REJECT = "wait", "reject"
_CLOCK_EPS_S = 1e-9  # a simpy timeout to a restore's landing may end a rounding step short of it


def _no_clock() -> float:
    """A cache outside a serving loop: time stands still (a restore's wait is then never over: set `clock`)."""
    return 0.0


class HybridPrefixCache:
    def __init__(self, cfg: CacheConfig):
        self.cfg = cfg
        self.B_h = cfg.effective_hash_block_tokens
        self.B_p = cfg.physical_block_tokens
        self.r = self.B_p // self.B_h
        self.G = cfg.groups
        self.k = cfg.pages_per_group_state
        self.mech = cfg.mechanism
        self.coarse = self.mech == "boundary"
        self.reuse = cfg.reuses
        self.private = cfg.private_state_slots
        self.N, self.C = cfg.snapshot_interval_tokens, cfg.track_tokens
        self.retain = cfg.retention_interval_tokens if self.G else 0
        self.pool = BlockPool(cfg.num_pages)
        self.pool.on_evict = self._on_evict
        # states come from the same pool, or from one of their own (SGLang's mamba pool: a slot per state); an
        # unbounded pool evicts nothing, so an engine policy's many-page states (a TensorRT-LLM snapshot of K3 is
        # 32 pages) are kept as one page of k pages' bytes there: the same bytes, k times fewer pages to move
        self.state_page_bytes = cfg.state_page_bytes
        if cfg.split_pools:
            self.spool = BlockPool(cfg.num_state_pages)
        elif cfg.capacity_bytes is None and self.k > 1 and cfg.policy not in LEGACY_POLICIES:
            self.spool = BlockPool(None)
            self.state_page_bytes = self.k * cfg.page_bytes
            self.k = 1
        else:
            self.spool = self.pool
        if self.spool is not self.pool:
            self.spool.on_evict = self._on_evict_state
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
            if self.spool is not self.pool:  # a state pool of its own: its checkpoints weighed the same way
                self.spool.victim_window, self.spool.alpha = cfg.eviction_window, cfg.eviction_alpha
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
        self.offload = OffloadStore.from_config(cfg)  # None: no tier under the pool
        self.clock = _no_clock  # seconds now; the serving loop sets its simpy clock (restores are timed)
        self.link_free_s = 0.0  # the host link finishes its queued restores then
        self.landing: dict[int, float] = {}  # GPU page restored from a tier -> when its bytes land

    # ---------------------------------------------------------------- slots
    def _alloc_slot(self, ckpt: Ckpt | None, copies: int = 1) -> int:
        """A state slot of k pages (`copies` x k: several snapshots sharing one allocation, `_place`)."""
        sid = self._next_slot
        self._next_slot += 1
        n = self.k * copies
        pages = self.spool.allocate_n(KDA, n)
        self.slot_pages[sid] = pages
        self.slot_ckpt[sid] = ckpt
        self.page_slot[pages[0]] = sid  # only a unit's first page can be evicted
        if ckpt is not None:
            self.ckpt_pages += n
            if self.ckpt_pages > self.stats.checkpoint_pages_peak:
                self.stats.checkpoint_pages_peak = self.ckpt_pages
        return sid

    def _forget_slot(self, sid: int) -> None:
        pages = self.slot_pages.pop(sid)
        del self.page_slot[pages[0]]
        if self.slot_ckpt.pop(sid) is not None:
            self.ckpt_pages -= len(pages)

    def _slot_incref(self, sid: int) -> None:
        self.spool.incref_n(self.slot_pages[sid])

    def _slot_decref(self, sid: int) -> None:
        pages = self.slot_pages[sid]
        ck = self.slot_ckpt[sid]
        cached = ck is not None and ck.cached
        self.spool.decref_n(pages, cached)
        if not cached and self.spool.refcount[pages[0]] == 0:
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
                if self.spool.refcount[pages[0]] == 0:
                    self.spool.uncache_n(pages)
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
            keys = self.page_keys.pop(page, ())
            if self.offload is not None and keys:  # written back to the top tier (HiCache write_back)
                self.landing.pop(page, None)
                self.offload.demote_kv([k for k in keys if self.mla_index.get(k) == page], self.cfg.page_bytes)
            for key in keys:
                if self.mla_index.get(key) == page:
                    del self.mla_index[key]
                    del self.mla_ready[key]
            return
        self._on_evict_state(page)

    def _on_evict_state(self, page: int) -> None:
        """A state page (the first of a slot's unit) was evicted: its checkpoint loses that group."""
        sid = self.page_slot[page]
        ck = self.slot_ckpt[sid]
        self._forget_slot(sid)  # the pool already moved the slot's other pages to the empty end
        if ck is None:  # private state is never in the LRU
            raise AssertionError("private KDA state evicted")
        self.stats.checkpoints_evicted += 1
        ck.slots[ck.slots.index(sid)] = -1
        if self.cfg.invalidate_siblings or all(s < 0 for s in ck.slots):  # rule 3
            if self.offload is not None and ck.key is not None and self.ckpt_index.get(ck.key) is ck:
                self.offload.demote_ckpt(ck, self.cfg.kda_state_bytes_per_request)  # every group, as one entry
            self._drop_ckpt(ck)

    # ---------------------------------------------------------------- lookup
    def lookup(self, keys: list[int], L: int) -> tuple[int, int, list[int], int, Ckpt | None, bool]:
        """`match` with the hit in hash blocks (rounded down: exact for checkpoints on hash boundaries)."""
        hit, mla_end, pages, src, ck, stale = self.match(keys, L)
        return hit // self.B_h, mla_end, pages, src, ck, stale

    def match(self, keys: list[int], L: int) -> tuple[int, int, list[int], int, Ckpt | None, bool]:
        """Two-level lookup -> (hit tokens, mla_end_hb, whole-block pages, partial source page, checkpoint, stale).

        MLA: whole physical blocks by chained hash, then the hash endpoints inside the first missing block.
        KDA: the deepest checkpoint indexed within the MLA match (one index probe per hash block: rule 3 keeps
        an indexed checkpoint present in every group); the hit is its token position. At least one prompt token
        is always recomputed (logits). With offload tiers every tier is searched (`_match_tiers`: a page there is
        ~entry id in `pages` / `src`, a checkpoint there has `tier` > 0).
        """
        if self.offload is not None:
            return self._match_tiers(keys, L, len(self.offload.levels))
        return self._match_gpu(keys, L)

    def _match_gpu(self, keys: list[int], L: int, count: bool = True):
        """`match` over the GPU pool alone; `count` False: a probe for the tier split, not a lookup."""
        B_h, r = self.B_h, self.r
        cap = min((L - 1) // B_h, len(keys))  # fewer keys: blocks the trace cannot prove (keys.block_keys)
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
                    hit = c.tok
                    ck = c
                    break
        else:
            hit = mla_end * B_h
        if count:
            self.stats.lookups += 1
            self.stats.lookup_probes += probes
            if fenced:
                self.stats.fenced_lookups += 1
        B_p = self.B_p
        m = hit // B_p
        if hit % B_p:
            src = pages[m] if m < k else src
        else:
            src = -1
        return hit, mla_end, pages[:m], src, ck, hit > (unready_hb - 1) * B_h

    def _match_tiers(self, keys: list[int], L: int, nlev: int, count: bool = True):
        """`match` over the GPU pool and the top `nlev` offload levels: where the GPU index misses a key, a tier
        holding it continues the match (a page there is ~entry id; its bytes have landed, so no fence); a
        checkpoint is the deeper of the GPU's and the tiers' at each key (the GPU's on a tie)."""
        B_h, r = self.B_h, self.r
        cap = min((L - 1) // B_h, len(keys))
        idx, ready, step = self.mla_index, self.mla_ready, self.step
        store = self.offload
        okv, ock = (store.kv, store.ck) if nlev else ({}, {})
        fence = self.cfg.fence_unlanded
        probes = 0
        unready_hb = 1 << 62
        fenced = False
        pages: list[int] = []
        nb = cap // r
        k = 0
        while k < nb:
            key = keys[(k + 1) * r - 1]
            probes += 1
            p = idx.get(key)
            if p is None:
                e = okv.get(key)
                if e is None or e.level >= nlev:
                    break
                p = ~e.eid
            elif ready[key] > step:
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
                if p is None:
                    e = okv.get(key)
                    if e is None or e.level >= nlev:
                        continue
                    p = ~e.eid
                elif ready[key] > step:
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
                if c is not None and c.ready > step:
                    if fence:
                        fenced = True
                        c = None
                    else:
                        unready_hb = min(unready_hb, j + 1)
                e = ock.get(keys[j])
                if e is not None and e.level < nlev and (c is None or e.ck.tok > c.tok):
                    c = e.ck
                    c.tier = e.level + 1
                if c is not None:
                    hit = c.tok
                    ck = c
                    break
        else:
            hit = mla_end * B_h
        if count:
            self.stats.lookups += 1
            self.stats.lookup_probes += probes
            if fenced:
                self.stats.fenced_lookups += 1
        B_p = self.B_p
        m = hit // B_p
        if hit % B_p:
            src = pages[m] if m < k else src
        else:
            src = -1
        return hit, mla_end, pages[:m], src, ck, hit > (unready_hb - 1) * B_h

    # ---------------------------------------------------------------- admission
    def admit(self, keys: list[int], L: int, O: int, arrival_s: float = 0.0) -> ReqState | str:
        """Look up, pin the hit, reserve every page the request will need, allocate its private state.

        Returns the request's state, WAIT (not enough free pages now) or REJECT (larger than the pool)."""
        cfg, pool, G, k = self.cfg, self.pool, self.G, self.k
        if self.reuse:
            hit, mla_end, hit_pages, src, ck, stale = self.match(keys, L)
        else:  # `none`: nothing is looked up
            hit, mla_end, hit_pages, src, ck, stale = 0, 0, [], -1, None, False
        total_blocks = -(-(L + O) // self.B_p)
        lower = self.offload is not None and self._uses_lower(hit_pages, src, ck)
        gpu_pages = [p for p in hit_pages if p >= 0] if lower else hit_pages  # restored pages are allocated
        shared = len(gpu_pages)
        n_private = G * self.private
        pin_pages = list(gpu_pages)
        if src >= 0:
            pin_pages.append(src)
        ck_slots = [s for s in ck.slots if s >= 0] if ck is not None else []
        units = [self.slot_pages[s] for s in ck_slots]
        verdict = self._room(total_blocks - shared, pin_pages, n_private * k, units)
        if verdict is not None:
            return verdict
        if lower:
            split = self._tier_split(keys, L, hit, hit_pages, src, ck)
            taken, held = self._take_lower(hit_pages, src, ck)  # before any allocation can evict into the tiers
        rs = ReqState(keys, L, O, arrival_s)
        rs.total_blocks = total_blocks
        gens = [pool.generation[p] for p in pin_pages] + [self.spool.generation[u[0]] for u in units]
        if cfg.pin_before_allocate:  # rule 1: pin the hit in all groups before any allocation
            self._pin(rs, gpu_pages, src, ck_slots)
        rs.state_slots = [self._alloc_slot(None) for _ in range(n_private)]  # private running state (copy target)
        partial = hit % self.B_p != 0
        if partial:
            rs.blocks.append(pool.allocate(MLA))  # private copy of the shared half-block (copy-on-write)
        if not cfg.pin_before_allocate:
            ck_slots = [s for s in ck_slots if s in self.slot_pages]
            self._pin(rs, gpu_pages, src, ck_slots)
        if self.offload is not None:
            self._schedule_restore(rs, keys, hit_pages, pin_pages, (taken, held, split) if lower else None, src, ck,
                                   hit)
        now = [pool.generation[p] for p in pin_pages] + [self.spool.generation[u[0]] for u in units]
        if now != gens or (ck is not None and len(ck_slots) < sum(1 for s in ck.slots if s >= 0)):
            self.stats.evicted_hits += 1
        if ck is not None and (not ck.cached or any(s < 0 for s in ck.slots)):
            self.stats.partial_restores += 1
        if stale:
            self.stats.stale_reads += 1
        rs.blocks = hit_pages + rs.blocks  # block table: shared whole blocks, then the private partial copy
        rs.reserve_left = total_blocks - len(rs.blocks)
        pool.reserved += rs.reserve_left
        rs.computed = rs.hit_tokens = hit
        rs.hit_hb = rs.reg_hb = hit // self.B_h
        rs.turn_hb = L // self.B_h
        if cfg.junction_checkpoints and G and not self.coarse and mla_end * self.B_h > hit:
            rs.junction_tok = mla_end * self.B_h
        st = self.stats
        st.requests_admitted += 1
        st.hit_tokens += hit
        st.prefill_flop_requested += self.flops(L)
        if hit:
            st.prefill_flop_saved += self.flops(hit)
        st.mla_match_tokens += mla_end * self.B_h
        if hit:
            st.requests_with_hit += 1
        return rs

    # ---------------------------------------------------------------- offload tiers
    @staticmethod
    def _uses_lower(hit_pages: list[int], src: int, ck: Ckpt | None) -> bool:
        """The hit needs something from an offload tier (a page marked ~entry id, or a checkpoint there)."""
        return src < -1 or (ck is not None and ck.tier > 0) or any(p < -1 for p in hit_pages)

    def _tier_split(self, keys: list[int], L: int, hit: int, hit_pages: list[int], src: int,
                    ck: Ckpt | None) -> tuple[int, int]:
        """(host, ssd) tokens of a hit that needs a lower tier: the hit beyond what a lookup of the GPU pool alone
        finds now, and beyond what GPU + host finds (the SSD's share; 0 without an SSD tier)."""
        store = self.offload
        deepest = max([store.entries[~p].level for p in hit_pages if p < -1]
                      + ([store.entries[~src].level] if src < -1 else []) + ([ck.tier - 1] if ck and ck.tier else []))
        gpu = min(hit, self._match_gpu(keys, L, False)[0])
        if deepest == 0:
            return hit - gpu, 0
        host = min(hit, max(gpu, self._match_tiers(keys, L, 1, False)[0]))
        return host - gpu, hit - host

    def _take_lower(self, hit_pages: list[int], src: int, ck: Ckpt | None):
        """The tiers' rule 1: before any allocation (which evicts into the tiers), the pages to restore leave their
        tier (they become GPU pages) and the entries a restore copies from (a partial page into the private copy,
        a checkpoint into the private state) are held out of their LRU."""
        store = self.offload
        taken = [store.entries[~p] for p in hit_pages if p < -1]
        for e in taken:
            store.take(e)
        held = []
        if src < -1:
            held.append(store.entries[~src])
        if ck is not None and ck.tier:
            held.append(store.ck[ck.key])
        for e in held:
            store.hold(e)
        return taken, held

    def _schedule_restore(self, rs: ReqState, keys: list[int], hit_pages: list[int], pin_pages: list[int], lower,
                          src: int, ck: Ckpt | None, hit: int) -> None:
        """Restore what the hit needs from the tiers (`lower`: (taken, held, split), None when nothing) into GPU
        pages, queue its bytes on the host link, and set `rs.ready_s` to when they, and any page of the hit that
        another request's restore is still bringing in, have landed."""
        now = self.clock()
        end = self._restore(keys, hit_pages, *lower[:2], src, ck, hit, now) if lower else 0.0
        landing = self.landing
        for p in pin_pages:
            t = landing.get(p)
            if t is not None:
                if t <= now:
                    del landing[p]
                elif t > end:
                    end = t
        st = self.stats
        if lower:
            st.lower_hit_tokens[0] += lower[2][0]
            st.lower_hit_tokens[1] += lower[2][1]
            for lvl, n in zip(self.offload.levels, lower[2]):
                lvl.hit_tokens += n
        if end > now:
            rs.ready_s = end
            st.restores += 1
            st.restore_wait_s += end - now

    def _restore(self, keys: list[int], hit_pages: list[int], taken: list, held: list, src: int, ck: Ckpt | None,
                 hit: int, now: float) -> float:
        """Each taken page gets a GPU page in its place of the block table, indexed for lookups from the next step
        (its bytes land with the restore: `landing`); the bytes of the pages, of a partial page's hit tokens and
        of a checkpoint go over the host link after the restores queued before. Returns when they have landed."""
        store, pool, cfg = self.offload, self.pool, self.cfg
        idx, ready, pk, nxt = self.mla_index, self.mla_ready, self.page_keys, self.step + 1
        moved = [[0, 0] for _ in store.levels]  # (entries, bytes) per level
        new = []
        it = iter(taken)
        for i, p in enumerate(hit_pages):
            if p >= -1:
                continue
            e = next(it)
            q = pool.allocate(MLA)
            hit_pages[i] = q
            new.append(q)
            on = [key for key in e.keys if key not in idx]
            for key in on:
                idx[key] = q
                ready[key] = nxt
            if on:
                pk[q] = on
                if self.flop_aware:
                    self._link_restored(q, i, keys)
            moved[e.level][0] += 1
            moved[e.level][1] += e.nbytes
        for e in held:
            moved[e.level][0] += 1
            moved[e.level][1] += ((hit % self.B_p) * cfg.mla_kv_bytes_per_token if e.kind == 0 else e.nbytes)
            store.release(e)
        t = 0.0
        for lvl, (n, b) in zip(store.levels, moved):
            if n:
                lvl.restored_entries += n
                lvl.restored_bytes += b
                lvl.restore_s += b / lvl.bandwidth
                t += b / lvl.bandwidth
        end = max(now, self.link_free_s) + t
        self.link_free_s = end
        for q in new:
            self.landing[q] = end
        return end

    def _link_restored(self, q: int, b: int, keys: list[int]) -> None:
        """flop-aware eviction: a restored page's value and chain link, as `schedule_prefill` gives a new one."""
        B_p, pool = self.B_p, self.pool
        pool.value[q] = self.flops.span(b * B_p, (b + 1) * B_p) / self.cfg.page_bytes
        par = self.mla_index.get(keys[b * self.r - 1], -1) if b else -1
        if par >= 0 and par != q and par in self.page_keys:
            self.mla_parent[q] = par
            self.mla_children.setdefault(par, set()).add(q)

    def _room(self, kv_need: int, kv_pins: list[int], state_need: int, units: list[list[int]]) -> str | None:
        """REJECT if the request could not fit even an otherwise empty pool, WAIT if not now, else None.
        `*_need`: pages to allocate; `kv_pins` / `units`: cached KV pages and state slots the hit pins (those
        now free count against the room; a slot's count is its first page's)."""
        pool, spool = self.pool, self.spool
        rc = pool.refcount
        kv_free = len({q for q in kv_pins if rc[q] == 0})
        src = spool.refcount
        n_state = sum(len(u) for u in units)
        state_free = sum(len(u) for u in units if src[u[0]] == 0)
        if spool is pool:
            checks = ((pool, kv_need + state_need, len(kv_pins) + n_state, kv_free + state_free),)
        else:
            checks = ((pool, kv_need, len(kv_pins), kv_free), (spool, state_need, n_state, state_free))
        for p, need, pinned, _ in checks:
            if p.capacity is not None and need + pinned > p.capacity:
                return REJECT  # could not fit even in an otherwise empty pool
        for p, need, _, from_free in checks:
            if need + from_free > p.available():
                return WAIT
        return None

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
        if rs.ready_s:  # a restore from an offload tier has not landed: the request waits (vLLM's async load)
            if rs.ready_s > self.clock() + _CLOCK_EPS_S:
                return 0
            rs.ready_s = 0.0
        e = min(L, s + budget)
        J, I, mech = rs.junction_tok, self.retain, self.mech
        if mech == "decoupled":
            if s < J < e:
                e = J  # end the chunk at the junction so its checkpoint lands there (vLLM align-mode style)
            if I:
                nxt = (s // I + 1) * I
                if nxt < e:
                    e = nxt
        elif mech == "step-end":
            e = self._aligned_end(s, e, L)
            if e <= s:
                return 0  # no whole block fits this step's budget: the request waits (vLLM align mode)
        B_h, B_p, pool = self.B_h, self.B_p, self.pool
        need_blocks = -(-e // B_p)
        blocks = rs.blocks
        while len(blocks) < need_blocks:
            blocks.append(pool.allocate(MLA))
            rs.reserve_left -= 1
            pool.reserved -= 1
        hb_end = e // B_h
        if hb_end > rs.reg_hb and self.reuse:
            idx, ready, pk, keys, r = self.mla_index, self.mla_ready, self.page_keys, rs.keys, self.r
            nxt = self.step + 1
            okv = self.offload.kv if self.offload is not None else None
            for j in range(rs.reg_hb, min(hb_end, len(keys))):
                key = keys[j]
                if key not in idx:
                    if okv is not None and key in okv:  # recomputed: the tier's copy is not needed (exclusive)
                        self.offload.forget_kv_key(key)
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
        if self.G and self.reuse:
            if mech == "decoupled":
                if hb_end * B_h > s and hb_end > 0:  # the last hash-aligned position of this forward
                    if rs.transient is not None:
                        self._recycle.append(rs.transient)  # superseded by progress
                        rs.transient = None
                    kept = hb_end == rs.turn_hb or hb_end * B_h == J or (I > 0 and hb_end * B_h % I == 0)
                    self._write_ckpt(rs, hb_end * B_h, kept)
            else:
                self._place(rs, s, e)
        rs.computed = e
        return e - s

    def _aligned_end(self, s: int, e: int, L: int) -> int:
        """vLLM align mode's chunk end (scheduler `_mamba_block_aligned_split`, PR #30877): before the prompt's
        last block boundary a chunk is a whole number of blocks; the chunk crossing it stops there."""
        B = self.B_p
        last = L - L % B
        if e < last:
            return s + (e - s) // B * B
        if s < last < e:
            return last
        return e

    def _place(self, rs: ReqState, s: int, e: int) -> None:
        """The checkpoints a forward over [s, e) leaves, per engine mechanism (`config.MECHANISM`)."""
        mech, B_p = self.mech, self.B_p
        if mech == "boundary":  # every physical block boundary crossed, all kept (vLLM 'all', coarse)
            for b in range(s // B_p + 1, e // B_p + 1):
                self._write_ckpt(rs, b * B_p, kept=True)
        elif mech == "step-end":  # the step's end when it is a block boundary (vLLM 'align')
            if e % B_p == 0:
                self._write_ckpt(rs, e, kept=True, hold=True)
        elif mech == "chunk-end":  # every forward's end, the prompt's end included (SGLang no_buffer)
            self._write_ckpt(rs, e, kept=True)
        elif mech == "tracked":  # SGLang extra_buffer: the branch point, else the deepest 64-token position inside
            J, C = rs.junction_tok, self.C
            if s < J <= e:
                self._write_ckpt(rs, J, kept=True)
            elif e - s > C:
                self._write_ckpt(rs, s + (e - s - 1) // C * C, kept=True)
        elif mech == "periodic":  # every multiple of the interval (TensorRT-LLM periodic_snapshot_interval)
            # snapshots of one forward inside one hash block share an allocation: a lookup can only prove the
            # block, so the deepest one is the one restored; the others hold memory with it
            N, B_h = self.N, self.B_h
            t = (s // N + 1) * N
            while t <= e:
                end = min(e, -(-t // B_h) * B_h)  # the end of the hash block holding t
                last = end // N * N
                self._write_ckpt(rs, last, kept=True, copies=(last - t) // N + 1)
                t = last + N

    def _write_ckpt(self, rs: ReqState, tok: int, kept: bool, hold: bool = False, copies: int = 1) -> None:
        """A checkpoint of the request's state at token `tok`, indexed under the key of the hash block holding
        it (none when that block is the prompt's partial last one: such a checkpoint costs memory but no lookup
        can prove a later prompt shares it). One per key: a deeper one in the same block takes the index."""
        j = -(-tok // self.B_h) - 1
        key = rs.keys[j] if j < len(rs.keys) else None
        old = self.ckpt_index.get(key) if key is not None else None
        if old is not None:
            if old.tok >= tok:
                return  # someone else already persisted this boundary
            del self.ckpt_index[key]  # superseded for lookups; it stays cached until evicted
        if self.spool.available() < self.G * self.k * copies:
            self.stats.checkpoints_skipped += copies
            if old is not None:
                self.ckpt_index[key] = old
            return
        ck = Ckpt(key, self.step + 1, kept, tok)
        ck.slots = [self._alloc_slot(ck, copies) for _ in range(self.G)]  # new slots: cached ones stay read-only
        if self.flop_aware:  # a hit on this checkpoint skips the whole prefix; it holds G slots of k pages
            v = self.flops(tok) / (self.G * self.k * copies * self.state_page_bytes)
            for sid in ck.slots:
                self.spool.value[self.slot_pages[sid][0]] = v
        if key is not None:
            self.ckpt_index[key] = ck
            if self.offload is not None:
                self.offload.forget_ckpt(key, tok)
        self.stats.checkpoints_written += copies
        self._step_writes.append(ck)
        if hold:  # pinned by the request until its next aligned state (vLLM align: running + latest aligned)
            self._unhold(rs)
            ck.held = True
            rs.held = ck
        if not kept:
            rs.transient = ck

    def _unhold(self, rs: ReqState) -> None:
        """Release a request's held checkpoint to the LRU (still cached), once its write has landed."""
        ck = rs.held
        if ck is None:
            return
        rs.held = None
        ck.held = False
        if ck not in self._step_writes:  # else end_step releases it with the step's other kept writes
            for sid in ck.slots:
                if sid >= 0 and sid in self.slot_pages:
                    self._slot_decref(sid)

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
            if ck.kept and not ck.held:
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
        self._unhold(rs)
        slots = rs.state_slots
        if self.cfg.donate_final_state and self.G and self.reuse:
            self._donate(rs, slots[:self.G])
            slots = slots[self.G:]
        for sid in slots:
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

    def _donate(self, rs: ReqState, slots: list[int]) -> None:
        """SGLang keeps a finished request's state in its radix tree (cache_finished_req): the slots become a
        cached checkpoint at the request's end, which no trace lookup can prove shared (the trace names no
        output tokens): it holds memory and is evicted in LRU order like any other."""
        ck = Ckpt(None, self.step + 1, True, rs.L + rs.generated)
        ck.slots = slots
        for sid in slots:
            self.slot_ckpt[sid] = ck
            self.ckpt_pages += len(self.slot_pages[sid])
        if self.ckpt_pages > self.stats.checkpoint_pages_peak:
            self.stats.checkpoint_pages_peak = self.ckpt_pages
        self.stats.checkpoints_donated += 1
        for sid in slots:
            self._slot_decref(sid)

    # ---------------------------------------------------------------- invariants
    def check(self) -> None:
        pool, spool = self.pool, self.spool
        pool.check()
        if spool is not pool:
            spool.check()
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
                    assert spool.kind[self.slot_pages[s][0]] == KDA  # a unit's kind is its first page's
        assert self.ckpt_pages == sum(
            len(self.slot_pages[s]) for s, c in self.slot_ckpt.items() if c is not None
        ), "checkpoint page count drifted"
        for p in pool.empty:
            assert p not in self.page_keys, f"empty page {p} still holds content"
        for p in spool.empty:
            assert p not in self.page_slot, f"empty state page {p} still holds content"
        for c, par in self.mla_parent.items():  # flop-aware chain links join registered MLA pages both ways
            assert c in self.page_keys and par in self.page_keys and c in self.mla_children[par], "stale chain link"
        assert sum(map(len, self.mla_children.values())) == len(self.mla_parent), "chain links not symmetric"
        for sid, pages in self.slot_pages.items():
            assert self.page_slot[pages[0]] == sid and (len(pages) == 1 or spool.unit[pages[0]] is pages)
        if self.offload is not None:
            self.offload.check()
            assert not (self.offload.kv.keys() & self.mla_index.keys()), "a KV key indexed in two tiers"
