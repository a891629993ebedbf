"""Affine maps S -> M S + S~ and their composition: the algebra behind KCP (K3 report eq. 17).

A segment of the recurrence started from state S_in ends in M S_in + S~, where S~ is the same
recurrence started from zero and M the product of the segment's transitions (d_k x d_k per head).
Composition (M2, S~2) o (M1, S~1) = (M2 M1, M2 S~1 + S~2) is associative but not commutative, so
the incoming states of the ranks are a prefix scan, not a sum (as they are in LASP-2, where M = I).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np


@dataclass(frozen=True)
class Affine:
    """Per-head pair: M [H, K, K] (transition) and S [H, K, V] (state reached from zero)."""

    M: np.ndarray
    S: np.ndarray

    @classmethod
    def identity(cls, H: int, K: int, V: int) -> "Affine":
        return cls(np.broadcast_to(np.eye(K), (H, K, K)).copy(), np.zeros((H, K, V)))

    def apply(self, S_in: np.ndarray) -> np.ndarray:
        """The segment's end state when it starts from S_in."""
        return np.einsum("hij,hjv->hiv", self.M, S_in) + self.S

    def nbytes(self, bytes_per_element: float) -> float:
        """Bytes one rank contributes to the all-gather: H x K x (K + V) elements."""
        return (self.M.size + self.S.size) * bytes_per_element


def compose(later: Affine, earlier: Affine) -> Affine:
    """`later` after `earlier`: (M2 M1, M2 S~1 + S~2)."""
    return Affine(np.einsum("hij,hjk->hik", later.M, earlier.M), later.apply(earlier.S))


def fold(pairs: Iterable[Affine], S0: np.ndarray | None = None) -> np.ndarray:
    """Sequential left fold S <- M_j S + S~_j over pairs in sequence order (fla's local merge)."""
    S = S0
    for p in pairs:
        S = p.S.copy() if S is None else p.apply(S)
    if S is None:
        raise ValueError("fold of no pairs needs an initial state")
    return S
