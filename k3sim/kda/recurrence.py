"""The KDA recurrence token by token: the ground truth every other form is checked against.

S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
(Kimi Linear / K3 report; fla `fused_recurrent_kda`). With cu_seqlens the state resets to
the initial state (zero by default) at every document start, as fla's varlen mode does.
"""

from __future__ import annotations

import numpy as np


def doc_bounds(cu_seqlens: np.ndarray | list[int] | None, total: int) -> np.ndarray:
    """Validated document boundaries [0, ..., T]; None means one document."""
    if cu_seqlens is None:
        return np.array([0, total], dtype=np.int64)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu[0] != 0 or cu[-1] != total or np.any(np.diff(cu) <= 0):
        raise ValueError(f"cu_seqlens must rise strictly from 0 to {total}, got {cu.tolist()}")
    return cu


def token_transition(k: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """M_t = (I - beta k k^T) Diag(alpha) per head: [H, K, K] from k, alpha [H, K] and beta [H]."""
    kk = np.einsum("hi,hj->hij", k, k)
    eye = np.eye(k.shape[-1])[None]
    return (eye - beta[:, None, None] * kk) * alpha[:, None, :]


def kda_naive(q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray, beta: np.ndarray,
              cu_seqlens=None, initial_state: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Outputs o [T, H, V] and the final state of every document [N, H, K, V]."""
    T, H, K = k.shape
    V = v.shape[-1]
    cu = doc_bounds(cu_seqlens, T)
    o = np.zeros((T, H, V))
    finals = np.zeros((len(cu) - 1, H, K, V))
    for n in range(len(cu) - 1):
        S = np.zeros((H, K, V)) if initial_state is None else np.array(initial_state, dtype=float)
        for t in range(cu[n], cu[n + 1]):
            S = alpha[t][:, :, None] * S                               # Diag(alpha_t) S_{t-1}
            kS = np.einsum("hk,hkv->hv", k[t], S)                     # k_t^T Diag(alpha) S
            S = S + beta[t][:, None, None] * k[t][:, :, None] * (v[t] - kS)[:, None, :]
            o[t] = np.einsum("hk,hkv->hv", q[t], S)                   # o_t = S_t^T q_t
        finals[n] = S
    return o, finals
