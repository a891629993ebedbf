"""The single-replica prefix-cache replay (what `k3sim prefix-cache` runs), a serving loop and so serving's:
simpy arrivals from trace timestamps, scheduling steps with a token budget, chunked prefill,
decode, completion. In-flight requests pin pages, copies land one step later, eviction races happen.

Step durations come from an injected cost. `ModelStepCost` takes every step's time from the step-cost model of a
replica (`k3sim.step.StepCostModel` through the serving simulator's fast path), given the step's decodes, their
context and its prefill chunks with their cached prefixes: the same step times `k3sim serve` uses. Hit rates of
a bounded pool depend on which requests overlap in time, so the step time matters. `StepCost` is a line
(overhead + tokens / rate): `k3sim prefix-cache` draws it through two points of the same step model
(`ModelStepCost.line`), so a sweep of many configurations stays cheap; tests use it as a model-free clock.
Decode-only stretches are
batched into one simpy timeout up to the next event (an arrival or a completion): nothing else can happen to the
cache between those events.

Offload tiers (`k3sim.prefix_cache.offload`): a hit that needs host memory (or SSD) is admitted with its pages,
and its prefill waits until the restore has landed (the restore's bytes over the host link, after the restores
queued before it) while the rest of the batch runs: vLLM's asynchronous load (the request waits in
WAITING_FOR_REMOTE_KVS), the same mechanism as `k3sim serve`. A step's time is the step clock's as before (the
copy engine moves the bytes beside the forward), so a restore adds to the request's TTFT, not to the steps;
when every running request waits for a restore the replica idles until the first one lands.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from k3sim.prefix_cache.cache import REJECT, WAIT, HybridPrefixCache
from k3sim.prefix_cache.config import CacheConfig
from k3sim.prefix_cache.keys import block_keys
from k3sim.workloads.request import TraceRequest


@dataclass(frozen=True)
class StepCost:
    """seconds = step_overhead_s + (prefill + decode tokens) / tokens_per_s: a model-free test clock.

    Defaults (modelling choices): ~5x the Mooncake conversation trace's offered prefill load (41k tokens/s), and
    10 ms per step. Real replays use `ModelStepCost`."""

    tokens_per_s: float = 2.0e5
    step_overhead_s: float = 0.01

    def __call__(self, prefill_tokens: int, decode_tokens: int) -> float:
        return self.step_overhead_s + (prefill_tokens + decode_tokens) / self.tokens_per_s


class ModelStepCost:
    """Step time from the step-cost model of one replica layout (`k3sim.serving.stepcost.step_seconds_for`).

    `step(num_decode, decode_context_sum, prefill_chunks)` is what the replay calls; `(prefill, decode)` tokens
    alone (the old cost signature) price the prefill as one chunk without a cached prefix and the decodes at
    `mean_context` tokens."""

    def __init__(self, model, hardware="h200", *, tp: int = 8, pp: int = 2, ep: int = 8, gpus_per_node: int = 8,
                 mean_context: int = 4096):  # modelling choice: a decode's context when a cost gets none
        from k3sim.configs import Parallelism, load_hardware

        self.model = model
        self.hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
        self.par = Parallelism(tp=tp, pp=pp, ep=ep)
        self.gpus_per_node = gpus_per_node
        self.mean_context = mean_context
        self.layout = {"tp": tp, "pp": pp, "ep": ep, "hardware": self.hw.name}
        self._fn = None

    @property
    def fn(self):
        """Built on first use (and again in each sweep worker: the memoised tables are not pickled)."""
        if self._fn is None:
            from k3sim.serving.stepcost import step_seconds_for

            self._fn = step_seconds_for(self.model, self.hw, self.par, gpus_per_node=self.gpus_per_node)
        return self._fn

    def __getstate__(self):
        return {**self.__dict__, "_fn": None}

    @classmethod
    def from_scenario(cls, path, model=None) -> "ModelStepCost":
        """The hardware and layout of a scenario file, for its model or `model` (checked against the layout)."""
        from k3sim.configs import resolve_scenario

        scn, scn_model, hw = resolve_scenario(path)
        p = scn.parallelism
        if model is not None and model.moe is None and p.ep > 1:  # another model on the scenario's replica: a
            p = p.model_copy(update={"ep": 1})                       # dense one has no experts to spread
        model = model or scn_model
        from k3sim.configs.parallel import check_layout

        check_layout(model, p, mode="serve", source=str(path))
        return cls(model, hw, tp=p.tp, pp=p.pp, ep=p.ep, gpus_per_node=scn.cluster.gpus_per_node)

    def step(self, num_decode: int, decode_context_sum: int, prefill: tuple = ()) -> float:
        return self.fn(num_decode, decode_context_sum, prefill)

    def __call__(self, prefill_tokens: int, decode_tokens: int) -> float:
        return self.fn(decode_tokens, decode_tokens * self.mean_context, ((prefill_tokens, 0),) if prefill_tokens else ())

    def line(self, token_budget: int, *, tokens_per_s: float | None = None,
             step_overhead_s: float | None = None) -> StepCost:
        """The `StepCost` line through two steps of this model: a one-token decode step (at `mean_context`,
        a modelling choice) and a prefill chunk of `token_budget` tokens, so the line gives both exactly.
        `tokens_per_s` or `step_overhead_s`, when given (a what-if), replace the derived one; with only the rate
        given, the line still passes through the one-token step."""
        from k3sim.errors import InputError

        if tokens_per_s is not None and step_overhead_s is not None:
            return StepCost(tokens_per_s, step_overhead_s)
        t1 = self.fn(1, self.mean_context, ())
        tb = self.fn(0, 0, ((token_budget, 0),))
        rate = tokens_per_s
        if rate is None:
            if token_budget < 2:
                raise InputError(f"a budget of {token_budget} token gives one point, not a line: at least 2, or "
                                 "give --tokens-per-s", source="--token-budget")
            if not tb > t1:
                raise InputError(f"a {token_budget}-token prefill step ({tb:.4g} s) is not slower than a one-token "
                                 f"decode step ({t1:.4g} s): no tokens/s to derive; give --tokens-per-s",
                                 source="--token-budget")
            rate = (token_budget - 1) / (tb - t1)
        over = step_overhead_s if step_overhead_s is not None else t1 - 1.0 / rate
        return StepCost(rate, over)


def _step_time(cost, decoders: list, chunks: list, pf: int, n_steps: int = 1) -> float:
    """Seconds of `n_steps` steps: the rich call (decode contexts, chunks and their prefixes) when the cost takes
    it, else (prefill tokens, decode tokens); a decode stretch is priced at its midpoint context."""
    step = getattr(cost, "step", None)
    dec = len(decoders)
    if step is None:
        return cost(pf, dec) * n_steps
    ctx = sum(rs.L + rs.generated for rs in decoders) + dec * (n_steps - 1) // 2
    return step(dec, ctx, tuple(chunks)) * n_steps


@dataclass(frozen=True)
class SchedulerConfig:
    """Modelling choices of the vLLM kind (its max_num_batched_tokens / max_num_seqs knobs), not measured."""

    token_budget: int = 8192  # tokens per step (decode first, then chunked prefill), vLLM-style
    max_running: int = 256


@dataclass
class ReplayResult:
    policy: str
    hash_block_tokens: int
    physical_block_tokens: int
    capacity_bytes: float | None
    page_bytes: int
    kda_pages_per_group_state: int
    num_kda_groups: int
    requests: int
    requests_rejected: int
    input_tokens: int
    prefill_tokens_saved: int
    token_hit_rate: float
    request_hit_rate: float
    mla_only_token_hit_rate: float  # what the MLA level alone would have matched (upper bound at this state)
    checkpoint_bytes_peak: int
    pool_bytes_peak: int
    evictions: int
    evicted_kv_pages: int
    evicted_kda_pages: int
    checkpoints_written: int
    checkpoints_skipped: int
    checkpoints_recycled: int
    checkpoints_evicted: int
    lookups: int
    lookup_probes: int
    stale_reads: int
    fenced_lookups: int
    evicted_hits: int
    partial_restores: int
    steps: int
    simulated_s: float
    wall_s: float
    trace_lines_skipped: int = 0
    eviction: str = "lru"
    prefill_flop_saved: float = 0.0  # FLOP (whole model) the hits skipped
    prefill_flop_saved_fraction: float = 0.0  # of the admitted prompts' prefill FLOP
    checkpoint_bytes: int = 0  # pool bytes one checkpoint holds (its groups' slots, padded to pages)
    checkpoints_donated: int = 0  # finished requests' states kept cached (SGLang)
    state_pool_bytes_peak: int = 0  # peak of the separate state pool (SGLang), 0 when the pool is unified
    # time to first token of the admitted requests (s; first token = end of the step of its last prompt chunk)
    ttft_p50_s: float = math.nan
    ttft_p99_s: float = math.nan
    # offload tiers (issue 24): prompt tokens served by the hit beyond what a GPU-only lookup found (host), and
    # beyond GPU + host (SSD); the GPU share is the rest of token_hit_rate
    token_hit_rate_gpu: float = 0.0
    token_hit_rate_host: float = 0.0
    token_hit_rate_ssd: float = 0.0
    host_pool_bytes: float = 0.0  # the tier's capacity (the pool's units: per GPU with tp); 0: no host tier
    host_link_bytes_per_s: float | None = None  # achieved restore bandwidth, in the pool's units
    host_restore_bytes: int = 0  # bytes restored from host memory (KV pages, partial pages' tokens, checkpoints)
    host_restore_s: float = 0.0  # the host link's seconds moving them (bytes / bandwidth)
    ssd_pool_bytes: float = 0.0
    ssd_restore_bytes: int = 0
    ssd_restore_s: float = 0.0
    requests_restored: int = 0  # admissions whose prefill waited for a restore
    restore_wait_s_mean: float = 0.0  # their mean wait (the link's queue included)
    offload: dict = field(default_factory=dict)  # per tier: capacity, peak, demoted / evicted / restored
    extra: dict = field(default_factory=dict)


CostFn = Callable[[int, int], float]
# what a sweep row leaves out (`prefix_cache_run._one`): the columns of the committed sweep tables stay as they
# were (a sweep takes no offload tier; its TTFTs are those of one replica under the whole trace)
NOT_IN_SWEEP_ROWS = ("ttft_p50_s", "ttft_p99_s", "token_hit_rate_gpu", "token_hit_rate_host", "token_hit_rate_ssd",
                     "host_pool_bytes", "host_link_bytes_per_s", "host_restore_bytes", "host_restore_s",
                     "ssd_pool_bytes", "ssd_restore_bytes", "ssd_restore_s", "requests_restored",
                     "restore_wait_s_mean", "offload")


class _Request:
    """A trace request as the serving scheduler (`scheduler.form_batch`) sees it: its prefix keys while it waits,
    its cache state `rs` once admitted (`rs.generated` is the replay's token count)."""

    __slots__ = ("req", "keys", "rs", "seq")

    def __init__(self, req: TraceRequest, keys: list[int], seq: int):
        self.req, self.keys, self.rs, self.seq = req, keys, None, seq

    @property
    def L(self) -> int:
        return self.req.input_tokens

    target = L  # the prompt is the whole prefill (no preemption re-prefills generated tokens here)

    @property
    def generated(self) -> int:
        return self.rs.generated

    @property
    def context(self) -> int:
        return self.L + self.rs.generated


@dataclass(frozen=True)
class _EngineOptions:
    """What `form_batch` reads of an engine's options, from the replay's scheduler (vLLM's chunked prefill)."""

    token_budget: int
    max_batch: int
    scheduler: str = "vllm"
    chunk_tokens: int | None = None


class _Replay:
    """One replay's state (the simpy clock, the cache, the waiting queue, the running batch and the counters the
    summary reads), so that each phase of a scheduling step is a named method over the same state. Batches are
    formed by the serving scheduler (`k3sim.serving.scheduler.form_batch`, the engine's), this object standing in
    for the engine replica it reads: one replica, mixed role, no MTP lookahead; every request's pages are
    reserved at admission, so a decode never runs short and nothing is preempted."""

    role, lookahead, timer = "mixed", 0, None

    def __init__(self, env, cfg: CacheConfig, sched: SchedulerConfig, cost: CostFn, check_every: int,
                 record_requests: bool):
        self.env, self.cfg, self.sched, self.cost = env, cfg, sched, cost
        self.check_every, self.record_requests = check_every, record_requests
        self.cache = HybridPrefixCache(cfg)
        self.cache.clock = lambda: env.now  # restores from an offload tier are timed on the replay's clock
        self.ttft: list[float] = []
        self.B_h = cfg.effective_hash_block_tokens
        self.B_p = cfg.physical_block_tokens
        self.ecfg = _EngineOptions(sched.token_budget, sched.max_running)
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.per_request: list[tuple[int, int]] = []
        self.next_arrival_s = math.inf
        self.arrivals_done = False
        self.wake_event = None
        self.rejected = self.input_tokens = self.steps = self.peak_bytes = self.peak_state_pages = 0

    def wake(self) -> None:
        """Resume an idle scheduler (a request arrived, or the trace ended)."""
        ev = self.wake_event
        if ev is not None and not ev.triggered:
            ev.succeed()

    def arrivals(self, requests: Iterable[TraceRequest]):
        """simpy process: each request joins the waiting queue at its trace timestamp, with its prefix keys."""
        env = self.env
        for seq, req in enumerate(requests):
            if req.arrival_s > env.now:
                self.next_arrival_s = req.arrival_s
                yield env.timeout(req.arrival_s - env.now)
            self.waiting.append(_Request(req, block_keys(req, self.B_h), seq))
            self.wake()
        self.next_arrival_s = math.inf
        self.arrivals_done = True
        self.wake()

    def admit(self, r: _Request):
        """The engine's admission hook for `form_batch`: the cache matches the prefix and pins pages (WAIT: no
        pages now; REJECT: larger than the pool); an admitted request is counted here."""
        req = r.req
        rs = self.cache.admit(r.keys, req.input_tokens, req.output_tokens, req.arrival_s)
        if rs is not WAIT and rs is not REJECT:
            r.rs = rs
            self.input_tokens += req.input_tokens
            if self.record_requests:
                self.per_request.append((req.input_tokens, rs.hit_tokens))
        return rs

    def preempt(self, r: _Request) -> None:  # pragma: no cover - pages are reserved at admission
        raise RuntimeError("the replay reserves every request's pages at admission: a preemption is a cache bug")

    def scheduler(self):
        """simpy process, the serving loop: each pass is one step (or a batched decode-only stretch): the serving
        scheduler's batch (decodes first, then chunked prefill of the running requests, then admission), priced
        by the cost and recorded."""
        from k3sim.serving.scheduler import form_batch

        while True:
            if not self.running and not self.waiting:
                if self.arrivals_done:
                    return
                self.wake_event = self.env.event()
                yield self.wake_event
                continue
            plan = form_batch(self)
            self.rejected += len(plan.rejected)
            decoders = [r.rs for r in plan.decoders]
            chunks = [(n, before) for _, n, before in plan.prefills if n]  # (tokens, cached prefix) per chunk
            pf = sum(n for n, _ in chunks)
            prefilling = len(self.running) - len(decoders)
            if pf == 0 and not decoders:
                landing = self._next_landing_s() if prefilling else math.inf
                if landing < math.inf:  # every running request waits for a restore: idle until one lands
                    self.wake_event = self.env.event()
                    yield self.env.any_of([self.env.timeout(landing - self.env.now), self.wake_event])
                    continue
                if not self.waiting:
                    continue  # every waiting request was rejected (larger than the pool): wait for the next arrival
                # nothing runs, so nothing holds pages: admission refusing now would refuse forever
                raise RuntimeError("scheduler stalled: the head request cannot be admitted into an idle pool")
            n_steps = self._decode_stretch(decoders, chunks) if pf == 0 and not prefilling else 1
            yield self.env.timeout(_step_time(self.cost, decoders, chunks, pf, n_steps))
            self._record_step(n_steps)
            self._advance(n_steps)

    def _next_landing_s(self) -> float:
        """When the first running request's restore from an offload tier lands (inf: none is waiting)."""
        now = self.env.now
        return min((r.rs.ready_s for r in self.running if r.rs.ready_s > now), default=math.inf)

    def _decode_stretch(self, decoders: list, chunks: list) -> int:
        """Steps of a decode-only stretch taken as one timeout: up to the next completion, or the next arrival
        when none waits (nothing else can change the cache in between)."""
        rem = min(rs.O - rs.generated for rs in decoders)
        if not self.waiting:
            dt1 = _step_time(self.cost, decoders, chunks, 0)
            nxt = self.next_arrival_s
            rem = min(rem, max(1, math.ceil((nxt - self.env.now) / dt1))) if nxt < math.inf else rem
        return max(1, rem)

    def _record_step(self, n_steps: int) -> None:
        """Close the step in the cache (copies land, pins settle) and record it: step count, the invariant check
        every `check_every` steps, and the pool's peak occupancy."""
        cache = self.cache
        cache.end_step(n_steps)
        self.steps += n_steps
        if self.check_every and self.steps % self.check_every < n_steps:
            cache.check()
        unbounded = self.cfg.capacity_bytes is None
        used = (cache.pool.num_pages - (len(cache.pool.empty) if unbounded else 0)) * self.cfg.page_bytes
        if cache.spool is not cache.pool:
            state_pages = cache.spool.num_pages - (len(cache.spool.empty) if unbounded else 0)
            used += state_pages * cache.state_page_bytes
            if state_pages > self.peak_state_pages:
                self.peak_state_pages = state_pages
        if used > self.peak_bytes:
            self.peak_bytes = used

    def _advance(self, n_steps: int) -> None:
        """Requests past their prefill generate tokens (the last prefill forward yields the first one, a decode
        step one each), grow their KV pages as needed, and leave the batch, releasing pages, when done."""
        still = []
        B_p = self.cfg.physical_block_tokens
        for r in self.running:
            rs = r.rs
            if rs.computed >= rs.L:
                if not rs.generated:
                    self.ttft.append(self.env.now - rs.arrival_s)
                rs.generated += n_steps if rs.generated else 1
                if rs.L + rs.generated > len(rs.blocks) * B_p and len(rs.blocks) < rs.total_blocks:
                    self.cache.grow_decode(rs, 0)
                if rs.generated >= rs.O:
                    self.cache.release(rs)
                    continue
            still.append(r)
        self.running[:] = still

    def summary(self, wall_s: float, keep_cache: bool) -> ReplayResult:
        """The result: the configuration, the counts and hit rates over the admitted requests, the cache's
        statistics, and what was asked to be kept (`per_request`, `cache`) in `extra`."""
        cfg, cache = self.cfg, self.cache
        s = cache.stats
        n = s.requests_admitted
        extra: dict = {"per_request": self.per_request} if self.record_requests else {}
        if keep_cache:
            extra["cache"] = cache
        inp = self.input_tokens
        return ReplayResult(
            policy=cfg.policy,
            hash_block_tokens=cfg.effective_hash_block_tokens,
            physical_block_tokens=cfg.physical_block_tokens,
            capacity_bytes=cfg.capacity_bytes,
            page_bytes=cfg.page_bytes,
            kda_pages_per_group_state=cfg.pages_per_group_state,
            num_kda_groups=cfg.groups,
            requests=n,
            requests_rejected=self.rejected,
            input_tokens=inp,
            prefill_tokens_saved=s.hit_tokens,
            token_hit_rate=s.hit_tokens / inp if inp else 0.0,
            request_hit_rate=s.requests_with_hit / n if n else 0.0,
            mla_only_token_hit_rate=s.mla_match_tokens / inp if inp else 0.0,
            checkpoint_bytes_peak=s.checkpoint_pages_peak * cache.state_page_bytes,
            pool_bytes_peak=self.peak_bytes,
            evictions=cache.pool.evictions,
            evicted_kv_pages=cache.pool.evictions_by_kind[1],
            evicted_kda_pages=cache.pool.evictions_by_kind[2],
            checkpoints_written=s.checkpoints_written,
            checkpoints_skipped=s.checkpoints_skipped,
            checkpoints_recycled=s.checkpoints_recycled,
            checkpoints_evicted=s.checkpoints_evicted,
            lookups=s.lookups,
            lookup_probes=s.lookup_probes,
            stale_reads=s.stale_reads,
            fenced_lookups=s.fenced_lookups,
            evicted_hits=s.evicted_hits,
            partial_restores=s.partial_restores,
            steps=self.steps,
            simulated_s=self.env.now,
            wall_s=wall_s,
            eviction=cfg.eviction,
            prefill_flop_saved=s.prefill_flop_saved,
            prefill_flop_saved_fraction=(s.prefill_flop_saved / s.prefill_flop_requested
                                         if s.prefill_flop_requested else 0.0),
            checkpoint_bytes=cfg.checkpoint_bytes,
            checkpoints_donated=s.checkpoints_donated,
            state_pool_bytes_peak=self.peak_state_pages * cache.state_page_bytes if cfg.split_pools else 0,
            extra=extra,
            **self._latency(), **self._tiers(),
        )

    def _latency(self) -> dict:
        """TTFT p50 / p99 of the admitted requests (numpy's linear interpolation, as `serving.metrics`)."""
        if not self.ttft:
            return {}
        import numpy as np

        a = np.asarray(self.ttft)
        return {"ttft_p50_s": float(np.percentile(a, 50)), "ttft_p99_s": float(np.percentile(a, 99))}

    def _tiers(self) -> dict:
        """The hit rate by tier and what the offload tiers moved (the GPU share alone without a tier)."""
        cache, inp = self.cache, self.input_tokens
        s = cache.stats
        host, ssd = s.lower_hit_tokens
        out = {"token_hit_rate_gpu": (s.hit_tokens - host - ssd) / inp if inp else 0.0}
        store = cache.offload
        if store is None:
            return out
        out.update(token_hit_rate_host=host / inp if inp else 0.0, token_hit_rate_ssd=ssd / inp if inp else 0.0,
                   requests_restored=s.restores, restore_wait_s_mean=s.restore_wait_s / s.restores if s.restores else 0.0,
                   offload={lvl.name: lvl.summary() for lvl in store.levels})
        for lvl in store.levels:
            out[f"{lvl.name}_pool_bytes"] = lvl.capacity
            out[f"{lvl.name}_restore_bytes"] = lvl.restored_bytes
            out[f"{lvl.name}_restore_s"] = lvl.restore_s
        out["host_link_bytes_per_s"] = self.cfg.host_bandwidth_bytes_per_s
        return out


def replay(
    requests: Iterable[TraceRequest],
    cfg: CacheConfig,
    sched: SchedulerConfig = SchedulerConfig(),
    cost: CostFn = StepCost(),
    check_every: int = 0,
    record_requests: bool = False,
    keep_cache: bool = False,
) -> ReplayResult:
    """Serve `requests` (sorted by arrival) through the cache; `check_every` > 0 checks invariants every N steps;
    `record_requests` lists (input tokens, hit tokens) per admitted request in `extra["per_request"]`;
    `keep_cache` leaves the final cache in `extra["cache"]` (benchmarks, inspection)."""
    import simpy

    cfg.check_capacity()
    t0 = time.perf_counter()
    run = _Replay(simpy.Environment(), cfg, sched, cost, check_every, record_requests)
    run.env.process(run.arrivals(requests))
    run.env.process(run.scheduler())
    run.env.run()
    run.cache.end_step()
    if check_every:
        run.cache.check()
    return run.summary(time.perf_counter() - t0, keep_cache)
