"""Measured shapes of one op as arrays, with the uncertainty each measurement carries.

The uncertainty comes from the repetitions' p20-p80 spread and the harness's warm-up flag
(`MeasurementStore.points`); fits and interpolation weigh shapes by it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from k3sim.kernels.ops import OpSpec


def work(spec: OpSpec, points) -> tuple[np.ndarray, np.ndarray]:
    """FLOP and minimal bytes (wire bytes for collectives) of every row of `points`."""
    rows = points[list(spec.params)].to_dict("records")
    flop = np.array([spec.flop(r) for r in rows], float)
    nbytes = np.array([spec.bytes(r) for r in rows], float)
    return flop, nbytes


# Modelling choices (not measured): how much less a flagged or tight row is trusted.
WARMUP_SIGMA = 0.25  # relative uncertainty given to a row measured right after a compile (store.points)
SIGMA_FLOOR = 0.02  # relative: run-to-run drift a tight p20-p80 spread does not show (clocks, another GPU)


def point_sigma(spread: np.ndarray) -> np.ndarray:
    """Relative uncertainty of a measured time from its repetitions' p20-p80 spread (p20-p80 of a normal
    spans 1.68 sigma), with a floor. Launch-bound shapes (tens of microseconds, CPU jitter) come out
    noisy and count less in fits and interpolation than repeatable ones."""
    return np.sqrt((np.asarray(spread, float) / 1.68) ** 2 + SIGMA_FLOOR ** 2)


@dataclass
class PointSet:
    """Measured shapes of one op as arrays: params (n x d ints, in OpSpec order), median seconds, row
    counts, run ids, FLOP and bytes."""

    params: np.ndarray
    seconds: np.ndarray
    rows: np.ndarray
    runs: list[str]
    flop: np.ndarray
    nbytes: np.ndarray
    sigma: np.ndarray  # relative uncertainty of each median (from its p20-p80 spread), for weighting
    feats: np.ndarray  # n x k efficiency features (OpSpec.features)
    steps: np.ndarray | None = None  # dependent steps per shape (OpSpec.steps), None if the op has none

    @classmethod
    def from_points(cls, spec: OpSpec, points) -> "PointSet":
        flop, nbytes = work(spec, points)
        spread = points["spread"].to_numpy(float) if "spread" in points else np.zeros(len(points))
        sigma = point_sigma(spread)
        if "warmup" in points:
            sigma = np.where(points["warmup"].to_numpy(bool), np.maximum(sigma, WARMUP_SIGMA), sigma)
        return cls(points[list(spec.params)].to_numpy("int64").reshape(len(points), -1),
                   points["seconds"].to_numpy(float), points["rows"].to_numpy(int),
                   [str(r) for r in points["runs"]], flop, nbytes, sigma,
                   spec.features(points[list(spec.params)].to_dict("records")),
                   spec.steps(points[list(spec.params)].to_dict("records")))

    def without(self, i: int) -> "PointSet":
        m = np.ones(len(self.seconds), bool)
        m[i] = False
        return PointSet(self.params[m], self.seconds[m], self.rows[m], [r for j, r in enumerate(self.runs) if j != i],
                        self.flop[m], self.nbytes[m], self.sigma[m], self.feats[m],
                        None if self.steps is None else self.steps[m])
