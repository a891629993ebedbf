"""KCP backward: the reverse affine scan gives the exact gradient of the loss w.r.t. each rank's outgoing state."""

from __future__ import annotations

import numpy as np
import pytest

from k3sim.kda import kcp_state_grads, loss_with_injection

H, K, V = 2, 3, 2


def brute_grad(q, k, v, a, b, dO, cu, pos):
    """L is affine in the injected state E: G[idx] = L(e_idx) - L(0), exact."""
    base = loss_with_injection(q, k, v, a, b, dO, cu, pos, np.zeros((H, K, V)))
    G = np.zeros((H, K, V))
    for idx in np.ndindex(H, K, V):
        E = np.zeros((H, K, V))
        E[idx] = 1.0
        G[idx] = loss_with_injection(q, k, v, a, b, dO, cu, pos, E) - base
    return G


@pytest.mark.parametrize("P,cu", [(4, [0, 16]), (4, [0, 5, 16]), (4, [0, 8, 16]), (2, [0, 3, 9, 16]),
                                  (8, [0, 7, 16])])
def test_reverse_fold_equals_brute_force_gradient(P, cu):
    rng = np.random.default_rng(P * 100 + len(cu))
    T = 16
    q, k = rng.normal(size=(T, H, K)), rng.normal(size=(T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v, dO = rng.normal(size=(T, H, V)), rng.normal(size=(T, H, V))
    a, b = rng.uniform(0.3, 1.0, size=(T, H, K)), rng.uniform(0.0, 1.0, size=(T, H))
    g = kcp_state_grads(q, k, v, a, b, dO, cu, P)
    for r in range(P):
        ref = brute_grad(q, k, v, a, b, dO, cu, (r + 1) * (T // P))
        scale = max(np.abs(ref).max(), 1.0)
        assert np.abs(g[r] - ref).max() / scale < 1e-9, (P, cu, r)
    assert np.all(g[-1] == 0)                            # nothing after the last rank
