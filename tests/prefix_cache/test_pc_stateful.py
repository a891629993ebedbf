"""Hypothesis stateful test: random admissions, chunked prefill, steps, decode and completions on a small pool.

Invariants after every rule: refcounts >= 0, no page both free and referenced, page conservation, index
consistency (cache.check), and pinned pages are never evicted (a request's shared pages keep their generation).
"""

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from k3sim.prefix_cache.cache import HybridPrefixCache, ReqState
from helpers_pc import tiny_config


def chain(bits: list[int]) -> list[int]:
    """Chained keys of a path in a binary prefix tree: key j names bits[0..j]."""
    out, acc = [], 1
    for b in bits:
        acc = acc * 2 + b
        out.append(acc)
    return out


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(["decoupled", "coarse", "full-attention"]),
        groups=st.integers(1, 3),
        pages=st.one_of(st.none(), st.integers(8, 40)),
        r=st.sampled_from([1, 2, 4]),
        retention=st.sampled_from([0, 4]),
        junction=st.booleans(),
        flop_aware=st.booleans(),
    )
    def setup(self, policy, groups, pages, r, retention, junction, flop_aware):
        ev = dict(eviction="flop-aware", eviction_window=4, prefill_flop_linear=10.0, prefill_flop_pair=1.0) \
            if flop_aware else {}
        self.cache = HybridPrefixCache(tiny_config(policy, hash_block=2, physical_block=2 * r, groups=groups,
                                                   pages=pages, retention_interval_tokens=retention,
                                                   junction_checkpoints=junction, **ev))
        self.running: list[tuple[ReqState, list[tuple[int, int]]]] = []

    @rule(bits=st.lists(st.integers(0, 1), max_size=10), extra=st.integers(0, 1), out=st.integers(0, 5))
    def admit(self, bits, extra, out):
        L = 2 * len(bits) + extra
        if L == 0:
            return
        rs = self.cache.admit(chain(bits), L, out)
        if isinstance(rs, ReqState):
            shared = rs.blocks[: rs.hit_hb // self.cache.r]
            self.running.append((rs, [(p, self.cache.pool.generation[p]) for p in shared]))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 50), budget=st.integers(1, 12))
    def prefill(self, i, budget):
        rs, _ = self.running[i % len(self.running)]
        self.cache.schedule_prefill(rs, budget)

    @rule()
    def step(self):
        self.cache.end_step()

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 50), n=st.integers(1, 3))
    def decode_or_finish(self, i, n):
        k = i % len(self.running)
        rs, _ = self.running[k]
        if rs.computed < rs.L:
            return
        self.cache.grow_decode(rs, n)
        if rs.generated >= rs.O:
            self.cache.release(rs)
            self.running.pop(k)

    @invariant()
    def consistent(self):
        if hasattr(self, "cache"):
            self.cache.check()
            s = self.cache.stats
            assert (s.evicted_hits, s.stale_reads, s.partial_restores) == (0, 0, 0)

    @invariant()
    def pinned_never_evicted(self):
        for rs, pins in getattr(self, "running", []):
            for p, gen in pins:
                assert self.cache.pool.generation[p] == gen, "a pinned page was reallocated"
                assert self.cache.pool.refcount[p] > 0


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)
