"""Packed documents over a CP group: what they change in the fold and in masked attention FLOPs.

A packed sequence holds several documents; the KDA state and the attention mask both reset at a
document start. Under KCP a rank folds only the ranks its first document spans (fla `pre_num_ranks`);
under softmax attention a query sees only keys of its own document, so a doc mask removes whole
(query block, key block) pairs from ring and all-gather schemes.
"""

from __future__ import annotations

import numpy as np

from k3sim.errors import InputError


def doc_bounds(seq_len: int, docs: int | None = None, doc_lengths: list[int] | None = None) -> np.ndarray:
    """Boundaries [0, ..., S]: one document, `docs` equal documents, or explicit lengths."""
    if doc_lengths is not None and docs is not None:
        raise InputError("give --docs or --doc-mean-tokens, not both", source="--docs")
    if doc_lengths is not None:
        lens = np.asarray(doc_lengths, dtype=np.int64)
        if lens.size == 0 or np.any(lens <= 0) or lens.sum() != seq_len:
            raise InputError(f"document lengths must be positive and sum to {seq_len}", field="doc_lengths")
        return np.concatenate([[0], np.cumsum(lens)])
    n = 1 if docs is None else int(docs)
    if n < 1 or n > seq_len:
        raise InputError(f"docs must be between 1 and the sequence length {seq_len}, got {n}", source="--docs")
    return np.round(np.linspace(0, seq_len, n + 1)).astype(np.int64)


def sample_doc_lengths(seq_len: int, mean_tokens: float, seed: int = 0) -> list[int]:
    """Exponential document lengths (mean `mean_tokens`) packed into S tokens, last one truncated."""
    if seq_len <= 0:
        raise InputError(f"sequence length must be positive, got {seq_len}", source="--seq-len")
    if not mean_tokens > 0 or not np.isfinite(mean_tokens):
        raise InputError(f"mean document length must be positive and finite, got {mean_tokens}",
                         source="--doc-mean-tokens")
    if seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed}", source="--seed")
    rng = np.random.default_rng(seed)
    out, left = [], seq_len
    while left > 0:
        n = int(min(left, max(1, round(rng.exponential(mean_tokens)))))
        out.append(n)
        left -= n
    return out


def rank_ranges(seq_len: int, P: int, layout: str) -> list[list[tuple[int, int]]]:
    """Token ranges each rank holds: contiguous S/P, or zigzag chunks r and 2P-1-r of S/(2P)."""
    if layout == "contiguous":
        L = seq_len // P
        return [[(r * L, (r + 1) * L)] for r in range(P)]
    c = seq_len // (2 * P)
    return [[(r * c, (r + 1) * c), ((2 * P - 1 - r) * c, (2 * P - r) * c)] for r in range(P)]


def fold_steps(bounds: np.ndarray, seq_len: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: pre_num_ranks (forward fold steps) and post_num_ranks (backward), contiguous layout."""
    L = seq_len // P
    starts = np.arange(P) * L
    first = np.searchsorted(bounds, starts, side="right") - 1
    last = np.searchsorted(bounds, starts + L - 1, side="right") - 1
    pre = np.arange(P) - bounds[first] // L
    post = (bounds[last + 1] - 1) // L - np.arange(P)
    return pre.astype(int), post.astype(int)


def segment_lengths(bounds: np.ndarray, seq_len: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: tokens of its last local document (forward pre-process) and of its first (backward)."""
    L = seq_len // P
    starts = np.arange(P) * L
    last_start = np.maximum(bounds[np.searchsorted(bounds, starts + L - 1, side="right") - 1], starts)
    first_end = np.minimum(bounds[np.searchsorted(bounds, starts, side="right")], starts + L)
    return (starts + L - last_start).astype(int), (first_end - starts).astype(int)


def _causal_pairs_nodoc(qa: int, qb: int, ka: int, kb: int) -> float:
    """sum_{t in [qa,qb)} clip(t - ka + 1, 0, kb - ka): keys s in [ka, kb) with s <= t."""
    def F(x: float) -> float:  # sum_{t<x} clip(t-ka+1, 0, w), closed form
        w = kb - ka
        n_ramp = min(max(x - ka, 0), w)             # t in [ka, ka+n_ramp): values 1..n_ramp
        n_full = max(x - (ka + w), 0)               # t >= kb-1+1: value w
        return n_ramp * (n_ramp + 1) / 2 + n_full * w
    return F(qb) - F(qa)


def attention_pairs(bounds: np.ndarray | None, q: tuple[int, int], k: tuple[int, int]) -> float:
    """(query, key) pairs a causal, document-masked attention computes for query range q, key range k."""
    qa, qb = q
    ka, kb = k
    if bounds is None or len(bounds) == 2:
        return _causal_pairs_nodoc(qa, qb, ka, kb)
    t = np.arange(qa, qb, dtype=np.int64)
    start = bounds[np.searchsorted(bounds, t, side="right") - 1]
    n = np.minimum(t, kb - 1) - np.maximum(start, ka) + 1
    return float(np.clip(n, 0, None).sum())


def pair_matrix(bounds: np.ndarray | None, seq_len: int, P: int, layout: str) -> np.ndarray:
    """pairs[r, j]: pairs rank r's queries compute against rank j's keys."""
    ranges = rank_ranges(seq_len, P, layout)
    out = np.zeros((P, P))
    for r in range(P):
        for j in range(P):
            out[r, j] = sum(attention_pairs(bounds, q, k) for q in ranges[r] for k in ranges[j])
    return out
