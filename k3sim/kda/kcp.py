"""KCP, simulated: every rank folds the affine pairs of the ranks its first document spans.

Steps per rank (fla PR #691, `fla/ops/cp/`): (1) the (M, S~) of its last local document fragment from
S = 0; (2) one all-gather of [S~ | M] (H x K x (K + V) elements per rank); (3) the sequential fold
S <- M_j S + S~_j over the `pre_num_ranks` previous ranks; (4) the ordinary chunk kernel with that
initial state for the first local document and zero for every document that starts inside the rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from k3sim.kda.affine import Affine, fold
from k3sim.kda.chunkwise import kda_chunkwise, segment_transition
from k3sim.kda.recurrence import doc_bounds, doc_buffers


@dataclass(frozen=True)
class RankContext:
    """Rank-local view of packed documents (fla `FLACPContext`, contiguous layout)."""

    rank: int
    start: int
    end: int
    cu_seqlens: tuple[int, ...]        # local boundaries, 0 .. end-start
    first_doc: int                     # global index of the first local document
    pre_num_ranks: int                 # previous ranks the first local document spans (fold steps)
    post_num_ranks: int                # later ranks the last local document spans (backward fold)
    pre_num_conv_tokens: int           # tokens of the first local document before this rank


def rank_contexts(cu_seqlens, total: int, P: int, conv_kernel: int | None = None) -> list[RankContext]:
    """Split T tokens into P contiguous parts and clip the document boundaries to each.

    With a conv kernel W, every part must hold the W-1 halo rows its successor needs (fla's check)."""
    if P < 1 or total % P:
        raise ValueError(f"{P} ranks do not divide {total} tokens")
    part = total // P
    if conv_kernel and P > 1 and part < conv_kernel - 1:
        raise ValueError(f"part length {part} is shorter than the conv halo {conv_kernel - 1}")
    cu = doc_bounds(cu_seqlens, total)
    out = []
    for r in range(P):
        s, e = r * part, (r + 1) * part
        first = int(np.searchsorted(cu, s, side="right") - 1)           # doc containing token s
        last = int(np.searchsorted(cu, e - 1, side="right") - 1)        # doc containing token e-1
        local = [s] + [int(b) for b in cu if s < b < e] + [e]
        doc_start, doc_end = int(cu[first]), int(cu[last + 1])
        out.append(RankContext(
            rank=r, start=s, end=e, cu_seqlens=tuple(b - s for b in local), first_doc=first,
            pre_num_ranks=r - doc_start // part, post_num_ranks=(doc_end - 1) // part - r,
            pre_num_conv_tokens=s - doc_start,
        ))
    return out


@dataclass
class KCPResult:
    o: np.ndarray                      # [T, H, V] outputs, concatenated over ranks
    final_states: np.ndarray           # [N, H, K, V] per global document
    contexts: list[RankContext]
    gathered: list[Affine]             # what the all-gather delivered, in rank order
    allgather_bytes_per_rank: float    # one rank's contribution: H x K x (K + V) x bytes


def kcp_forward(q, k, v, alpha, beta, cu_seqlens, P: int, chunk_size: int = 4,
                state_bytes_per_element: float = 4.0) -> KCPResult:
    """Forward of one KDA layer over P simulated ranks; matches `kda_naive` exactly."""
    T, H, K = k.shape
    V = v.shape[-1]
    cu, o, finals, _ = doc_buffers(k, v, cu_seqlens)
    ctxs = rank_contexts(cu, T, P)

    # (1) each rank: affine pair of its last local document fragment, from S = 0
    pairs = []
    for c in ctxs:
        seg = slice(c.start + c.cu_seqlens[-2], c.end)
        pairs.append(segment_transition(k[seg], v[seg], alpha[seg], beta[seg], chunk_size))
    # (2) all-gather (simulated): every rank sees every pair, copied
    gathered = [Affine(p.M.copy(), p.S.copy()) for p in pairs]

    for c in ctxs:
        # (3) fold over the ranks the first local document spans; a document starting here gets 0
        src = gathered[c.rank - c.pre_num_ranks:c.rank]
        S_in = fold(src, np.zeros((H, K, V))) if src else np.zeros((H, K, V))
        n_local = len(c.cu_seqlens) - 1
        init = np.zeros((n_local, H, K, V))
        init[0] = S_in
        # (4) ordinary chunk kernel on the local tokens
        sl = slice(c.start, c.end)
        o_loc, f_loc = kda_chunkwise(q[sl], k[sl], v[sl], alpha[sl], beta[sl], c.cu_seqlens,
                                     chunk_size=chunk_size, doc_initial_states=init)
        o[sl] = o_loc
        for j in range(n_local):
            if c.start + c.cu_seqlens[j + 1] == cu[c.first_doc + j + 1]:  # the document ends here
                finals[c.first_doc + j] = f_loc[j]
    return KCPResult(o, finals, ctxs, gathered, pairs[0].nbytes(state_bytes_per_element))
