"""One replica's continuous-batching engine as a simpy process: one simpy event per engine step.

Each step: form the batch (`scheduler.form_batch`), take its time from the step-cost model, advance the
prefix cache one step (`HybridPrefixCache.end_step`: copies land, checkpoints become visible), then hand out
tokens. A stretch of decode-only steps (no prefill waiting to run, nothing admissible) is one simpy timeout up
to the next completion, page boundary or outside event (an arrival to the fleet, a KV transfer landing): nothing
the engine decides can change inside it. Its time is n steps at the midpoint context (the attention part of a
decode step is linear in the context sum, which grows by one token per sequence per step).

Roles: "mixed" (a colocated replica), "prefill" (P/D: prefill only; a finished prompt waits, holding its pages,
until its KV moves to a decode replica), "decode" (P/D: decodes only; requests arrive with their KV).

MTP (`serving.mtp` drafts, `serving.acceptance`): a decode feeds 1 + mtp tokens a step (KV slots for all of them
are reserved and grown) and advances by the expected accepted tokens (`k3sim.decode.mtp.accepted_tokens_per_step`)
with the fraction banked per request (`Request.carry`): deterministic, no draws, and a stretch of decode steps
stays one event (`steps_to_reach`). An attention-DP replica is `dp` of these engines stepping in lockstep
(`serving.dp.DPReplica`): `plan_step`, `stretch_limit` and `finish_step` are the parts it drives.

Offload tiers (`prefix_cache.offload`, `serving.engine.host_pool_bytes`): a request whose hit needs host memory is
admitted with its pages and its first prefill step waits until the restore has landed (`ReqState.ready_s`, on
the replica's host link, one restore after another), while the rest of the batch runs (vLLM's asynchronous
load: WAITING_FOR_REMOTE_KVS); a replica whose every request waits idles until the first restore lands
(`RESTORING`), and a decode stretch ends there.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from k3sim.prefix_cache.cache import REJECT, WAIT, HybridPrefixCache
from k3sim.prefix_cache.config import CacheConfig
from k3sim.prefix_cache.pool import MLA
from k3sim.serving.scheduler import form_batch
from k3sim.procs import checkpoint

StepSecondsFn = Callable[[int, int, tuple], float]  # (num_decode, decode_context_sum, prefill) -> s
RESTORING = "restoring"  # `Replica.plan_step`: nothing runs now, but a restore from an offload tier will land


def steps_to_reach(carry: float, advance: float, tokens: int) -> int:
    """Fewest steps k >= 1 after which a sequence advancing `advance` tokens per step in expectation, with
    `carry` tokens of fraction banked, has emitted `tokens` whole tokens: floor(carry + k x advance) >= tokens
    (the same expression `Replica.finish_step` hands tokens out with, so the two agree to the last bit)."""
    k = max(1, math.ceil((tokens - carry) / advance))
    while k > 1 and math.floor(carry + (k - 1) * advance) >= tokens:
        k -= 1
    while math.floor(carry + k * advance) < tokens:
        k += 1
    return k


def bucket(x: int) -> int:
    """x rounded to 7 significant bits (relative error < 0.4 %): the memo key of a context length. Multiples of
    the bucket width (chunk boundaries, powers of two) stay exact."""
    if x < 256:
        return x
    shift = x.bit_length() - 8
    return ((x + (1 << (shift - 1))) >> shift) << shift


class StepTimer:
    """Memoised step time: keyed on (decodes, bucketed context sum, sorted (chunk, bucketed prefix) tuple)."""

    def __init__(self, step_seconds: StepSecondsFn, slo_tpot_s: float = math.inf):
        self.fn = step_seconds
        self.slo_tpot_s = slo_tpot_s
        self.memo: dict = {}
        self._budget_memo: dict = {}
        self.calls = 0
        self.floor = SarathiFloor(slo_tpot_s)

    def __call__(self, num_decode: int, context_sum: int, prefill: tuple = ()) -> float:
        self.calls += 1
        if prefill:
            prefill = tuple(sorted((c, bucket(p)) for c, p in prefill))
        key = (num_decode, bucket(context_sum), prefill)
        v = self.memo.get(key)
        if v is None:
            v = float(self.fn(num_decode, key[1], prefill))
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"step cost {v!r} s for {key} is not a positive number")
            self.memo[key] = v
        return v

    def stall_free_budget(self, num_decode: int, context_sum: int, max_tokens: int, unit: int,
                          prefix: int = 0) -> int:
        """Sarathi-Serve: the most prefill tokens (a multiple of `unit`) whose step with these decodes stays
        within the TPOT SLO; at least `unit` so the queue always moves. `prefix`: the tokens already cached
        before the chunk that will run first (its attention reads them), so a late chunk of a long prompt
        gets the smaller budget it needs. A step that misses the SLO even at the `unit` floor is counted in
        `self.floor` (the target is unreachable there: the run says so instead of letting the queue grow)."""
        key = (num_decode, bucket(context_sum), max_tokens, bucket(prefix), unit)
        hit = self._budget_memo.get(key)
        if hit is None:
            pre = key[3]
            hi = max((max_tokens - num_decode) // unit, 1)
            lo = 1
            if self(num_decode, context_sum, ((hi * unit, pre),)) <= self.slo_tpot_s:
                lo = hi
            else:
                while hi - lo > 1:  # step time grows with the chunk: bisect
                    mid = (lo + hi) // 2
                    if self(num_decode, context_sum, ((mid * unit, pre),)) <= self.slo_tpot_s:
                        lo = mid
                    else:
                        hi = mid
            at_floor = self(num_decode, context_sum, ((unit, pre),)) if lo == 1 else 0.0
            hit = self._budget_memo[key] = (lo * unit, at_floor if at_floor > self.slo_tpot_s else 0.0)
        budget, missed_s = hit
        self.floor.decided(unit, missed_s, num_decode)
        return budget


class SarathiFloor:
    """What Sarathi's stall-free budget did in a run: how many budget decisions fell to the one-block floor
    because even that step misses the TPOT target, and how long such a step takes (min and max), so the
    result can say the target is unreachable at this layout instead of the queue diverging in silence."""

    __slots__ = ("slo_tpot_s", "decisions", "floor_steps", "floor_steps_with_decodes", "floor_tokens",
                 "step_s_min", "step_s_max")

    def __init__(self, slo_tpot_s: float):
        self.slo_tpot_s = slo_tpot_s
        self.decisions = 0
        self.floor_steps = 0
        self.floor_steps_with_decodes = 0
        self.floor_tokens = 0
        self.step_s_min = math.inf
        self.step_s_max = 0.0

    def decided(self, unit: int, missed_s: float, num_decode: int) -> None:
        self.decisions += 1
        if missed_s:
            self.floor_steps += 1
            self.floor_steps_with_decodes += num_decode > 0
            self.floor_tokens = unit
            if missed_s < self.step_s_min:
                self.step_s_min = missed_s
            if missed_s > self.step_s_max:
                self.step_s_max = missed_s

    def merged(self, others) -> "SarathiFloor":
        out = SarathiFloor(self.slo_tpot_s)
        for f in (self, *others):
            out.decisions += f.decisions
            out.floor_steps += f.floor_steps
            out.floor_steps_with_decodes += f.floor_steps_with_decodes
            out.floor_tokens = max(out.floor_tokens, f.floor_tokens)
            out.step_s_min = min(out.step_s_min, f.step_s_min)
            out.step_s_max = max(out.step_s_max, f.step_s_max)
        return out

    def summary(self) -> dict:
        """The run's JSON entry: `tpot_unreachable` when any step fell to the floor with the SLO missed."""
        hit = self.floor_steps > 0
        return {"slo_tpot_s": self.slo_tpot_s, "tpot_unreachable": hit, "budget_decisions": self.decisions,
                "floor_steps": self.floor_steps, "floor_steps_with_decodes": self.floor_steps_with_decodes,
                "floor_budget_tokens": self.floor_tokens if hit else None,
                "floor_step_s_min": self.step_s_min if hit else None,
                "floor_step_s_max": self.step_s_max if hit else None}


class Replica:
    def __init__(self, fleet, idx: int, role: str, cache_cfg: CacheConfig, ecfg, timer: StepTimer,
                 gpus: int, pool: str = "mixed", *, rank: int = 0, mtp: int = 0, advance: float = 1.0):
        self.fleet = fleet
        self.env = fleet.env
        self.idx = idx
        self.rank = rank  # attention-DP rank inside replica `idx` (0 without attention DP)
        self.role = role
        # MTP: each decode feeds 1 + mtp tokens (KV slots for all of them) and advances `advance` tokens per step
        # in expectation (fractional carry per request: deterministic, and a stretch of steps stays one event)
        self.lookahead = mtp
        self.advance = advance
        self.backlog = 0  # prefill tokens routed here and not yet run (the attention-DP balancer's measure)
        self.routed = 0  # requests the fleet's router gave this replica
        self.ecfg = ecfg
        self.timer = timer
        self.gpus = gpus
        self.cache = HybridPrefixCache(cache_cfg)
        self.cache.clock = lambda: self.env.now  # restores from an offload tier are timed on the fleet's clock
        self.B_p = cache_cfg.physical_block_tokens
        self.B_h = cache_cfg.effective_hash_block_tokens
        self.G, self.k = cache_cfg.groups, cache_cfg.pages_per_group_state
        cap = cache_cfg.num_pages
        self.capacity_pages = cap
        self.watermark = int(ecfg.watermark_fraction * cap) if cap is not None else 0
        self.reserve_output = ecfg.reserve_output or role == "decode"
        self.waiting: deque = deque()
        self.running: list = []
        self.held: set = set()  # prefill role: finished prompts waiting for their KV transfer
        self.incoming: deque = deque()  # decode role: requests waiting for pages to receive their KV
        self.landing = 0  # decode role: transfers in flight to this replica
        self.next_landing_s = math.inf
        self.landing_times: list[float] = []
        self.seq = 0
        self.steps = 0
        self.busy_s = 0.0
        self.step_end_s = 0.0
        self._wake_ev = None

    # ------------------------------------------------------------------ bookkeeping
    def load(self) -> int:
        """Requests this replica is responsible for (router's least-loaded measure)."""
        return len(self.waiting) + len(self.running) + len(self.held) + len(self.incoming) + self.landing

    def used_bytes(self) -> int:
        """Pool bytes pinned by requests (cached free pages excluded)."""
        p = self.cache.pool
        return (len(p.refcount) - len(p.empty) - len(p.lru) - p.parked) * self.cache.cfg.page_bytes

    def wake(self) -> None:
        ev = self._wake_ev
        if ev is not None and not ev.triggered:
            ev.succeed()

    def submit(self, req) -> None:
        req.replica = self.idx
        req.rank = self.rank
        self.waiting.append(req)
        self.wake()

    def accept_transfer(self, req) -> None:
        """Decode role: a finished prompt's KV is to move here; reserve pages for it (FCFS)."""
        self.incoming.append(req)
        self.try_accept()

    def admit(self, req):
        """Admission by memory: look up the prefix, pin the hit, reserve the prompt's pages (and the output's if
        `reserve_output`), allocate the private KDA state slots. WAIT / REJECT as the cache answers."""
        la = self.lookahead
        total = -(-(req.L + req.O + la) // self.B_p) + self.G * self.k
        if self.capacity_pages is not None and total > self.capacity_pages:
            return REJECT  # could never finish even alone in the pool
        keys, L = req.keys, req.target
        if L > req.L:  # recompute after preemption: the generated tokens have keys nothing else shares
            keys = keys + [self.fleet.fresh_key() for _ in range(len(keys), L // self.B_h)]
        out = (req.O - req.generated if self.reserve_output else 1) + la
        pool = self.cache.pool
        lower_before = tuple(self.cache.stats.lower_hit_tokens)
        wm = self.watermark if self.running else 0
        pool.reserved += wm
        try:
            rs = self.cache.admit(keys, L, out, req.arrival_s)
        finally:
            pool.reserved -= wm
        if rs is WAIT or rs is REJECT:
            return rs
        req.rs = rs
        self.seq += 1
        req.seq = self.seq
        if req.hit_tokens < 0:
            req.hit_tokens = rs.computed
            self.fleet.count_hit(req.L, rs.computed)
            if self.cache.offload is not None:  # this admission's share from the tiers (the cache adds it up)
                lower = self.cache.stats.lower_hit_tokens
                self.fleet.count_lower_hit(lower[0] - lower_before[0], lower[1] - lower_before[1])
        if req.scheduled_s != req.scheduled_s:
            req.scheduled_s = self.env.now
        return rs

    def preempt(self, req) -> None:
        """Preemption by recompute: free everything, requeue at the head to prefill prompt + generated."""
        self.cache.release(req.rs)
        req.rs = None
        self.running.remove(req)
        req.target = req.L + req.generated
        req.preemptions += 1
        self.fleet.preemptions += 1
        self.waiting.appendleft(req)

    def _complete(self, req, now: float) -> None:
        self.cache.release(req.rs)
        req.rs = None
        self.fleet.complete(req, now)

    # ------------------------------------------------------------------ P/D decode side
    def try_accept(self) -> None:
        """Decode role: reserve pages for the head of `incoming` (FCFS), then let its KV move; at most
        `max_batch` requests running or landing (a decode instance's max_num_seqs / max_running_requests
        bounds it as any engine's: the rest wait in `incoming`, where the overload check sees them)."""
        max_batch = self.ecfg.max_batch
        while self.incoming and len(self.running) + self.landing < max_batch:
            req = self.incoming[0]
            ctx = req.context
            out = req.O - req.generated + self.lookahead
            total = -(-(ctx + out) // self.B_p) + self.G * self.k
            if self.capacity_pages is not None and total > self.capacity_pages:
                self.incoming.popleft()
                self.fleet.reject_transfer(req)
                continue
            # a prompt of one token (no lookup), the received context counted as output: reserves it all
            rs = self.cache.admit([], 1, ctx + out - 1, req.arrival_s)
            if rs is WAIT:
                return
            self.incoming.popleft()
            pool = self.cache.pool
            while len(rs.blocks) * self.B_p < ctx:
                rs.blocks.append(pool.allocate(MLA))
                rs.reserve_left -= 1
                pool.reserved -= 1
            rs.computed = ctx
            req.target = ctx
            req.rs_decode = rs
            self.landing += 1
            self.fleet.start_transfer(req, self)

    def land(self, req) -> None:
        self.landing -= 1
        req.rs = req.rs_decode
        req.rs_decode = None
        self.seq += 1
        req.seq = self.seq
        self.running.append(req)
        self.wake()

    # ------------------------------------------------------------------ the engine loop
    def plan_step(self):
        """This step's batch (`scheduler.form_batch`), rejections handed to the fleet; None when every waiting
        request was rejected and nothing else is left."""
        plan = form_batch(self)
        for req in plan.rejected:
            self.backlog -= req.route_tokens
            req.route_tokens = 0
            self.fleet.reject(req)
        if self.cache.offload is not None and plan.prefills:  # admitted, waiting for a restore: nothing to run
            plan.prefills = [x for x in plan.prefills if x[1]]
        if not plan.decoders and not plan.prefills:
            if not self.running and not self.waiting:
                return None  # every waiting request was rejected
            if self.restore_landing_s() < math.inf:
                return RESTORING
            raise RuntimeError(f"replica {self.idx}: scheduler stalled with {len(self.running)} running and "
                               f"{len(self.waiting)} waiting (nothing admissible into an idle pool)")
        return plan

    def restore_landing_s(self) -> float:
        """When the first running request's restore from an offload tier lands (inf: none waits for one)."""
        if self.cache.offload is None:
            return math.inf
        now = self.env.now
        return min((r.rs.ready_s for r in self.running if r.rs is not None and r.rs.ready_s > now),
                   default=math.inf)

    def await_restore(self):
        """simpy: idle until the first restore lands, or an arrival wakes the replica."""
        env = self.env
        ev = self._wake_ev = env.event()
        yield env.any_of([env.timeout(self.restore_landing_s() - env.now), ev])
        self._wake_ev = None

    def stretch_limit(self, plan) -> int:
        """Decode-only steps that can run as one event: up to the first completion or page boundary."""
        dec, B_p = plan.decoders, self.B_p
        if not self.lookahead:
            n = math.inf
            for r in dec:
                g = r.generated
                left = r.O - g
                room = len(r.rs.blocks) * B_p - r.L - g + 1
                if left < n:
                    n = left
                if room < n:
                    n = room
            return n
        a, la = self.advance, self.lookahead
        n = min(steps_to_reach(r.carry, a, r.O - r.generated) for r in dec)
        return min(n, min(steps_to_reach(r.carry, a, len(r.rs.blocks) * B_p - r.L - r.generated - la + 1)
                          for r in dec))

    def mid_context(self, plan, n: int) -> int:
        """The decoders' context sum halfway through a stretch of n steps (attention is linear in it)."""
        nd = len(plan.decoders)
        if self.advance == 1.0:
            return plan.context_sum + nd * (n - 1) // 2
        return plan.context_sum + int(nd * self.advance * (n - 1) / 2)

    def run(self):
        env, fleet, timer = self.env, self.fleet, self.timer
        while True:
            checkpoint()  # a Ctrl-C whose exception a finaliser swallowed (k3sim.procs)
            if self.role == "decode" and self.incoming:
                self.try_accept()
            if not self.running and not self.waiting:
                self._wake_ev = env.event()
                yield self._wake_ev
                self._wake_ev = None
                continue
            plan = self.plan_step()
            if plan is None:
                continue
            if plan is RESTORING:
                yield from self.await_restore()
                continue
            dec, pf = plan.decoders, plan.prefills
            nd = len(dec)
            cs = plan.context_sum
            n = 1
            now = env.now
            if not pf:
                n = self.stretch_limit(plan)
                if n > 1:
                    horizon = min(fleet.horizon(self), self.restore_landing_s()) - now
                    if horizon < math.inf:
                        n = min(n, max(1, math.ceil(horizon / timer(nd, cs))))
                dt = n * timer(nd, self.mid_context(plan, n)) if n > 1 else timer(nd, cs)
            else:
                dt = timer(nd, cs, tuple((c, p) for _, c, p in pf))
                for req, _, _ in pf:
                    if req.scheduled_s != req.scheduled_s:
                        req.scheduled_s = now
            self.step_end_s = now + dt
            yield env.timeout(dt)
            self.finish_step(plan, n, dt)

    def finish_step(self, plan, n: int, dt: float) -> None:
        """After n steps of `plan` (dt seconds in all): tokens handed out, finished requests leave."""
        now = self.env.now
        fleet = self.fleet
        if self.backlog:  # attention DP: the balancer's outstanding prefill tokens, as the chunks run
            for req, c, _ in plan.prefills:
                d = req.route_tokens if req.rs.computed >= req.target else min(c, req.route_tokens)
                req.route_tokens -= d
                self.backlog -= d
        self.cache.end_step(n)
        self.steps += n
        self.busy_s += dt
        done = False
        a = self.advance
        if a == 1.0:
            for r in plan.decoders:
                g = r.generated + n
                r.generated = g
                if g >= r.O:
                    r.done = done = True
        else:
            for r in plan.decoders:
                total = r.carry + n * a
                k = math.floor(total)
                r.carry = total - k
                r.generated = min(r.generated + k, r.O)
                if r.generated >= r.O:
                    r.done = done = True
        for req, _, _ in plan.prefills:
            if req.rs.computed >= req.target:  # the last chunk's forward yields the next token
                req.generated += 1
                if req.first_token_s != req.first_token_s:
                    req.first_token_s = now
                if self.role == "prefill":
                    req.prefill_done_s = now
                    req.done = True
                    done = True
                    self.held.add(req)
                    fleet.prefill_finished(req, self)
                elif req.generated >= req.O:
                    req.done = True
                    done = True
        if done:
            keep = []
            for r in self.running:
                if r.done:
                    r.done = False
                    if self.role != "prefill":
                        self._complete(r, now)
                else:
                    keep.append(r)
            self.running[:] = keep
            if self.role == "decode" and self.incoming:
                self.try_accept()
        fleet.after_step(self)

    def release_held(self, req) -> None:
        """Prefill role: the request's KV has left; its prompt pages stay cached here."""
        self.held.discard(req)
        self.cache.release(req.rs)
        req.rs = None
        self.wake()
