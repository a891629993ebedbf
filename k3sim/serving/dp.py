"""An attention-data-parallel replica: `dp` rank engines stepping in lockstep behind a DP load balancer.

Attention DP (SGLang `--enable-dp-attention`, DeepSeek's inference system: deployed-systems.md sec. 2) gives
every rank of a replica its own requests, scheduler, KV/state pool and prefix cache; the ranks run attention on
their own batches and meet at every MoE layer, whose all-to-all joins their tokens. So the ranks step together:
each step every rank with work forms its own batch (`engine.Replica.plan_step`), and the step lasts

    max over ranks of the rank-local part of its batch + the expert side at the ranks' tokens

(`stepcost.DPStepCost`: routed experts at the sum of the ranks' tokens, dispatch and combine at the busiest
rank's). Strictly every MoE layer waits for that layer's slowest rank; the max of the ranks' whole local parts
equals the sum of those per-layer maxima when one rank is the slowest in every layer (layers of one kind scale
alike with a rank's batch) and is below it when, in a hybrid model, one rank's long-context decodes are the
slowest in the MLA layers and another's prefill chunk in the KDA layers (a modelling choice).
A rank with nothing to do still steps (a dummy batch, SGLang's IDLE forward mode, with no tokens in the
all-to-all) while any rank works: a request that reaches it mid-step starts at the next step of the group. Its
local part is no larger than a working rank's, so the max is over the working ranks.

The balancer (a replica's front door; the fleet's router has already picked the replica):
- prompts (mixed and prefill replicas) go to the rank with the fewest prefill tokens outstanding once this
  prompt's uncached tokens are added (a rank holding its prefix adds fewer), ties by KV bytes pinned, then
  requests, then rank order: DeepSeek's prefill balancer (tokens and core-attention work per DP rank) and
  SGLang's DataParallelController `minimum_tokens` method; the uncached count is a modelling choice, so prompts of
  one conversation stay with their cache while the loads are level;
- KV hand-offs (P/D decode replicas) go to the rank with the fewest KV bytes pinned, ties by requests: DeepSeek's
  decode balancer (KV-cache use and requests per DP rank).
A preempted request's recompute is not added back to its rank's outstanding tokens (a balancer estimate only).
Sarathi's stall-free budget of a rank is priced with that rank's batch on every rank (the step model's
uniform answer, `DPStepCost.__call__`); the step itself is priced from all the ranks' batches.
"""

from __future__ import annotations

import math

from k3sim.serving.engine import RESTORING, Replica, StepTimer
from k3sim.procs import checkpoint


class GroupClock:
    """Seconds of one lockstep step of a DP replica's working ranks, from their batches [(rank, nd, cs, prefill)].

    With a `stepcost.DPStepCost` (it has `local` and `expert`): max over ranks of the memoised local part + the
    slowest EP group's expert side (one group in the usual layout, EP over all ranks). Any other step function
    (tests' model-free clocks) is each rank's whole step: the max of them."""

    def __init__(self, fn):
        expert = getattr(fn, "expert", None)
        self.local = StepTimer(fn.local if expert is not None else fn)
        self.expert = expert
        self.q = getattr(fn, "q", 1)
        self.group = getattr(fn, "group", 1)

    def __call__(self, batches) -> float:
        local, q, g = self.local, self.q, self.group
        loc = 0.0
        prefill = False
        groups: dict[int, list[int]] = {}  # EP group -> [tokens, busiest rank's tokens, busiest rank's decodes]
        for rank, nd, cs, pf in batches:
            t = local(nd, cs, pf)
            if t > loc:
                loc = t
            tok = nd * q
            if pf:
                prefill = True
                tok += sum(c for c, _ in pf)
            acc = groups.get(rank // g)
            if acc is None:
                groups[rank // g] = [tok, tok, nd]
            else:
                acc[0] += tok
                acc[1] = max(acc[1], tok)
                acc[2] = max(acc[2], nd)
        if self.expert is None:
            return loc
        expert = self.expert
        return loc + max(expert(prefill, tot, mt if prefill else mnd) for tot, mt, mnd in groups.values())


def cached_blocks(rank, keys) -> int:
    """Hash blocks of `keys` whose MLA KV the rank's (or a replica's) cache indexes (a read-only probe), in its
    GPU pool or an offload tier under it (a cache-aware router remembers what it sent where, whichever tier now
    holds it)."""
    idx = rank.cache.mla_index
    store = getattr(rank.cache, "offload", None)
    okv = store.kv if store is not None else ()
    n = 0
    for k in keys:
        if k not in idx and k not in okv:
            break
        n += 1
    return n


class DPReplica:
    """One attention-DP replica: `dp` `engine.Replica` ranks (each a 1/dp share of the GPUs with the per-rank
    pool `cache_cfg`), the balancer in front of them and the lockstep loop (`run`)."""

    def __init__(self, fleet, idx: int, role: str, cache_cfg, ecfg, timer: StepTimer, gpus: int, dp: int,
                 clock: GroupClock, *, mtp: int = 0, advance: float = 1.0):
        self.fleet = fleet
        self.env = fleet.env
        self.idx = idx
        self.role = role
        self.gpus = gpus
        self.clock = clock
        self.ranks = [Replica(fleet, idx, role, cache_cfg, ecfg, timer, gpus / dp, rank=i, mtp=mtp, advance=advance)
                      for i in range(dp)]
        self.step_end_s = 0.0
        self.steps = 0  # lockstep steps of the replica (each rank counts the steps it worked)
        self.routed = 0  # requests the fleet's router gave this replica

    # ------------------------------------------------------------------ what the fleet reads
    @property
    def running(self) -> bool:
        return any(r.running for r in self.ranks)

    @property
    def next_landing_s(self) -> float:
        return min(r.next_landing_s for r in self.ranks)

    def load(self) -> int:
        return sum(r.load() for r in self.ranks)

    def cached_blocks(self, keys) -> int:
        """The longest prefix of `keys` any rank's cache holds (the router's view of this replica)."""
        return max(cached_blocks(r, keys) for r in self.ranks)

    # ------------------------------------------------------------------ the balancer
    def submit(self, req) -> None:
        B_h, keys, L = self.ranks[0].B_h, req.keys, req.L
        tied: list = []  # (rank, its uncached tokens of this prompt) at the fewest outstanding tokens
        low = math.inf
        for r in self.ranks:
            est = max(0, L - B_h * cached_blocks(r, keys))
            t = r.backlog + est
            if t < low:
                low, tied = t, [(r, est)]
            elif t == low:
                tied.append((r, est))
        best, est = tied[0] if len(tied) == 1 else min(tied, key=lambda x: (x[0].used_bytes(), x[0].load(),
                                                                            x[0].rank))
        req.route_tokens = est
        best.backlog += est
        best.submit(req)

    def accept_transfer(self, req) -> None:
        best = min(self.ranks, key=lambda r: (r.used_bytes(), r.load(), r.rank))
        best.accept_transfer(req)

    # ------------------------------------------------------------------ the lockstep loop
    def _batches(self, work, n: int) -> list:
        out = []
        for r, p in work:
            nd = len(p.decoders)
            if p.prefills:
                out.append((r.rank, nd, p.context_sum, tuple((c, pre) for _, c, pre in p.prefills)))
            else:
                out.append((r.rank, nd, r.mid_context(p, n) if n > 1 else p.context_sum, ()))
        return out

    def run(self):
        env, fleet, ranks, clock = self.env, self.fleet, self.ranks, self.clock
        while True:
            checkpoint()  # a Ctrl-C whose exception a finaliser swallowed (k3sim.procs)
            if self.role == "decode":
                for r in ranks:
                    if r.incoming:
                        r.try_accept()
            busy = [r for r in ranks if r.running or r.waiting]
            if not busy:
                ev = env.event()
                for r in ranks:
                    r._wake_ev = ev
                yield ev
                for r in ranks:
                    r._wake_ev = None
                continue
            work = []
            for r in busy:
                plan = r.plan_step()
                if plan is not None and plan is not RESTORING:
                    work.append((r, plan))
            if not work:
                landing = min(r.restore_landing_s() for r in busy)
                if landing < math.inf:  # every busy rank waits for a restore: idle until one lands or one is woken
                    ev = env.event()
                    for r in ranks:
                        r._wake_ev = ev
                    yield env.any_of([env.timeout(landing - env.now), ev])
                    for r in ranks:
                        r._wake_ev = None
                continue  # else every waiting request was rejected
            now = env.now
            n = 1
            if not any(p.prefills for _, p in work):
                n = min(r.stretch_limit(p) for r, p in work)
                dt = clock(self._batches(work, 1))
                if n > 1:
                    horizon = min(fleet.horizon(self), min(r.restore_landing_s() for r in ranks)) - now
                    if horizon < math.inf:
                        n = min(n, max(1, math.ceil(horizon / dt)))
                    if n > 1:
                        dt = n * clock(self._batches(work, n))
            else:
                dt = clock(self._batches(work, 1))
                for _, p in work:
                    for req, _, _ in p.prefills:
                        if req.scheduled_s != req.scheduled_s:
                            req.scheduled_s = now
            end = now + dt
            self.step_end_s = end
            for r, _ in work:
                r.step_end_s = end
            yield env.timeout(dt)
            self.steps += n
            for r, p in work:
                r.finish_step(p, n, dt)
