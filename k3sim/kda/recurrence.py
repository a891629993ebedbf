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


def token_update(S: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """One step of the delta rule, per head [H, K, V]: S_t = Diag(alpha) S + beta k (v^T - k^T Diag(alpha) S)."""
    S = alpha[:, :, None] * S                                          # Diag(alpha_t) S_{t-1}
    kS = np.einsum("hk,hkv->hv", k, S)                                 # k_t^T Diag(alpha) S
    return S + beta[:, None, None] * k[:, :, None] * (v - kS)[:, None, :]


def doc_buffers(k: np.ndarray, v: np.ndarray, cu_seqlens, initial_state: np.ndarray | None = None,
                doc_initial_states: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What every per-document form starts from: validated boundaries cu, zeroed outputs o [T, H, V] and
    final states [N, H, K, V], and each document's start state [N, H, K, V] (`doc_initial_states[n]`,
    else `initial_state`, else zero)."""
    T, H, K = k.shape
    V = v.shape[-1]
    cu = doc_bounds(cu_seqlens, T)
    shape = (len(cu) - 1, H, K, V)
    if doc_initial_states is not None:
        starts = np.array(doc_initial_states, dtype=float).reshape(shape)
    elif initial_state is not None:
        starts = np.broadcast_to(np.asarray(initial_state, dtype=float), shape).copy()
    else:
        starts = np.zeros(shape)
    return cu, np.zeros((T, H, V)), np.zeros(shape), starts


def kda_naive(q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray, beta: np.ndarray,
              cu_seqlens=None, initial_state: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Outputs o [T, H, V] and the final state of every document [N, H, K, V]."""
    cu, o, finals, starts = doc_buffers(k, v, cu_seqlens, initial_state)
    for n in range(len(cu) - 1):
        S = starts[n]
        for t in range(cu[n], cu[n + 1]):
            S = token_update(S, k[t], v[t], alpha[t], beta[t])
            o[t] = np.einsum("hk,hkv->hv", q[t], S)                   # o_t = S_t^T q_t
        finals[n] = S
    return o, finals
