"""Residual interpolation on ragged grids in log2 space."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from k3sim.kernels.interp import ResidualGrid


def linear(x):
    return 0.3 * x[0] - 0.2 * x[1] + 1.0


@pytest.fixture
def full_grid():
    X = np.array(list(itertools.product(range(5), range(4))), float)
    return X, np.array([linear(x) for x in X])


def test_exact_and_multilinear(full_grid):
    X, z = full_grid
    g = ResidualGrid(X, z)
    assert g(X[7]) == (pytest.approx(z[7]), "exact")
    val, method = g(np.array([1.5, 2.25]))
    assert method == "multilinear"
    assert val == pytest.approx(linear([1.5, 2.25]))


def test_axis_lines_when_the_point_is_left_out(full_grid):
    X, z = full_grid
    keep = ~((X[:, 0] == 2) & (X[:, 1] == 1))
    g = ResidualGrid(X[keep], z[keep])
    val, method = g(np.array([2.0, 1.0]))
    assert method == "axis-line"
    # the bracketed lines are exact on a linear field; the held neighbours, averaged in for noise
    # robustness, pull it by under 1 %
    assert val == pytest.approx(linear([2, 1]), rel=0.01)


def test_noisy_points_count_less():
    X = np.array([[0.0], [1.0], [2.0], [3.0], [4.0]])
    z = np.array([0.0, 0.0, 0.0, 1.0, 0.0])  # one noisy point
    clean = ResidualGrid(X, z, sigma=np.full(5, 0.02))
    noisy = ResidualGrid(X, z, sigma=np.array([0.02, 0.02, 0.02, 1.0, 0.02]))
    q = np.array([2.5])
    assert noisy(q)[0] < 0.5 * clean(q)[0]


def test_roughness_prefers_the_smooth_axis():
    # z jumps along axis 1 (a kernel-choice parameter), is flat along axis 0 (a size parameter)
    X = np.array(list(itertools.product(range(4), range(3))), float)
    z = np.array([0.5 * (x[1] % 2) for x in X])
    keep = ~((X[:, 0] == 3) & (X[:, 1] == 1))  # a corner in axis 0, bracketed in axis 1
    g = ResidualGrid(X[keep], z[keep])
    assert g.roughness[0] < g.roughness[1]
    val, _ = g(np.array([3.0, 1.0]))
    assert val == pytest.approx(0.5, abs=0.05)  # held along the smooth axis, not averaged across the jump


def test_idw_on_ragged_points_and_outside():
    X = np.array([[0, 0], [3, 1], [1, 3], [4, 4]], float)
    z = np.array([1.0, 2.0, 3.0, 4.0])
    g = ResidualGrid(X, z)
    val, method = g(np.array([2.0, 2.0]))
    assert method == "idw"
    # inverse squared distance in octaves (equal noise): d^2 = 8, 2, 2, 8 -> (1/8 + 2/2 + 3/2 + 4/8) / (5/4)
    assert val == pytest.approx(2.5)
    assert g(np.array([5.0, 2.0])) is None
    assert g(np.array([-0.5, 2.0])) is None
    assert np.allclose(g.clip(np.array([5.0, -1.0])), [4.0, 0.0])


def test_line_nearest_at_a_corner(full_grid):
    X, z = full_grid
    keep = ~((X[:, 0] == 0) & (X[:, 1] == 0))
    g = ResidualGrid(X[keep], z[keep])
    val, method = g(np.array([0.0, 0.0]))
    assert method == "line-nearest"
    lo, hi = sorted([linear([1, 0]), linear([0, 1])])
    assert lo <= val <= hi  # the two held neighbours, weighted by the drift along each axis
    # axis 1 drifts less per octave (0.2 against 0.3): its neighbour, linear([0, 1]) = 0.8, weighs more, so
    # the estimate lies below the midpoint (equal or swapped roughness puts it above: 1.09, 1.23)
    assert g.roughness == pytest.approx([0.301, 0.201])
    assert val < (lo + hi) / 2


def test_roughness_by_hand_and_the_median_is_numpys():
    """Lines along x (y equal): y=0 has z 0, 0.3, 0.5 at x 0, 1, 2 (slopes 0.3, 0.2), y=1 has z 1.0, 0.6 at x 0, 1
    (0.4): median 0.3. Along y: x=0 rises 1.0, x=1 0.3, x=2 has one point: median (1.0 + 0.3) / 2 = 0.65. Each
    + 1e-3. Points given out of order (the sort inside must not depend on it). `_median` (no numpy.ma import) is
    np.median bit for bit, even and odd counts and NaN alike."""
    import numpy as np

    from k3sim.kernels.interp import _median

    X = np.array([[1, 1], [2, 0], [0, 0], [1, 0], [0, 1]], float)
    z = np.array([0.6, 0.5, 0.0, 0.3, 1.0])
    assert ResidualGrid(X, z).roughness == pytest.approx([0.301, 0.651])
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 8, 9, 50):
        x = rng.random(n) * 10.0 ** rng.uniform(-6, 2)
        assert _median(x) == float(np.median(x))
    assert np.isnan(_median(np.array([1.0, np.nan, 2.0])))
