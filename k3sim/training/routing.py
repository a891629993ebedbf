"""Expert-parallel load imbalance from a routing distribution, and MoonEP-style redundant experts.

The all-to-all and the expert GEMMs of an EP group finish when the busiest rank does, so both scale by
max/mean of the tokens each EP rank receives. Routing is sampled (seeded): every token picks `topk`
experts from a popularity distribution — uniform (a perfectly balanced router in expectation; only
sampling noise remains) or Zipf with exponent `skew` over a seeded random ranking of the experts (a
modelling choice standing in for a measured router histogram). Experts sit contiguously, E/ep per rank.

MoonEP (MISSION sec. 4): redundant expert slots are planned from the micro-batch's own routing. We plan
them as EPLB does (deepseek-ai/EPLB `balanced_packing`): give the extra replicas one by one to the expert
with the highest load per replica, then pack all replicas onto ranks largest-first onto the least-loaded
rank with a free slot. Draws use the multinomial over experts (top-k without replacement is approximated
by k independent draws: a modelling choice; the difference is < topk/E per token).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Imbalance:
    max_over_mean: float          # busiest EP rank's received tokens / the mean
    samples: int
    routing: str
    redundant_per_rank: int
    tokens_per_group: int

    def describe(self) -> str:
        extra = f", MoonEP {self.redundant_per_rank} redundant slot(s)/rank" if self.redundant_per_rank else ""
        return (f"{self.routing} routing, {self.tokens_per_group} tokens x top-k per EP group, "
                f"{self.samples} seeded samples{extra}: max/mean {self.max_over_mean:.3f}")


def _popularity(num_experts: int, skew: float, rng) -> "object":
    import numpy as np

    if skew <= 0:
        return np.full(num_experts, 1.0 / num_experts)
    w = 1.0 / np.arange(1, num_experts + 1) ** skew
    rng.shuffle(w)
    return w / w.sum()


def _balanced_max(loads, ep: int, slots_per_rank: int) -> float:
    """Max rank load after replicating hot experts into the extra slots and LPT packing."""
    import heapq

    import numpy as np

    E = len(loads)
    reps = np.ones(E, dtype=np.int64)
    heap = [(-float(loads[e]), e) for e in range(E)]
    heapq.heapify(heap)
    for _ in range(ep * slots_per_rank - E):
        _, e = heapq.heappop(heap)
        reps[e] += 1
        heapq.heappush(heap, (-float(loads[e]) / reps[e], e))
    pieces = np.sort(np.repeat(loads / reps, reps))[::-1]
    final = np.zeros(ep)
    used = np.zeros(ep, dtype=np.int64)
    open_ranks = [(0.0, r) for r in range(ep)]
    for w in pieces:
        load, r = heapq.heappop(open_ranks)
        final[r] = load + float(w)
        used[r] += 1
        if used[r] < slots_per_rank:
            heapq.heappush(open_ranks, (final[r], r))
    return float(final.max())


@lru_cache(maxsize=4096)
def ep_imbalance(num_experts: int, ep: int, topk: int, tokens_per_group: int, *, skew: float = 0.0,
                 redundant_per_rank: int = 0, samples: int = 8, seed: int = 0) -> Imbalance:
    """max/mean received tokens over the ranks of one EP group, averaged over seeded routing samples
    (8 by default: a modelling choice trading sampling noise of the mean against time per layout)."""
    import numpy as np

    routing = "uniform" if skew <= 0 else f"zipf({skew:g})"
    if ep <= 1 or tokens_per_group <= 0:
        return Imbalance(1.0, 0, routing, redundant_per_rank, tokens_per_group)
    rng = np.random.default_rng(seed)
    pop = _popularity(num_experts, skew, rng)
    per_rank = num_experts // ep
    ratios = []
    for _ in range(samples):
        loads = rng.multinomial(tokens_per_group * topk, pop).astype(float)
        mean = loads.sum() / ep
        if redundant_per_rank > 0:
            mx = _balanced_max(loads, ep, per_rank + redundant_per_rank)
        else:
            mx = loads.reshape(ep, per_rank).sum(axis=1).max()
        ratios.append(mx / mean if mean > 0 else 1.0)
    return Imbalance(float(np.mean(ratios)), samples, routing, redundant_per_rank, tokens_per_group)
