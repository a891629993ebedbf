"""Chunkwise KDA (WY / UT-transform form), the form fla's `chunk_kda` and FlashKDA compute.

Inside a chunk with cumulative decay Gamma_t = prod_{r<=t} alpha_r (per key dim) and
u_t = beta_t (v_t - S_{t-1}^T Diag(alpha_t) k_t), the delta rule becomes S_t = Diag(alpha_t) S_{t-1} + k_t u_t^T.
Stacking the chunk's u gives the lower-triangular system (I + Diag(beta) A) U = Diag(beta)(V - (K*Gamma) S0),
A[t,i] = k_t^T Diag(Gamma_t/Gamma_i) k_i (i < t). Its solution U = U~ - W S0 (the UT transform: U~ and W
do not depend on S0) is what makes the chunk parallel; only the chunk-to-chunk state step
S_end = Diag(Gamma_C) S0 + (K*Gamma_C/Gamma)^T (U~ - W S0) is serial (fla `cp/README.md`, `KCP.md`).
The same two terms give the chunk's affine pair: M = Diag(Gamma_C) - (K*Gamma_C/Gamma)^T W, S~ = (K*Gamma_C/Gamma)^T U~.
"""

from __future__ import annotations

import numpy as np

from k3sim.kda.affine import Affine, compose
from k3sim.kda.recurrence import doc_buffers


def _chunk_terms(q, k, v, alpha, beta):
    """U~, W, A_qk, decay ratios for one chunk; inputs [c, H, *], outputs per head [H, ...]."""
    c = k.shape[0]
    G = np.cumsum(np.log(alpha), axis=0).transpose(1, 0, 2)              # [H, c, K] log Gamma_t
    kh, qh, vh = k.transpose(1, 0, 2), q.transpose(1, 0, 2), v.transpose(1, 0, 2)
    bh = beta.T                                                         # [H, c]
    incl = np.tril(np.ones((c, c), dtype=bool))
    diff = G[:, :, None, :] - G[:, None, :, :]                          # [H, t, i, K] log(Gamma_t/Gamma_i)
    ratio = np.exp(np.where(incl[None, :, :, None], diff, -np.inf))    # zero above the diagonal
    A_kk = np.einsum("htk,htik,hik->hti", kh, ratio, kh) * ~np.eye(c, dtype=bool)
    A_qk = np.einsum("htk,htik,hik->hti", qh, ratio, kh)
    L = np.eye(c)[None] + bh[:, :, None] * A_kk                         # I + Diag(beta) A (unit lower)
    Gam = np.exp(G)
    U_t = np.linalg.solve(L, bh[:, :, None] * vh)                       # U~ = T Diag(beta) V
    W = np.linalg.solve(L, bh[:, :, None] * kh * Gam)                   # W = T Diag(beta) (K*Gamma)
    K_end = kh * np.exp(G[:, -1:, :] - G)                               # K * Gamma_C / Gamma_t
    return U_t, W, A_qk, Gam, K_end


def segment_transition(k, v, alpha, beta, chunk_size: int = 4) -> Affine:
    """(M, S~) of a whole segment from S = 0, composed chunk by chunk as KCP's pre-process does."""
    T, H, K = k.shape
    acc = Affine.identity(H, K, v.shape[-1])
    for s in range(0, T, chunk_size):
        sl = slice(s, min(s + chunk_size, T))
        U_t, W, _, Gam, K_end = _chunk_terms(np.zeros_like(k[sl]), k[sl], v[sl], alpha[sl], beta[sl])
        M = np.eye(K)[None] * Gam[:, -1, None, :] - np.einsum("htk,htj->hkj", K_end, W)
        S = np.einsum("htk,htv->hkv", K_end, U_t)
        acc = compose(Affine(M, S), acc)
    return acc


def kda_chunkwise(q, k, v, alpha, beta, cu_seqlens=None, initial_state=None, chunk_size: int = 4,
                  doc_initial_states: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Outputs [T, H, V] and final states [N, H, K, V]; chunks restart at every document start.

    `doc_initial_states` [N, H, K, V] overrides the initial state per document (KCP's first local doc).
    """
    cu, o, finals, starts = doc_buffers(k, v, cu_seqlens, initial_state, doc_initial_states)
    for n in range(len(cu) - 1):
        S = starts[n]
        for s in range(cu[n], cu[n + 1], chunk_size):
            sl = slice(s, min(s + chunk_size, cu[n + 1]))
            U_t, W, A_qk, Gam, K_end = _chunk_terms(q[sl], k[sl], v[sl], alpha[sl], beta[sl])
            U = U_t - np.einsum("htk,hkv->htv", W, S)                   # U = U~ - W S0
            qg = q[sl].transpose(1, 0, 2) * Gam
            o[sl] = (np.einsum("htk,hkv->htv", qg, S) + np.einsum("hti,hiv->htv", A_qk, U)).transpose(1, 0, 2)
            S = Gam[:, -1, :, None] * S + np.einsum("htk,htv->hkv", K_end, U)
        finals[n] = S
    return o, finals
