"""Interpolation of a smooth quantity (log of measured/model time) over a ragged grid in log2 space.

We interpolate the model's residual, not the time itself: the fitted roofline carries the shape
dependence (FLOP, bytes, occupancy), the residual carries what it misses (tile and wave quantisation,
kernel choice), and a residual varies far more slowly than time does. This is AIConfigurator's
"interpolate utilisation against a speed-of-light roofline" (perf_interp_design.md), with our fitted
model in place of the bare roofline. Methods, in order:

1. multilinear on the bracketing hypercube when all its corners are measured and repeatable;
2. lines: along each parameter, with every other parameter equal, the nearest measured points below
   and above: linear in log2 between them ("axis-line"), and each held on its own ("line-nearest", a
   grid's edge or corner). All these estimates are averaged by inverse variance: the points' own
   noise (from their p20-p80 spread) plus the drift the residual shows along that parameter
   (`roughness`, per octave) over the distance bridged. Leave-one-out on a grid exercises this;
3. inverse-distance weighting of the nearest points in octaves, also noise-weighted (ragged grids,
   shapes never measured).

A query outside the bounding box of the points is not interpolated (`None`).
"""

from __future__ import annotations

import itertools

import numpy as np

from k3sim.kernels.points import SIGMA_FLOOR

_TOL = 1e-9  # octaves: coordinates are log2 of integers, so equal ones agree to rounding only
MULTILINEAR_MAX_SIGMA = 0.05  # relative; noisier corners go to the noise-weighted lines (modelling choice)
INTERP_DRIFT = 0.25  # drift allowed across a bracket, per octave of width x roughness (LOO-insensitive 0.1-0.5)


def _unique(x: np.ndarray) -> np.ndarray:
    """`np.unique` of a 1-D float array without NaN, by the same steps (sort, keep each first of equals): its
    first call imports numpy.ma (~15 ms of a warm query's start) to ask whether the array is masked."""
    aux = np.sort(x)
    keep = np.empty(aux.shape, bool)
    keep[:1] = True
    keep[1:] = aux[1:] != aux[:-1]
    return aux[keep]


def _median(x: np.ndarray) -> float:
    """`np.median` of a non-empty 1-D float array by the same arithmetic (the middle value, or the mean
    (a + b) / 2 of the two middle ones; NaN if any value is NaN), without np.median's NaN check, whose first call
    imports numpy.ma (~10-20 ms of a warm query's start)."""
    if np.isnan(x).any():
        return float("nan")
    s = np.sort(x)
    n = len(s)
    return float(s[n // 2]) if n % 2 else float((s[n // 2 - 1] + s[n // 2]) / 2.0)


class ResidualGrid:
    """Points `X` (n x d, log2 of the parameters) with values `z`."""

    # idw_neighbours: the nearest points averaged for a shape off every line; 6 surrounds a query on the
    # 1-3 free axes the ops have (2 per axis) while staying local.
    def __init__(self, X: np.ndarray, z: np.ndarray, sigma: np.ndarray | None = None, idw_neighbours: int = 6):
        self.X = np.asarray(X, float).reshape(len(z), -1)
        self.z = np.asarray(z, float)
        self.sigma = np.full(len(self.z), SIGMA_FLOOR) if sigma is None else np.asarray(sigma, float)
        self.lo = self.X.min(axis=0)
        self.hi = self.X.max(axis=0)
        self.uniq = [_unique(self.X[:, j]) for j in range(self.X.shape[1])]
        # the rounded coordinates as Python floats: equal and hashing alike to `_key`'s numpy floats, one pass
        self._rounded = np.round(self.X, 9)
        self.index = {tuple(row): i for i, row in enumerate(self._rounded.tolist())}
        self.k = idw_neighbours
        self._rough: np.ndarray | None = None

    @property
    def roughness(self) -> np.ndarray:
        """Per parameter: median |change of z| per octave between neighbours along that parameter (the
        others equal). Residuals drift slowly along size axes (tokens, M) and jump along kernel-choice
        axes (head dim, N/K); the interpolator trusts the smooth axes more. Computed once per grid, on the
        first query that needs it (`_axis_slopes`)."""
        if self._rough is None:
            d = self.X.shape[1]
            out = np.full(d, np.nan)
            for j in range(d):
                slopes = self._axis_slopes(j)
                if slopes.size:
                    out[j] = _median(slopes)
            # an axis with no neighbours to compare takes the roughest measured axis (or 1, a residual that
            # may change by e per octave: distrust it); + 1e-3 per octave so even a perfectly flat axis
            # lets distance count in the weights.
            fill = np.nanmax(out) if np.isfinite(out).any() else 1.0
            self._rough = np.where(np.isfinite(out), out, fill) + 1e-3
        return self._rough

    def _axis_slopes(self, j: int) -> np.ndarray:
        """|dz| / dx of every pair of neighbours along parameter j on a line (the other parameters equal, to
        `_key`'s rounding): the points sorted by (the other coordinates, x_j, z), each point against the next
        one on its line where x_j grows. One sort per axis (a dictionary of lines per point cost ~1 ms a grid,
        tens of grids a query)."""
        others = np.delete(self._rounded, j, axis=1)
        x, z = self.X[:, j], self.z
        order = np.lexsort((z, x, *others.T[::-1]))
        o, xs, zs = others[order], x[order], z[order]
        pair = (o[1:] == o[:-1]).all(axis=1) & (xs[1:] > xs[:-1])
        return np.abs(zs[1:] - zs[:-1])[pair] / (xs[1:] - xs[:-1])[pair]

    @staticmethod
    def _key(x) -> tuple:
        return tuple(np.round(np.asarray(x, float), 9))

    def inside(self, q: np.ndarray) -> bool:
        return bool(np.all(q >= self.lo - _TOL) and np.all(q <= self.hi + _TOL))

    def clip(self, q: np.ndarray) -> np.ndarray:
        return np.clip(q, self.lo, self.hi)

    def __call__(self, q) -> tuple[float, str] | None:
        q = np.asarray(q, float)
        if not self.inside(q):
            return None
        i = self.index.get(self._key(q))
        if i is not None:
            return float(self.z[i]), "exact"
        for method in (self._multilinear, self._lines, self._idw):
            out = method(q)
            if out is not None:
                return out
        return None

    def _multilinear(self, q):
        brackets = []
        for j, u in enumerate(self.uniq):
            hit = np.abs(u - q[j]) < _TOL
            if hit.any():
                brackets.append([(u[hit][0], 1.0)])
                continue
            lo, hi = u[u < q[j]].max(), u[u > q[j]].min()
            w = (q[j] - lo) / (hi - lo)
            brackets.append([(lo, 1.0 - w), (hi, w)])
        total = 0.0
        for corner in itertools.product(*brackets):
            i = self.index.get(self._key([c for c, _ in corner]))
            if i is None or self.sigma[i] > MULTILINEAR_MAX_SIGMA:
                return None  # a missing or noisy corner: the lines weigh the noise
            total += float(np.prod([w for _, w in corner])) * self.z[i]
        return total, "multilinear"

    def _lines(self, q):
        """Every estimate the lines through q offer (bracketed interpolation; each point of the line
        held), combined by inverse variance: noise of the points used plus drift allowed by the
        residual's roughness along that axis over the distance bridged."""
        same = np.abs(self.X - q) < _TOL
        vals, weights, bracketed = [], [], False
        for j in range(self.X.shape[1]):
            others = np.delete(same, j, axis=1).all(axis=1)
            if not others.any():
                continue
            xs, zs, ss = self.X[others, j], self.z[others], self.sigma[others]
            rough = self.roughness[j]
            below, above = xs < q[j] - _TOL, xs > q[j] + _TOL
            a = np.flatnonzero(below)[np.argmax(xs[below])] if below.any() else None
            b = np.flatnonzero(above)[np.argmin(xs[above])] if above.any() else None
            if a is not None and b is not None:
                w = (q[j] - xs[a]) / (xs[b] - xs[a])
                vals.append((1 - w) * zs[a] + w * zs[b])
                weights.append(1.0 / (((1 - w) * ss[a]) ** 2 + (w * ss[b]) ** 2
                                      + (INTERP_DRIFT * (xs[b] - xs[a]) * rough) ** 2))
                bracketed = True
            for i in range(len(xs)):
                if abs(xs[i] - q[j]) > _TOL:
                    vals.append(zs[i])
                    weights.append(1.0 / ((abs(xs[i] - q[j]) * rough) ** 2 + ss[i] ** 2))
        if not vals:
            return None
        return float(np.average(vals, weights=weights)), "axis-line" if bracketed else "line-nearest"

    def _idw(self, q):
        d = np.sqrt(((self.X - q) ** 2).sum(axis=1))  # octaves: every parameter counts alike
        order = np.argsort(d)[: self.k]
        w = 1.0 / np.maximum(d[order], 1e-12) ** 2 / self.sigma[order] ** 2
        return float(np.average(self.z[order], weights=w)), "idw"
