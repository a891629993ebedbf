"""The one routing distribution of an EP group: expert popularity, top-k inclusion, placement of the slots.

Both the EP all-to-all (`k3sim.comm.ep`: which ranks a token's copies reach) and the step's expert load
(`k3sim.step.layers.expert_load`: the busiest expert GPU) read it from here, so the busiest rank of the
dispatch and the busiest expert GPU come from one distribution on one placement.

The all-to-all and the expert GEMMs of an EP group finish when the busiest rank does, so both scale by
max/mean of the (token, expert) pairs each EP rank receives. Popularity (`popularity`) is uniform (a
perfectly balanced router in expectation) or Zipf with exponent `skew` over a seeded random ranking of the
experts (a modelling choice standing in for a measured router histogram). A token picks an expert at most
once, so an expert's picks per token are min(1, c w_e) with c set so that they sum to topk
(`top_k_inclusion`, water-filling), which binds only for the hot experts of a skewed router. The step draws
routing (seeded) from the multinomial over experts with these capped per-draw probabilities
(`inclusion_probabilities`: top-k without replacement approximated by k independent draws, a modelling
choice; the difference is < topk/E per token); the all-to-all needs which ranks one token's whole top-k set
reaches, so it takes the maximum-entropy design of k distinct experts with the same inclusion
probabilities (conditional Poisson sampling, `cps_weights`).

Placements of the experts (and of the redundant slots) on the EP ranks:
- contiguous, no redundant slots: E/ep experts per rank in id order (DeepEP: dst_rank = expert //
  num_local_experts; the seeded ranking puts the hot experts at random ranks);
- MoonEP (training, MISSION sec. 4; `ep_imbalance`): redundant slots planned from each micro-batch's own
  routing;
- EPLB (serving; `eplb_placement`, `eplb_imbalance`): slots planned once from the routing distribution's
  expected (capped) load, as DeepSeek's EPLB rebalances from load statistics collected over a window of
  serving (DeepSeek-V3 report, arXiv 2412.19437 sec. 3.4: redundant experts "based on statistics from the
  online deployment ... adjusted periodically"); each batch's routing is then served by that fixed
  placement, a replicated expert's tokens split evenly over its replicas.
Both plans follow deepseek-ai/EPLB's global policy: give the extra replicas one by one to the expert with
the highest load per replica (`replicate_experts`), then pack the replicas largest-first onto the
least-loaded rank with a free slot (`balanced_packing`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

# Fit of the design's weights (`cps_weights`): stop when every inclusion probability is within this
# relative tolerance of its target, or this many picks per token (1e-15: below a billionth of a copy at a
# million tokens); the step count bounds the work (Zipf 0.2-10 on 3-896 experts, top-1 to 100, take <= 37).
CPS_RTOL = 1e-12
CPS_ATOL = 1e-15
CPS_MAX_ITER = 1000


@dataclass(frozen=True)
class Imbalance:
    max_over_mean: float          # busiest EP rank's received (token, expert) pairs / the mean
    samples: int
    routing: str
    redundant_per_rank: int       # MoonEP slots per rank (training)
    tokens_per_group: int
    redundant_slots: int = 0      # EPLB slots over the whole EP group (serving)
    placement: str = "moonep"     # "moonep" (planned per batch) | "eplb" (planned from the distribution)

    def describe(self) -> str:
        if self.placement == "eplb" and not self.samples:
            return f"{self.routing} load, {self.tokens_per_group} tokens per EP group, not sampled: max/mean 1"
        if self.placement == "eplb":
            place = (f", EPLB placement of {self.redundant_slots} redundant slot(s) from the routing distribution"
                     if self.redundant_slots else ", contiguous placement")
            return (f"{self.routing} routing, {self.tokens_per_group} tokens x top-k per EP group, "
                    f"{self.samples} seeded samples{place}: max/mean {self.max_over_mean:.3f}")
        extra = f", MoonEP {self.redundant_per_rank} redundant slot(s)/rank" if self.redundant_per_rank else ""
        return (f"{self.routing} routing, {self.tokens_per_group} tokens x top-k per EP group, "
                f"{self.samples} seeded samples{extra}: max/mean {self.max_over_mean:.3f}")


def _popularity(num_experts: int, skew: float, rng) -> "object":
    """Popularity drawn from `rng` (the ranking is its first use, so the routing draws that follow it on the
    same generator are the step's seeded samples)."""
    import numpy as np

    if skew <= 0:
        return np.full(num_experts, 1.0 / num_experts)
    w = 1.0 / np.arange(1, num_experts + 1, dtype=float) ** float(skew)
    rng.shuffle(w)
    return w / w.sum()


def popularity(num_experts: int, skew: float, seed: int):
    """Expert popularity (sums to 1): uniform for skew <= 0, else Zipf weights 1/rank^skew over the ranking
    shuffled by `numpy.random.default_rng(seed)`."""
    import numpy as np

    return _popularity(num_experts, skew, np.random.default_rng(seed))


def top_k_inclusion(weights, topk: int):
    """Picks per token of each expert (sums to topk, at most 1): q_e = min(1, c w_e), c set so that
    sum_e q_e = topk (water-filling: the capped experts are taken out and the rest rescaled until none
    exceeds 1). An expert with q_e = 1 is in every token's top-k. `weights` itself times topk when no
    expert reaches 1 pick per token."""
    import numpy as np

    w = np.asarray(weights, dtype=float)
    if topk * float(w.max()) <= 1.0:
        return topk * w
    q = np.zeros_like(w)
    capped = np.zeros(len(w), dtype=bool)
    while True:
        free = w[~capped].sum()
        q[~capped] = w[~capped] * (topk - capped.sum()) / free
        over = (q > 1.0) & ~capped
        if not over.any():
            break
        capped |= over
        q[capped] = 1.0
    return q


def inclusion_probabilities(weights, topk: int):
    """Per-draw probabilities (summing to 1) whose k-fold expectation caps every expert at one pick per
    token: `top_k_inclusion` / topk. `weights` itself (the same array) when no expert reaches 1 pick per
    token, so an uncapped distribution draws bit-identically."""
    import numpy as np

    w = np.asarray(weights, dtype=float)
    if topk * float(w.max()) <= 1.0:
        return w
    return top_k_inclusion(w, topk) / topk


def _leave_one_out(w, k: int):
    """(A, B): A_e = e_{k-1}(w without e), B_e = e_k(w without e), the elementary symmetric polynomials of
    the other experts' weights, from prefix sums e_j(w_0 .. w_{e-1}) and suffix sums over the experts
    after e (each a cumulative sum of positive terms, so no cancellation however close to 1 an inclusion
    probability is; the forward recursion pi(n) from pi(n - 1) loses digits there). Weights scaled to sum
    k keep e_j <= k^j / j! inside float64 for k up to ~700."""
    import numpy as np

    E = len(w)
    P = np.zeros((E, k + 1))
    P[:, 0] = 1.0
    for j in range(1, k + 1):
        P[1:, j] = np.cumsum(w[:-1] * P[:-1, j - 1])
    S = np.ones(E)  # the suffix column of degree j, from j = 0 up
    A, B = P[:, k - 1] * S, P[:, k] * S
    for j in range(1, k + 1):
        nxt = np.zeros(E)
        nxt[:-1] = np.cumsum((w[1:] * S[1:])[::-1])[::-1]
        S = nxt
        B += P[:, k - j] * S
        if j <= k - 1:
            A += P[:, k - 1 - j] * S
    return A, B


def cps_inclusion(weights, k: int):
    """Inclusion probabilities of conditional Poisson sampling of k distinct experts, P(set S) ~
    prod_{e in S} w_e (Chen, Dempster and Liu 1994, Biometrika 81(3) 457-469; Tille 2006, Sampling
    Algorithms, sec. 5.6): pi_e = w_e e_{k-1}(w without e) / e_k(w), with e_k(w) = e_k(w without e) +
    w_e e_{k-1}(w without e)."""
    import numpy as np

    w = np.asarray(weights, dtype=float)
    w = w * (k / w.sum())
    A, B = _leave_one_out(w, k)
    return w * A / (w * A + B)


def cps_weights(targets, k: int):
    """Weights of the conditional Poisson design of k distinct experts whose inclusion probabilities are
    `targets` (each in (0, 1), summing to k): the maximum-entropy design with these inclusion
    probabilities (Chen, Dempster and Liu 1994). A_e and B_e (`_leave_one_out`) do not depend on w_e, so
    pi_e = t_e has the one solution w_e = t_e / (1 - t_e) x B_e / A_e given the other weights; each step
    moves every weight half way there in log space (the full step, a Jacobi iteration, oscillates for a
    target above ~0.5 at small k: 39 of 390 seeded Zipf cases failed to converge, none with the half
    step, in at most 37 steps), from the Poisson-sampling odds t / (1 - t), until each inclusion
    probability is within `CPS_RTOL` of its target (or `CPS_ATOL` picks per token). Raises ValueError if
    that takes more than `CPS_MAX_ITER` steps."""
    import numpy as np

    t = np.asarray(targets, dtype=float)
    odds = t / (1.0 - t)
    w = odds * (k / odds.sum())
    for _ in range(CPS_MAX_ITER):
        A, B = _leave_one_out(w, k)
        pi = w * A / (w * A + B)
        if np.all(np.abs(pi - t) <= np.maximum(CPS_RTOL * t, CPS_ATOL)):
            return w
        w = np.sqrt(w * odds * B / A)
        w *= k / w.sum()
    raise ValueError(f"conditional Poisson weights for top-{k} of {len(t)} experts did not converge to "
                     f"{CPS_RTOL:g} in {CPS_MAX_ITER} steps (largest target {float(t.max()):.6f})")


def _replicate(loads, extra: int):
    """Replicas per expert: each extra one to the expert with the highest load per replica (EPLB
    replicate_experts; ties to the lower expert id)."""
    import numpy as np

    reps = np.ones(len(loads), dtype=np.int64)
    heap = [(-float(loads[e]), e) for e in range(len(loads))]
    heapq.heapify(heap)
    for _ in range(extra):
        _, e = heapq.heappop(heap)
        reps[e] += 1
        heapq.heappush(heap, (-float(loads[e]) / reps[e], e))
    return reps


def _slots(pieces: int, ep: int) -> list[int]:
    """Slots of each rank: pieces // ep, one more on the first pieces % ep ranks."""
    return [pieces // ep + (1 if r < pieces % ep else 0) for r in range(ep)]


def _pack(weights, ep: int, capacity: int | list[int]):
    """Pieces onto ranks, largest first onto the least-loaded rank with a free slot (EPLB balanced_packing;
    ties to the lower piece index, then the lower rank). `capacity`: slots per rank (one for all, or each
    rank's). Returns (rank of each piece in the order given, final load of each rank)."""
    import numpy as np

    cap = [capacity] * ep if isinstance(capacity, int) else list(capacity)
    order = np.argsort(-np.asarray(weights), kind="stable")
    rank_of = np.zeros(len(weights), dtype=np.int64)
    final = np.zeros(ep)
    used = np.zeros(ep, dtype=np.int64)
    open_ranks = [(0.0, r) for r in range(ep) if cap[r] > 0]
    for i in order:
        load, r = heapq.heappop(open_ranks)
        rank_of[i] = r
        final[r] = load + float(weights[i])
        used[r] += 1
        if used[r] < cap[r]:
            heapq.heappush(open_ranks, (final[r], r))
    return rank_of, final


def _balanced_max(loads, ep: int, slots_per_rank: int) -> float:
    """Max rank load after replicating hot experts into the extra slots and LPT packing (MoonEP: the plan
    is made from these very loads)."""
    import numpy as np

    reps = _replicate(loads, ep * slots_per_rank - len(loads))
    pieces = np.sort(np.repeat(loads / reps, reps))[::-1]
    return float(_pack(pieces, ep, slots_per_rank)[1].max())


def _contiguous_ranks(num_experts: int, ep: int):
    """Rank of each expert in id order: rank r holds experts r E // ep .. (r + 1) E // ep - 1 (E/ep each
    when ep divides E)."""
    import numpy as np

    starts = (np.arange(ep + 1) * num_experts) // ep
    return np.repeat(np.arange(ep), np.diff(starts))


def place(loads, ep: int, redundant: int):
    """(expert of each slot, rank of each slot, replicas per expert) for experts of expected `loads`: with
    no redundant slot the experts stay contiguous; else EPLB over E + R slots (`_slots` per rank), replicas
    by load per replica, packed largest-first."""
    import numpy as np

    E = len(loads)
    if redundant <= 0:
        return np.arange(E), _contiguous_ranks(E, ep), np.ones(E, dtype=np.int64)
    loads = np.asarray(loads, dtype=float)
    reps = _replicate(loads, redundant)
    expert_of = np.repeat(np.arange(E), reps)
    rank_of, _ = _pack(loads[expert_of] / reps[expert_of], ep, _slots(E + redundant, ep))
    return expert_of, rank_of, reps


def rank_groups(expert_of, rank_of, reps, ep: int) -> list[list[tuple[int, float]]]:
    """A placement as each rank's (expert, share of that expert's picks), experts in id order."""
    held: list[dict[int, float]] = [dict() for _ in range(ep)]
    for e, r in zip(expert_of.tolist(), rank_of.tolist()):
        held[r][e] = held[r].get(e, 0.0) + 1.0 / float(reps[e])
    return [sorted(h.items()) for h in held]


@lru_cache(maxsize=4096)
def ep_imbalance(num_experts: int, ep: int, topk: int, tokens_per_group: int, *, skew: float = 0.0,
                 redundant_per_rank: int = 0, samples: int = 8, seed: int = 0) -> Imbalance:
    """max/mean received pairs over the ranks of one EP group, averaged over seeded routing samples (8 by
    default: a modelling choice trading sampling noise of the mean against time per layout); MoonEP's
    `redundant_per_rank` slots per rank planned from each sample's own routing (training)."""
    import numpy as np

    routing = "uniform" if skew <= 0 else f"zipf({skew:g})"
    if ep <= 1 or tokens_per_group <= 0:
        return Imbalance(1.0, 0, routing, redundant_per_rank, tokens_per_group)
    rng = np.random.default_rng(seed)
    p = inclusion_probabilities(_popularity(num_experts, skew, rng), topk)
    home = _contiguous_ranks(num_experts, ep)
    per_rank = -(-num_experts // ep)
    ratios = []
    for _ in range(samples):
        loads = rng.multinomial(tokens_per_group * topk, p).astype(float)
        mean = loads.sum() / ep
        if redundant_per_rank > 0:
            mx = _balanced_max(loads, ep, per_rank + redundant_per_rank)
        else:
            mx = np.bincount(home, weights=loads, minlength=ep).max()
        ratios.append(mx / mean if mean > 0 else 1.0)
    return Imbalance(float(np.mean(ratios)), samples, routing, redundant_per_rank, tokens_per_group)


@lru_cache(maxsize=256)
def eplb_placement(num_experts: int, ep: int, topk: int, redundant: int, skew: float, seed: int):
    """(per-draw probabilities of the experts, expert of each slot, rank of each slot, replicas per
    expert) of the EPLB plan for the routing distribution: `place` by the expected (capped) loads
    (`inclusion_probabilities`). Depends on the layout only, so a serving run plans it once; the
    all-to-all (`k3sim.comm.ep`) and the expert load (`eplb_imbalance`) both use it."""
    p = inclusion_probabilities(popularity(num_experts, skew, seed), topk)
    return (p, *place(p, ep, redundant))


@lru_cache(maxsize=4096)
def eplb_imbalance(num_experts: int, ep: int, topk: int, tokens_per_group: int, *, redundant: int = 0,
                   skew: float = 0.0, samples: int = 8, seed: int = 0) -> Imbalance:
    """max/mean received pairs over the ranks of one EP group under the EPLB placement of `redundant`
    slots in all (`eplb_placement`), averaged over seeded routing samples of `tokens_per_group` tokens
    (the same seeded ranking and draws as `ep_imbalance`). A replicated expert's pairs split evenly
    over its replicas."""
    import numpy as np

    routing = "uniform" if skew <= 0 else f"zipf({skew:g})"
    if ep <= 1 or tokens_per_group <= 0:
        return Imbalance(1.0, 0, routing, 0, tokens_per_group, redundant, "eplb")
    p, expert_of, rank_of, reps = eplb_placement(num_experts, ep, topk, redundant, skew, seed)
    rng = np.random.default_rng(seed)
    _popularity(num_experts, skew, rng)  # the same stream as the placement's ranking, then the draws
    share = 1.0 / reps[expert_of]
    ratios = []
    for _ in range(samples):
        loads = rng.multinomial(tokens_per_group * topk, p).astype(float)
        per_rank = np.bincount(rank_of, weights=loads[expert_of] * share, minlength=ep)
        mean = loads.sum() / ep
        ratios.append(float(per_rank.max()) / mean if mean > 0 else 1.0)
    return Imbalance(float(np.mean(ratios)), samples, routing, 0, tokens_per_group, redundant, "eplb")


__all__ = ["Imbalance", "cps_inclusion", "cps_weights", "ep_imbalance", "eplb_imbalance", "eplb_placement",
           "inclusion_probabilities", "place", "popularity", "rank_groups", "top_k_inclusion"]
