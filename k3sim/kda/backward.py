"""KCP backward, reference: the gradient of the loss with respect to the state a rank hands on.

For a segment entered with state S_in, every later state is S_t = P_t S_in + (terms without S_in), where
P_t is the product of the token transitions so far. With upstream output gradients dO_t, the loss
L = sum_t <dO_t, S_t^T q_t> therefore has dL/dS_in = P_T^T dL/dS_out + sum_t P_t^T q_t dO_t^T.
That is again an affine pair, (dM, dS~) = (M^T, sum_t P_t^T q_t dO_t^T), scanned in reverse: rank r folds
the pairs of the `post_num_ranks` ranks after it, each computed on that rank's *first* local document
fragment (fla `chunk_gated_delta_rule_bwd_dhu_pre_process`, `KCP.md` "Pre-Process Backward").
"""

from __future__ import annotations

import numpy as np

from k3sim.kda.affine import Affine, fold
from k3sim.kda.kcp import rank_contexts
from k3sim.kda.recurrence import doc_bounds, token_transition, token_update


def segment_backward_pair(q, k, alpha, beta, dO) -> Affine:
    """(dM, dS~) of one segment for the reverse scan: dL/dS_in = dM dL/dS_out + dS~."""
    T, H, K = k.shape
    Pt = np.broadcast_to(np.eye(K), (H, K, K)).copy()
    dS = np.zeros((H, K, dO.shape[-1]))
    for t in range(T):
        Pt = np.einsum("hij,hjk->hik", token_transition(k[t], alpha[t], beta[t]), Pt)
        dS += np.einsum("hji,hj,hv->hiv", Pt, q[t], dO[t])          # P_t^T q_t dO_t^T
    return Affine(np.transpose(Pt, (0, 2, 1)), dS)


def kcp_state_grads(q, k, v, alpha, beta, dO, cu_seqlens, P: int) -> np.ndarray:
    """dL/dS at the end of every rank [P, H, K, V], from the reverse fold over later ranks only."""
    T, H, K = k.shape
    V = v.shape[-1]
    ctxs = rank_contexts(doc_bounds(cu_seqlens, T), T, P)
    pairs = []
    for c in ctxs:
        seg = slice(c.start, c.start + c.cu_seqlens[1])               # first local document fragment
        pairs.append(segment_backward_pair(q[seg], k[seg], alpha[seg], beta[seg], dO[seg]))
    out = np.zeros((P, H, K, V))
    for c in ctxs:
        later = pairs[c.rank + 1:c.rank + 1 + c.post_num_ranks]
        if later:
            out[c.rank] = fold(reversed(later), np.zeros((H, K, V)))
    return out


def loss_with_injection(q, k, v, alpha, beta, dO, cu_seqlens, pos: int, E: np.ndarray) -> float:
    """sum_t <dO_t, o_t> when E is added to the state right after token pos-1 (same document only).

    The brute-force reference for `kcp_state_grads`: L is affine in E, so its gradient is exact from
    K x V + 1 evaluations."""
    T, H, K = k.shape
    cu = doc_bounds(cu_seqlens, T)
    total = 0.0
    for n in range(len(cu) - 1):
        S = np.zeros((H, K, v.shape[-1]))
        for t in range(cu[n], cu[n + 1]):
            if t == pos and t > cu[n]:
                S = S + E
            S = token_update(S, k[t], v[t], alpha[t], beta[t])
            total += float(np.sum(dO[t] * np.einsum("hk,hkv->hv", q[t], S)))
    return total
