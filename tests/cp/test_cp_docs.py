"""Document boundaries: fold steps agree with the reference KCP contexts; masked pair counts by brute force."""

from __future__ import annotations

import numpy as np
import pytest

from k3sim.cp import docs as D
from k3sim.kda import rank_contexts


def brute_pairs(bounds, q, k):
    n = 0
    for t in range(*q):
        start = max(b for b in bounds[:-1] if b <= t)
        n += sum(1 for s in range(*k) if start <= s <= t)
    return n


@pytest.mark.parametrize("seed", range(6))
def test_fold_steps_match_reference_contexts(seed):
    rng = np.random.default_rng(seed)
    P = int(rng.integers(2, 9))
    S = P * int(rng.integers(3, 9))
    inner = sorted(set(rng.choice(np.arange(1, S), size=int(rng.integers(0, 5)), replace=False).tolist())
                   | {int(rng.integers(1, P)) * (S // P)})
    bounds = np.array([0, *inner, S])
    pre, post = D.fold_steps(bounds, S, P)
    last, first = D.segment_lengths(bounds, S, P)
    ctx = rank_contexts(bounds, S, P)
    assert pre.tolist() == [c.pre_num_ranks for c in ctx]
    assert post.tolist() == [c.post_num_ranks for c in ctx]
    assert last.tolist() == [c.cu_seqlens[-1] - c.cu_seqlens[-2] for c in ctx]
    assert first.tolist() == [c.cu_seqlens[1] for c in ctx]


def test_one_document_folds_all_previous_ranks():
    pre, post = D.fold_steps(np.array([0, 64]), 64, 8)
    assert pre.tolist() == list(range(8)) and post.tolist() == list(range(7, -1, -1))


def test_documents_at_rank_edges_need_no_fold():
    pre, _ = D.fold_steps(D.doc_bounds(64, docs=8), 64, 8)
    assert pre.tolist() == [0] * 8


@pytest.mark.parametrize("q,k", [((0, 8), (0, 8)), ((8, 16), (0, 8)), ((0, 8), (8, 16)), ((4, 13), (2, 9))])
def test_pairs_closed_form_and_masked(q, k):
    assert D.attention_pairs(None, q, k) == brute_pairs([0, 16], q, k)
    b = np.array([0, 5, 11, 16])
    assert D.attention_pairs(b, q, k) == brute_pairs(b.tolist(), q, k)


def test_causal_diagonal_block():
    """L(L+1)/2 pairs for a causal L x L block; a full off-diagonal block has L^2."""
    assert D.attention_pairs(None, (0, 100), (0, 100)) == 100 * 101 / 2
    assert D.attention_pairs(None, (100, 200), (0, 100)) == 100 ** 2


def test_zigzag_balances_contiguous_does_not():
    """Without docs, zigzag gives every rank (2P-1) full c x c blocks + 2 diagonals; contiguous rank r does r + 1/2."""
    S, P = 64, 4
    zz = D.pair_matrix(None, S, P, "zigzag").sum(axis=1)
    ct = D.pair_matrix(None, S, P, "contiguous").sum(axis=1)
    c, L = S // (2 * P), S // P
    assert np.allclose(zz, (2 * P - 1) * c * c + 2 * c * (c + 1) / 2)
    assert ct.tolist() == [r * L * L + L * (L + 1) / 2 for r in range(P)]
    assert zz.sum() == ct.sum() == S * (S + 1) / 2


def test_docs_cut_masked_work():
    """8 equal documents of 8 tokens: 8 x 36 pairs instead of 64 x 65 / 2."""
    b = D.doc_bounds(64, docs=8)
    assert D.pair_matrix(b, 64, 4, "contiguous").sum() == 8 * 8 * 9 / 2


def test_sampled_doc_lengths_pack_exactly():
    lens = D.sample_doc_lengths(100_000, 3000, seed=1)
    assert sum(lens) == 100_000 and min(lens) >= 1
    assert lens == D.sample_doc_lengths(100_000, 3000, seed=1)
    assert D.sample_doc_lengths(100, 1e12) == [100]          # mean far above S: one document, truncated
    assert D.sample_doc_lengths(50, 1e-9) == [1] * 50         # mean far below a token: one-token documents


def test_docs_and_explicit_lengths_are_exclusive():
    from k3sim.errors import InputError

    with pytest.raises(InputError, match="not both"):
        D.doc_bounds(64, docs=4, doc_lengths=[32, 32])
