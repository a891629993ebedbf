"""Hypothesis stateful test: random admissions, chunked prefill, steps, decode and completions on a small pool.

Invariants after every rule: refcounts >= 0, no page both free and referenced, page conservation, index
consistency (cache.check), and pinned pages are never evicted (a request's shared pages keep their generation).
Leaks: the `drain` rule (and every run's end) completes all requests and lands the step; then no page may be
referenced and no page reserved. Rule 2 (the fence on unlanded bytes) runs on and off under every policy,
full-attention included, and reads of unlanded bytes must be zero exactly when it is on.

Mutation check (issue 12): removing any one of the five reference-count decrements (a finished request's
blocks, its private state slots, the copy-source unpin in end_step, the kept- and transient-checkpoint
decrements) fails `drained_leaves_nothing_referenced`; removing the MLA-level fence fails
`test_pc_fence.py` (see the issue 12 note for the commands).
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
        fence=st.booleans(),
    )
    def setup(self, policy, groups, pages, r, retention, junction, flop_aware, fence):
        ev = dict(eviction="flop-aware", eviction_window=4, prefill_flop_linear=10.0, prefill_flop_pair=1.0) \
            if flop_aware else {}
        self.cache = HybridPrefixCache(tiny_config(policy, hash_block=2, physical_block=2 * r, groups=groups,
                                                   pages=pages, retention_interval_tokens=retention,
                                                   junction_checkpoints=junction, fence_unlanded=fence, **ev))
        self.fence = fence
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

    @rule()
    def drain(self):
        self.drained_leaves_nothing_referenced()

    def drained_leaves_nothing_referenced(self):
        """All requests complete and the step lands: every reference and reservation must be returned."""
        for rs, _ in self.running:
            self.cache.release(rs)
        self.running.clear()
        self.cache.end_step()
        self.cache.check()
        pool = self.cache.pool
        held = [p for p, c in enumerate(pool.refcount) if c != 0]
        assert not held, f"pages still referenced after every request finished: {held[:5]}"
        assert pool.reserved == 0, f"{pool.reserved} pages still reserved"

    def teardown(self):
        if hasattr(self, "cache"):
            self.drained_leaves_nothing_referenced()

    @invariant()
    def consistent(self):
        if hasattr(self, "cache"):
            self.cache.check()
            s = self.cache.stats
            assert (s.evicted_hits, s.partial_restores) == (0, 0)
            if self.fence:
                assert s.stale_reads == 0

    @invariant()
    def pinned_never_evicted(self):
        for rs, pins in getattr(self, "running", []):
            for p, gen in pins:
                assert self.cache.pool.generation[p] == gen, "a pinned page was reallocated"
                assert self.cache.pool.refcount[p] > 0


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)


class EngineCacheMachine(CacheMachine):
    """The same random operations under the engine policies' mechanisms: vLLM's boundary and step-end
    checkpoints (held until superseded), SGLang's chunk-end / tracked snapshots with donated final states and a
    state pool of its own (or the unified one), TensorRT-LLM's merged periodic snapshots, no reuse."""

    @initialize(
        policy=st.sampled_from(["vllm-all", "vllm-align", "sglang-no-buffer", "sglang-extra-buffer",
                                "trtllm-periodic", "k3", "none"]),
        groups=st.integers(1, 2),
        pages=st.one_of(st.none(), st.integers(10, 40)),
        r=st.sampled_from([1, 2]),
        split=st.booleans(),
        interval=st.sampled_from([1, 3, 4]),
        fence=st.booleans(),
    )
    def setup(self, policy, groups, pages, r, split, interval, fence):
        kw: dict = {"fence_unlanded": fence}
        if policy.startswith("sglang-"):
            kw.update(donate_final_state=True, track_tokens=2,
                      private_state_slots=3 if policy == "sglang-extra-buffer" else 1)
            if split:
                kw["state_pool_fraction"] = 0.5
        if policy == "trtllm-periodic":
            kw["snapshot_interval_tokens"] = interval
        pb = 2 if policy.startswith("vllm-") else 2 * r  # vLLM hashes whole blocks
        self.cache = HybridPrefixCache(tiny_config(policy, hash_block=2, physical_block=pb, groups=groups,
                                                   pages=pages, **kw))
        self.fence = fence
        self.running = []

    def drained_leaves_nothing_referenced(self):
        super().drained_leaves_nothing_referenced()
        spool = self.cache.spool
        held = [p for p, c in enumerate(spool.refcount) if c != 0]
        assert not held, f"state pages still referenced after every request finished: {held[:5]}"


TestEngineCacheMachine = EngineCacheMachine.TestCase
TestEngineCacheMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
