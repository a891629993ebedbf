"""Batch formation of one engine step: which decodes and prefill chunks run, who is admitted, who is preempted.

vLLM's default (V1 scheduler, chunked prefill on): running requests first (every decode gets its token, then
the running partial prefills continue), then waiting requests are admitted in arrival order while the step's
token budget, `max_num_seqs` and memory allow; a prompt longer than what is left of the budget is split into
chunks. When a decode needs a new KV page and the pool has none, the most recently admitted running request is
preempted by recompute: its pages are released (its prompt pages stay in the prefix cache) and it goes back to
the head of the queue to prefill prompt + generated tokens again.

Sarathi-Serve's stall-free batching (Agrawal et al., OSDI'24) is the option: the same order, but the step's
prefill budget is the largest chunk whose step still meets the TPOT SLO with the decodes riding along, so
prefills never stall decodes past the SLO (with at least one hash block of prefill per step so the queue moves).
The trial chunk carries the cached prefix of the prefill that runs first (its attention reads that prefix).
"""

from __future__ import annotations

from k3sim.prefix_cache.cache import REJECT, WAIT
from k3sim.prefix_cache.pool import MLA


class StepPlan:
    __slots__ = ("decoders", "prefills", "admitted", "rejected", "context_sum")

    def __init__(self) -> None:
        self.context_sum = 0  # tokens the decoders attend to (sum of prompt + generated)
        self.decoders: list = []
        self.prefills: list = []  # (request, chunk tokens, cached prefix tokens before the chunk)
        self.admitted: list = []
        self.rejected: list = []


def _grow_one(rep, req) -> bool:
    """Give a decoding request one more KV page (from its reservation, else the free pool)."""
    rs, pool = req.rs, rep.cache.pool
    if rs.reserve_left > 0:
        rs.blocks.append(pool.allocate(MLA))
        rs.reserve_left -= 1
        pool.reserved -= 1
        return True
    if pool.available() < 1:
        return False
    rs.blocks.append(pool.allocate(MLA))
    rs.total_blocks += 1
    return True


def ensure_decode_pages(rep, decoders: list) -> list:
    """Every decoder needs room for the token it feeds this step; preempt the latest admitted request (by
    recompute) until it fits. Returns the decoders still running."""
    B_p, la = rep.B_p, rep.lookahead  # MTP: the drafts verified this step need KV slots too
    if all(len(r.rs.blocks) * B_p >= r.L + r.generated + la for r in decoders):
        return decoders  # the common case: nobody crosses a page boundary this step
    out = []
    for req in decoders:
        if req.rs is None:  # preempted earlier in this loop
            continue
        while len(req.rs.blocks) * B_p < req.context + la:
            if _grow_one(rep, req):
                continue
            victim = max(rep.running, key=lambda r: r.seq)
            rep.preempt(victim)
            if victim is req:
                break
        if req.rs is not None:
            out.append(req)
    return [r for r in out if r.rs is not None]


def form_batch(rep) -> StepPlan:
    """The step's plan for replica `rep` (an `engine.Replica`)."""
    plan = StepPlan()
    cache, ecfg = rep.cache, rep.ecfg
    B_p, la = rep.B_p, rep.lookahead
    decoders = []
    partial = []  # running requests with prompt tokens still to prefill, in running order
    context_sum = 0
    short = False  # a decoder without a KV slot for this step's tokens
    for r in rep.running:  # one pass: the decoders, their context and whether any crosses a page boundary
        rs = r.rs
        if rs.computed >= r.target:
            decoders.append(r)
            c = r.L + r.generated
            context_sum += c
            if len(rs.blocks) * B_p < c + la:
                short = True
        else:
            partial.append(r)
    if short and rep.role != "prefill":
        decoders = ensure_decode_pages(rep, decoders)
        context_sum = sum(r.L + r.generated for r in decoders)
        partial = [r for r in partial if r.rs is not None]  # a preempted one went back to the queue
    plan.decoders = decoders
    plan.context_sum = context_sum
    nd = len(decoders)
    budget = ecfg.token_budget - nd
    if ecfg.scheduler == "sarathi" and rep.role != "decode" and (partial or rep.waiting):
        # priced with the cached prefix of the chunk that runs first (a running partial prefill's computed
        # tokens; a new admission's cached prefix is known only once admitted: 0); a step with no prefill to
        # schedule needs no budget (and is not a step where the TPOT target was missed at the floor)
        prefix = partial[0].rs.computed if partial else 0
        budget = min(budget, rep.timer.stall_free_budget(nd, plan.context_sum, ecfg.token_budget, rep.B_h, prefix))
    cap = ecfg.chunk_tokens or ecfg.token_budget
    if rep.role == "decode":
        return plan
    for req in partial:
        if budget <= 0:
            break
        rs = req.rs
        before = rs.computed
        n = cache.schedule_prefill(rs, min(budget, cap))
        if n:
            budget -= n
            plan.prefills.append((req, n, before))
    waiting = rep.waiting
    max_batch = ecfg.max_batch
    while waiting and budget > 0 and len(rep.running) < max_batch:
        req = waiting[0]
        rs = rep.admit(req)
        if rs is WAIT:
            break
        waiting.popleft()
        if rs is REJECT:
            plan.rejected.append(req)
            continue
        plan.admitted.append(req)
        rep.running.append(req)
        before = rs.computed
        n = cache.schedule_prefill(rs, min(budget, cap))
        budget -= n
        plan.prefills.append((req, n, before))
    return plan
