"""KCP, the chunkwise form and the conv halo against the token-by-token recurrence (float64)."""

from __future__ import annotations

import numpy as np
import pytest

from k3sim.kda import (Affine, fold, kcp_forward, kda_chunkwise, kda_naive, rank_contexts,
                       segment_transition, short_conv, short_conv_cp)

H, K, V = 2, 4, 3


def inputs(T: int, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(T, H, K))
    k = rng.normal(size=(T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)                     # fla: L2-normalised keys
    v = rng.normal(size=(T, H, V))
    alpha = rng.uniform(0.3, 1.0, size=(T, H, K))                       # per-dim decay in (0, 1]
    beta = rng.uniform(0.0, 1.0, size=(T, H))
    return q, k, v, alpha, beta


def random_docs(T: int, P: int, rng) -> list[int]:
    """Random boundaries plus one exactly at a rank edge (when there is an inner edge)."""
    inner = set(rng.choice(np.arange(1, T), size=min(int(rng.integers(0, 4)), T - 1), replace=False).tolist())
    if P > 1:
        inner.add(int(rng.integers(1, P)) * (T // P))
    return [0, *sorted(inner), T]


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_recurrence_one_step_by_hand():
    """H = 1, K = 2, V = 1; k = e1, alpha = (0.5, 0.8), beta = 0.25, v = 3, S0 = (2, 4)^T:
    Diag(alpha) S0 = (1, 3.2); k^T of it = 1; S1 = (1 + 0.25 (3 - 1), 3.2) = (1.5, 3.2); o = (1, 1) . S1 = 4.7."""
    o, f = kda_naive(np.ones((1, 1, 2)), np.array([[[1.0, 0.0]]]), np.array([[[3.0]]]),
                     np.array([[[0.5, 0.8]]]), np.array([[0.25]]), initial_state=np.array([[[2.0], [4.0]]]))
    assert f[0, 0, :, 0].tolist() == [1.5, 3.2] and o[0, 0, 0] == pytest.approx(4.7, rel=1e-15)


@pytest.mark.parametrize("chunk", [1, 3, 4, 8])
def test_chunkwise_equals_naive(chunk):
    q, k, v, a, b = inputs(19, 1)
    S0 = np.random.default_rng(2).normal(size=(H, K, V))
    o1, f1 = kda_naive(q, k, v, a, b, cu_seqlens=[0, 7, 19], initial_state=S0)
    o2, f2 = kda_chunkwise(q, k, v, a, b, cu_seqlens=[0, 7, 19], initial_state=S0, chunk_size=chunk)
    assert rel_err(o2, o1) < 1e-9 and rel_err(f2, f1) < 1e-9


def test_segment_pair_is_eq17():
    """End state from any S_in equals M S_in + S~ (K3 report eq. 17)."""
    q, k, v, a, b = inputs(11, 3)
    S_in = np.random.default_rng(4).normal(size=(H, K, V))
    _, f = kda_naive(q, k, v, a, b, initial_state=S_in)
    pair = segment_transition(k, v, a, b, chunk_size=4)
    assert rel_err(pair.apply(S_in), f[0]) < 1e-9
    _, f0 = kda_naive(q, k, v, a, b)
    assert rel_err(pair.S, f0[0]) < 1e-9                                # S~ is the run from zero


@pytest.mark.parametrize("P", range(1, 9))
def test_kcp_equals_naive(P):
    rng = np.random.default_rng(100 + P)
    for trial in range(3):
        T = P * int(rng.integers(3, 7))
        q, k, v, a, b = inputs(T, 10 * P + trial)
        cu = random_docs(T, P, rng) if trial else [0, T]                 # trial 0: one document
        res = kcp_forward(q, k, v, a, b, cu, P, chunk_size=int(rng.integers(1, 5)))
        o, f = kda_naive(q, k, v, a, b, cu_seqlens=cu)
        assert rel_err(res.o, o) < 1e-9, (P, cu)
        assert rel_err(res.final_states, f) < 1e-9, (P, cu)


def test_kcp_doc_at_every_rank_edge_needs_no_fold():
    T, P = 16, 4
    q, k, v, a, b = inputs(T, 7)
    cu = [0, 4, 8, 12, 16]
    res = kcp_forward(q, k, v, a, b, cu, P)
    assert [c.pre_num_ranks for c in res.contexts] == [0, 0, 0, 0]
    assert rel_err(res.o, kda_naive(q, k, v, a, b, cu_seqlens=cu)[0]) < 1e-9


def test_rank_contexts_hand_worked():
    """T = 24, P = 4 (parts of 6), documents [0,5) [5,20) [20,24).

    rank 0 [0,6):  first doc starts at 0           -> pre 0; last doc [5,20) ends on rank 3 -> post 3
    rank 1 [6,12): first doc started at 5 (rank 0) -> pre 1, conv tokens 6-5 = 1
    rank 2 [12,18): doc started at 5               -> pre 2, conv tokens 7
    rank 3 [18,24): doc started at 5               -> pre 3; local boundaries (0, 2, 6)
    """
    ctx = rank_contexts([0, 5, 20, 24], 24, 4)
    assert [c.pre_num_ranks for c in ctx] == [0, 1, 2, 3]
    assert [c.post_num_ranks for c in ctx] == [3, 2, 1, 0]
    assert [c.pre_num_conv_tokens for c in ctx] == [0, 1, 7, 13]
    assert ctx[3].cu_seqlens == (0, 2, 6)


def test_summing_states_like_lasp2_is_wrong_for_kda():
    """The decayed delta rule needs the fold; adding the local states (LASP-2) misses it."""
    T, P = 12, 3
    q, k, v, a, b = inputs(T, 8)
    res = kcp_forward(q, k, v, a, b, [0, T], P)
    S_sum = res.gathered[0].S + res.gathered[1].S
    S_true = fold(res.gathered[:2], np.zeros((H, K, V)))
    assert rel_err(S_sum, S_true) > 1e-3


def test_allgather_bytes_per_rank():
    """One rank contributes H x K x (K + V) elements: 2 x 4 x (4 + 3) = 56 elements x 4 B = 224 B."""
    q, k, v, a, b = inputs(8, 9)
    assert kcp_forward(q, k, v, a, b, [0, 8], 2, state_bytes_per_element=4).allgather_bytes_per_rank == 224


@pytest.mark.parametrize("P", range(1, 9))
def test_conv_halo_equals_global_conv(P):
    rng = np.random.default_rng(200 + P)
    T = P * int(rng.integers(3, 6))
    x = rng.normal(size=(T, 5))
    w = rng.normal(size=(5, 4))
    cu = random_docs(T, P, rng)
    outs, used = short_conv_cp(x, w, cu, P, silu=True)
    assert rel_err(np.concatenate(outs), short_conv(x, w, cu, silu=True)) < 1e-12
    assert all(n <= 3 for n in used)


def test_conv_halo_respects_doc_boundaries():
    """T = 12, P = 3 (parts of 4), docs [0,4) [4,9) [9,12): rank 1 starts a doc -> no halo;
    rank 2 starts at 8, its doc began at 4 -> 4 tokens back, capped at W - 1 = 3."""
    x = np.arange(24.0).reshape(12, 2)
    _, used = short_conv_cp(x, np.ones((2, 4)), [0, 4, 9, 12], 3)
    assert used == [0, 0, 3]


def test_identity_pair_leaves_state():
    S = np.random.default_rng(1).normal(size=(H, K, V))
    assert np.array_equal(Affine.identity(H, K, V).apply(S), S)


def test_rank_split_must_divide():
    with pytest.raises(ValueError):
        rank_contexts([0, 10], 10, 3)


def test_conv_halo_needs_w_minus_1_rows_per_rank():
    x = np.zeros((8, 2))
    with pytest.raises(ValueError, match="halo"):
        short_conv_cp(x, np.ones((2, 4)), [0, 8], 4)    # parts of 2 rows < W - 1 = 3
