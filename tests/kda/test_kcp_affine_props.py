"""Property tests of the affine composition that KCP's prefix scan relies on."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from k3sim.kda import Affine, compose, fold

H, K, V = 2, 3, 2


def pair(seed: int, identity_M: bool = False) -> Affine:
    rng = np.random.default_rng(seed)
    M = np.broadcast_to(np.eye(K), (H, K, K)).copy() if identity_M else rng.normal(size=(H, K, K))
    return Affine(M, rng.normal(size=(H, K, V)))


def close(a: Affine, b: Affine) -> bool:
    return np.allclose(a.M, b.M, rtol=1e-12, atol=1e-12) and np.allclose(a.S, b.S, rtol=1e-12, atol=1e-12)


seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=60, deadline=None)
@given(seeds, seeds, seeds)
def test_associative(s1, s2, s3):
    a, b, c = pair(s1), pair(s2), pair(s3)
    assert close(compose(c, compose(b, a)), compose(compose(c, b), a))


@settings(max_examples=60, deadline=None)
@given(seeds, seeds)
def test_not_commutative(s1, s2):
    """Generic pairs (random Gaussian M) do not commute: order of the ranks matters."""
    a, b = pair(s1), pair(s2 ^ 0x5A5A5A5A if s1 == s2 else s2)
    assert not close(compose(b, a), compose(a, b))


@settings(max_examples=60, deadline=None)
@given(st.lists(seeds, min_size=1, max_size=8))
def test_identity_transition_reduces_to_sum(ss):
    """M = I everywhere: the fold is the plain sum of the local states (LASP-2's all-gather + sum)."""
    pairs = [pair(s, identity_M=True) for s in ss]
    assert np.allclose(fold(pairs, np.zeros((H, K, V))), sum(p.S for p in pairs), rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(seeds, min_size=1, max_size=8), seeds)
def test_fold_equals_composed_map(ss, s0):
    """Folding the pairs one by one from S0 equals applying their composition once."""
    pairs = [pair(s) for s in ss]
    S0 = np.random.default_rng(s0).normal(size=(H, K, V))
    total = pairs[0]
    for p in pairs[1:]:
        total = compose(p, total)
    assert np.allclose(fold(pairs, S0), total.apply(S0), rtol=1e-9, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_identity_element(s):
    a = pair(s)
    e = Affine.identity(H, K, V)
    assert close(compose(a, e), a) and close(compose(e, a), a)
