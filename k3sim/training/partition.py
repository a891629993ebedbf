"""Cost-balanced split of a model's layers over pipeline stages.

Why: splitting by layer count leaves the step waiting on the costliest stage. Kimi K3 interleaves one MLA
layer with three KDA layers, and at 1M-token context an MLA layer (all-gathered latent K/V, causal attention
over the whole sequence) costs more than ten KDA layers: on the committed 1M scenario (TP8 CP32 PP16 v2) the
rank holding three MLA layers took 5.36 s per micro-batch against 1.26 s for the first (issue 22; the
planning report's stage table shows today's figures), and every other rank idles for the difference in
every micro-batch of the 1F1B steady state. Megatron-LM lets a user move layers by hand
(`--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers`; recent versions take a whole
per-stage layout) and torchtitan's manual split names the cut layers (`pipeline_parallel_split_points`);
this module finds the cut from the step model's own per-layer seconds instead.

The problem (contiguous layers, minimise the slowest part) is the linear partition problem; for one chunk per
rank it is solved exactly by a dynamic programme over prefix sums whose cut index is monotone in the prefix
length, O(L x parts) (Skiena, The Algorithm Design Manual, sec. 8.5, linear partition; the monotone cut is
the standard two-pointer speed-up). With v virtual stages (Megatron's interleaved layout: chunk c on rank
c % pp) a rank's load is the sum of v non-adjacent chunks; see `balanced_split` for the method and its bound.
"""

from __future__ import annotations

import math

from k3sim.errors import InputError


def _prefix(costs: list[float]) -> list[float]:
    out = [0.0]
    for c in costs:
        out.append(out[-1] + c)
    return out


def _chunks_of(bounds: list[int]) -> list[list[int]]:
    return [list(range(bounds[c], bounds[c + 1])) for c in range(len(bounds) - 1)]


def _exact_bounds(P: list[float], parts: int, first: float, last: float) -> list[int]:
    """Cut points b_0 = 0 < b_1 < ... < b_parts = L of the contiguous split of the layers (prefix sums `P`) into
    `parts` non-empty parts minimising the largest part, `first` added to part 0 and `last` to the last.

    dp[k][j] = the best bottleneck of the first j layers in k parts = min over i of max(dp[k-1][i], P[j] - P[i]).
    dp[k-1][.] is non-decreasing and P[j] - P[.] non-increasing in i, so their max is a valley in i, and the
    valley moves right as j grows (P[j] - P[i] rises by the same amount for every i): one pointer per k."""
    L = len(P) - 1
    if parts == 1:
        return [0, L]
    dp = [math.inf] * (L + 1)
    for j in range(1, L - parts + 2):
        dp[j] = first + P[j]
    cuts: list[list[int]] = [[]]          # cuts[k][j]: start of the last part of the best split of j layers
    for k in range(2, parts):
        new, cut = [math.inf] * (L + 1), [0] * (L + 1)
        i = k - 1
        for j in range(k, L - (parts - k) + 1):
            pj = P[j]
            here = dp[i] if dp[i] > pj - P[i] else pj - P[i]
            while i + 1 < j:
                nxt = dp[i + 1] if dp[i + 1] > pj - P[i + 1] else pj - P[i + 1]
                if nxt > here:
                    break
                i, here = i + 1, nxt
            new[j], cut[j] = here, i
        cuts.append(cut)
        dp = new
    # the last part carries `last`: only j = L is needed, a plain scan
    best_i = min(range(parts - 1, L), key=lambda i: (max(dp[i], P[L] - P[i] + last), i))
    bounds, j = [L, best_i], best_i
    for k in range(parts - 1, 1, -1):
        j = cuts[k - 1][j]
        bounds.append(j)
    bounds.append(0)
    return bounds[::-1]


def _rank_loads(P: list[float], bounds: list[int], pp: int, first: float, last: float) -> list[float]:
    loads = [0.0] * pp
    n = len(bounds) - 1
    for c in range(n):
        loads[c % pp] += P[bounds[c + 1]] - P[bounds[c]]
    loads[0] += first
    loads[(n - 1) % pp] += last
    return loads


def _shed(P: list[float], bounds: list[int], pp: int, first: float, last: float) -> list[int]:
    """Local search for interleaved layouts: move one boundary layer between two neighbouring chunks (two
    different ranks) while that lowers (slowest rank's seconds, sum of squared rank seconds)
    lexicographically, the steepest move first. The slowest rank never rises and, while it stays, the squares
    fall by more than a rounding error each move, so no split recurs and the search ends. The squares let a
    move between two other ranks make room that the slowest can use next."""
    b = list(bounds)
    n = len(b) - 1
    tol = 1e-12 * max(1.0, P[-1] + first + last)
    while True:
        loads = _rank_loads(P, b, pp, first, last)     # afresh each move: no drift from running sums
        top = sorted(range(pp), key=loads.__getitem__, reverse=True)[:3]
        worst = loads[top[0]]
        best, best_score = None, (worst, -tol)     # (slowest rank, change of the sum of squares) to beat
        for e in range(1, n):                  # boundary e between chunk e - 1 and chunk e
            left, right = (e - 1) % pp, e % pp
            for give, take, layer, ok in ((right, left, b[e], b[e + 1] - b[e] > 1),
                                          (left, right, b[e] - 1, b[e] - b[e - 1] > 1)):
                w = P[layer + 1] - P[layer]
                if not ok or w <= 0:
                    continue
                lg, lt = loads[give] - w, loads[take] + w
                rest = next((loads[r] for r in top if r != give and r != take), 0.0)
                score = (max(rest, lg, lt), lg * lg + lt * lt - loads[give] ** 2 - loads[take] ** 2)
                if score[0] < best_score[0] - tol or (score[0] <= best_score[0] and score[1] < best_score[1]):
                    best, best_score = (e, 1 if give == right else -1), score
        if best is None:
            return b
        b[best[0]] += best[1]


def _greedy_bounds(P: list[float], pp: int, v: int, height: float, first: float, last: float,
                   nearest: bool) -> list[int]:
    """Chunks in order, each rank's remaining budget (`height` less what its earlier chunks took) spread evenly
    over its remaining chunks: a chunk takes layers while they fit its share (`nearest`: or while one more layer
    lands nearer the share than one fewer); every chunk keeps at least one layer and leaves one for each later
    chunk; the last chunk takes the rest."""
    L, n = len(P) - 1, pp * v
    rem = [height] * pp
    rem[0] -= first
    rem[(n - 1) % pp] -= last
    b, pos = [0], 0
    for c in range(n - 1):
        r, left = c % pp, v - c // pp
        share, stop = rem[r] / left, L - (n - c - 1)
        end = pos + 1
        while end < stop and P[end + 1] - P[pos] <= share:
            end += 1
        if nearest and left > 1 and end < stop and P[end + 1] - P[pos] - share < share - (P[end] - P[pos]):
            end += 1
        rem[r] -= P[end] - P[pos]
        b.append(end)
        pos = end
    b.append(L)
    return b


def _greedy_scan(P: list[float], pp: int, v: int, lo: float, hi: float, first: float, last: float,
                 steps: int = 8) -> list[int]:
    """The best `_greedy_bounds` over heights from `lo` (the lower bound: all seconds / pp) to `hi` (a split
    already found): the greedy is not monotone in the height, so heights are scanned, not bisected."""
    best, best_s = None, math.inf
    for s in range(steps + 1):
        height = lo + (hi - lo) * s / steps
        for nearest in (False, True):
            b = _greedy_bounds(P, pp, v, height, first, last, nearest)
            worst = max(_rank_loads(P, b, pp, first, last))
            if worst < best_s:
                best, best_s = b, worst
    return best


def _window_split(P: list[float], lo: int, hi: int, offsets: list[float]) -> list[int]:
    """Exact split of layers [lo, hi) into len(offsets) non-empty chunks minimising max_t (offsets[t] + chunk t's
    seconds): the min-max DP over every cut (no monotone cut here: the offsets differ), as numpy matrices."""
    import numpy as np

    seg = np.asarray(P[lo:hi + 1])
    m = hi - lo
    idx = np.arange(m + 1)
    span = np.where(idx[:, None] < idx[None, :], seg[None, :] - seg[:, None], np.inf)   # [i, j]: layers i..j-1
    best = offsets[0] + span[0]
    args = []
    for off in offsets[1:]:
        cost = np.maximum(best[:, None], off + span)
        arg = cost.argmin(axis=0)
        best = cost[arg, idx]
        args.append(arg)
    bounds, j = [m], m
    for arg in reversed(args):
        j = int(arg[j])
        bounds.append(j)
    bounds.append(0)
    return [lo + x for x in reversed(bounds)]


def _polish(P: list[float], bounds: list[int], pp: int, first: float, last: float, width: int = 8,
            passes: int = 6) -> list[int]:
    """Re-split each window of `width` (at most pp) consecutive chunks, which sit on distinct ranks, exactly
    given every other chunk's seconds (`_window_split`), keeping a window's split when it lowers (slowest rank,
    sum of squared rank seconds) lexicographically. A wider neighbourhood than `_shed`'s single layers: it
    moves a costly layer across several chunks at once, which tight splits (few layers per chunk) need. Only
    windows holding a chunk of the slowest rank are tried (no other window can lower it), for a few passes."""
    b, n = list(bounds), len(bounds) - 1
    k = min(width, pp, n)
    loads = _rank_loads(P, b, pp, first, last)
    cur = (max(loads), sum(y * y for y in loads))
    tol = 1e-12 * max(1.0, P[-1] + first + last)
    for _ in range(passes):
        top = max(range(pp), key=loads.__getitem__)
        starts = sorted({s for c in range(top, n, pp) for s in range(max(0, c - k + 1), min(c, n - k) + 1)})
        improved = False
        for s in starts:
            ranks = [(s + t) % pp for t in range(k)]
            offsets = [loads[r] - (P[b[s + t + 1]] - P[b[s + t]]) for t, r in enumerate(ranks)]
            window = _window_split(P, b[s], b[s + k], offsets)
            new_loads = list(loads)
            for t, r in enumerate(ranks):
                new_loads[r] = offsets[t] + P[window[t + 1]] - P[window[t]]
            sc = (max(new_loads), sum(y * y for y in new_loads))
            if sc[0] < cur[0] - tol or (sc[0] <= cur[0] and sc[1] < cur[1] - tol):
                b = b[:s] + window + b[s + k + 1:]
                loads, cur, improved = _rank_loads(P, b, pp, first, last), sc, True
        if not improved:
            break
    return b


def _check(costs: list[float], pp: int, v: int) -> None:
    if pp < 1 or v < 1:
        raise InputError(f"pp={pp} and virtual_stages={v} must be at least 1", source="stage split", field="pp")
    if len(costs) < pp * v:
        raise InputError(f"{len(costs)} layers cannot fill pp x virtual_stages = {pp * v} chunks of at least one "
                         "layer: lower pp or virtual_stages", source="stage split", field="pp")
    if any(not math.isfinite(c) or c < 0 for c in costs):
        raise InputError("layer costs must be finite and non-negative seconds", source="stage split",
                         field="layer_costs")


def balanced_split(layer_costs: list[float], pp: int, v: int = 1, first_extra: float = 0.0,
                   last_extra: float = 0.0) -> list[list[int]]:
    """Contiguous 0-based layers of each virtual chunk c = 0 .. pp*v - 1 (chunk c on rank c % pp, as Megatron's
    interleaved layout and `k3sim.memory.layout.rank_layers` place them), every chunk at least one layer,
    minimising the slowest pipeline rank's seconds: the sum of its chunks' layer costs, `first_extra` (the
    embedding) on chunk 0 and `last_extra` (the LM head) on the last chunk.

    v == 1: exact (`_exact_bounds`, O(L x pp)). v > 1 (no exact method short of a search over every rank's
    load): the pp*v chunks are balanced exactly, which bounds every rank at v x the best chunk bottleneck B.
    Counting the embedding and the head as items fixed to the ends, B <= T / (pp v) + the costliest item c_max
    (T: all items' seconds; greedy parts filled to that height each hold at least T / (pp v), so pp v of them
    cover everything), so every rank is at most T / pp + v c_max, and T / pp is a lower bound of any split.
    Three starts (the uniform split, the chunk-balanced one, `_greedy_scan`'s rank-budget fill) are improved
    by `_shed` (single boundary layers), the best of them by `_polish` (exact re-splits of windows of
    consecutive chunks); neither raises the slowest rank, and the uniform split itself stays a candidate, so
    the result is never worse than uniform nor than the chunk bound. Measured against every split of 1,973
    random small cases (pp <= 4, v 2-3, <= 12 layers): 88 % optimal, the worst 50 % above the optimum. On
    K3's per-layer seconds (32K and 1M, pp 2-32) it lands within 11 % of T / pp, as close as the exact v = 1
    split gets (10-14 % at pp 16-32: whole layers), except 1M at pp 32, v 2 (32 %; 24 MLA layers of 2 s over
    32 ranks of about three layers each)."""
    from k3sim.memory.layout import chunk_layers

    costs = [float(c) for c in layer_costs]
    _check(costs, pp, v)
    P, parts = _prefix(costs), pp * v
    uniform = [0]
    for c in chunk_layers(len(costs), parts):
        uniform.append(uniform[-1] + len(c))
    balanced = _exact_bounds(P, parts, first_extra, last_extra)
    candidates = [uniform, balanced]          # uniform first: a tie keeps the split by layer count
    if v > 1 and pp > 1:
        lo = (P[-1] + first_extra + last_extra) / pp
        hi = max(_rank_loads(P, balanced, pp, first_extra, last_extra))
        greedy = _greedy_scan(P, pp, v, lo, hi, first_extra, last_extra)
        shed = [_shed(P, b, pp, first_extra, last_extra) for b in (uniform, balanced, greedy)]
        top = min(shed, key=lambda b: max(_rank_loads(P, b, pp, first_extra, last_extra)))
        candidates += shed + [_shed(P, _polish(P, top, pp, first_extra, last_extra), pp, first_extra, last_extra)]
    best, best_s = candidates[0], max(_rank_loads(P, candidates[0], pp, first_extra, last_extra))
    for b in candidates[1:]:
        worst = max(_rank_loads(P, b, pp, first_extra, last_extra))
        if worst < best_s - 1e-12 * best_s:   # a better split, not a rounding difference
            best, best_s = b, worst
    return _chunks_of(best)


def rank_seconds(chunks: list[list[int]], layer_costs: list[float], pp: int, first_extra: float = 0.0,
                 last_extra: float = 0.0) -> list[float]:
    """Seconds of each pipeline rank for a chunk list (chunk c on rank c % pp): what `balanced_split`
    minimises the largest of."""
    loads = [0.0] * pp
    for c, layers in enumerate(chunks):
        loads[c % pp] += sum(layer_costs[i] for i in layers)
    loads[0] += first_extra
    loads[(len(chunks) - 1) % pp] += last_extra
    return loads
