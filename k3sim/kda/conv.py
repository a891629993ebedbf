"""Short causal depthwise convolution (kernel W = 4 in K3) and its context-parallel halo.

y_t = sum_{i<W} w[:, i] x_{t-(W-1)+i}, with positions before the document start treated as zero
(causal_conv1d varlen semantics). Under CP a rank needs the last W-1 input rows of the previous rank,
but only as many as belong to its first local document: valid_len = min(W-1, pre_num_conv_tokens)
(fla `fla/modules/causal_conv1d/cp.py`, fla-core 0.6.0). A document that starts exactly at the rank
edge needs no halo.
"""

from __future__ import annotations

import numpy as np

from k3sim.kda.recurrence import doc_bounds


def short_conv(x: np.ndarray, weight: np.ndarray, cu_seqlens=None, silu: bool = False) -> np.ndarray:
    """x [T, D], weight [D, W] -> y [T, D]; state resets at document starts."""
    T, D = x.shape
    W = weight.shape[1]
    cu = doc_bounds(cu_seqlens, T)
    start = np.repeat(cu[:-1], np.diff(cu))                             # document start of each token
    y = np.zeros_like(x, dtype=float)
    for i in range(W):
        lag = W - 1 - i
        src = np.arange(T) - lag
        ok = src >= start
        y[ok] += weight[:, i] * x[src[ok]]
    return y / (1 + np.exp(-y)) if silu else y


def short_conv_cp(x: np.ndarray, weight: np.ndarray, cu_seqlens, P: int, silu: bool = False
                  ) -> tuple[list[np.ndarray], list[int]]:
    """Each rank's conv output from its own rows plus the halo; also the halo rows each rank used."""
    from k3sim.kda.kcp import rank_contexts

    T, _ = x.shape
    W = weight.shape[1]
    ctxs = rank_contexts(cu_seqlens, T, P, conv_kernel=W)
    tails = [x[c.end - (W - 1):c.end] for c in ctxs]                    # what each rank contributes
    outs, used = [], []
    for c in ctxs:
        n = min(W - 1, c.pre_num_conv_tokens)
        halo = tails[c.rank - 1][W - 1 - n:] if n else x[:0]
        ext = np.concatenate([halo, x[c.start:c.end]])
        cu = np.array(c.cu_seqlens) + n
        cu[0] = 0
        outs.append(short_conv(ext, weight, cu, silu=silu)[n:])
        used.append(n)
    return outs, used
