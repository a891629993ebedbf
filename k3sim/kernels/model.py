"""Analytical kernel-time models with free parameters, and their least-squares fit in log space.

Compute ops: a roofline with fitted efficiency, saturating in size, a launch term and a host floor,

    t   = smoothmax_p(floor, launch + (t_c^p + t_m^p)^(1/p))
    t_c = flop  / (eff_flop  * peak) * (1 + (half_flop  / flop )^exp_flop)
    t_m = bytes / (eff_bytes * bw  ) * (1 + (half_bytes / bytes)^exp_bytes)

`eff_*` is the large-size fraction of the datasheet peak. The `(1 + (half/s)^a)` factor is the
efficiency loss of a GPU that is not filled (a = 1 would be a constant latency, a < 1 lets time grow
sublinearly with size, as under-occupied kernels do); the p-norm is a smooth max between the roofs.
`floor` is the host-side time of an eager call (Python and launches): a small kernel cannot finish
before it has been issued. An op whose kernel walks dependent steps one after another (fla's fused
recurrent KDA loops over a request's tokens inside one program: each token's state update needs the
last) adds `step_s` per step to the launch term: at small batch that latency chain, not FLOP or bytes,
sets the time. For an op with `eff_params` the compute efficiency also scales as a
fitted power of those: SDPA's head dim picks a different kernel tile; chunk KDA's inter-chunk
recurrence is parallel over heads only, so few heads leave SMs idle.

Collectives: the alpha-beta model t = alpha + wire_bytes / bus_bandwidth (nccl-tests' bus bandwidth,
so one fit holds across GPU counts of the same link).

Fits minimise a robust (soft-L1) loss of the log error (relative error, all sizes count equally)
with Levenberg-Marquardt and a weak prior toward the initial guess, so parameters the data cannot
see (a compute roof for a pure copy) stay at sensible values instead of wandering.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np



@dataclass
class RooflineFit:
    """Fitted parameters of one compute op; peak and bandwidth are the datasheet values they scale."""

    launch_s: float
    eff_flop: float
    half_flop: float  # FLOP
    exp_flop: float
    eff_bytes: float
    half_bytes: float  # bytes
    exp_bytes: float
    smooth_p: float
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    floor_s: float = 1e-12  # host-side floor: an eager call cannot finish before its launches are issued
    # (the default, 1 ps, is no floor at all: for hand-built fits; every fitted one sets its own)
    # compute efficiency x (param / reference)^(-exponent) for the op's `eff_params` (e.g. SDPA head dim)
    eff_exponents: dict[str, float] = field(default_factory=dict)
    step_s: float = 0.0  # latency per dependent step (OpSpec.serial_steps); 0: the op has none

    def seconds(self, flop, nbytes, feats=None, steps=None):
        """feats: n x k log2(param / reference) of the op's eff_params (None when it has none);
        steps: dependent steps per call (OpSpec.serial_steps), required when the fit has step_s."""
        if self.step_s > 0 and steps is None:
            raise ValueError("this fit has a per-step latency: pass the op's serial steps")
        if self.eff_exponents and feats is None:  # features at their reference values: log2(1) = 0
            feats = np.zeros((np.size(flop), len(self.eff_exponents)))
        return roofline_seconds(self.to_theta(), np.asarray(flop, float), np.asarray(nbytes, float),
                                self.peak_flops_per_s, self.bandwidth_bytes_per_s, feats,
                                steps if self.step_s > 0 else None)

    def to_theta(self) -> np.ndarray:
        return np.array([np.log(self.launch_s), np.log(self.eff_flop), np.log(self.half_flop), _logit(self.exp_flop),
                         np.log(self.eff_bytes), np.log(self.half_bytes), _logit(self.exp_bytes),
                         np.log(self.smooth_p - 1.0), np.log(self.floor_s), *self.eff_exponents.values(),
                         *([np.log(self.step_s)] if self.step_s > 0 else [])])

    @classmethod
    def from_theta(cls, theta, peak: float, bw: float, names: tuple[str, ...] = (),
                   serial: bool = False) -> "RooflineFit":
        v = _decode(theta)
        k = NBASE + len(names)
        return cls(*[float(x) for x in v[:8]], peak_flops_per_s=float(peak), bandwidth_bytes_per_s=float(bw),
                   floor_s=float(v[8]),
                   eff_exponents={n: float(g) for n, g in zip(names, theta[NBASE:k])},
                   step_s=float(np.exp(theta[k])) if serial else 0.0)

    def as_dict(self) -> dict:
        d = {k: float(v) for k, v in asdict(self).items() if k != "eff_exponents" and not (k == "step_s" and v == 0)}
        return {**d, "eff_exponents": dict(self.eff_exponents)} if self.eff_exponents else d


@dataclass
class AlphaBetaFit:
    """t = alpha_s + wire_bytes / bus_bandwidth_bytes_per_s."""

    alpha_s: float
    bus_bandwidth_bytes_per_s: float

    def seconds(self, wire):
        return self.alpha_s + np.asarray(wire, float) / self.bus_bandwidth_bytes_per_s

    def as_dict(self) -> dict:
        return {k: float(v) for k, v in asdict(self).items()}


def _logit(x: float) -> float:
    x = min(max(x, 1e-6), 1 - 1e-6)
    return float(np.log(x / (1 - x)))


def _decode(theta):
    t = np.asarray(theta, float)
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    return (np.exp(t[0]), np.exp(t[1]), np.exp(t[2]), sig(t[3]), np.exp(t[4]), np.exp(t[5]), sig(t[6]),
            1.0 + np.exp(t[7]), np.exp(t[8]))


NBASE = 9  # theta entries before the efficiency exponents


def roofline_seconds(theta, flop: np.ndarray, nbytes: np.ndarray, peak: float, bw: float, feats=None,
                     steps=None) -> np.ndarray:
    """theta: the 9 base parameters, then one efficiency exponent per column of `feats`, then (with
    `steps`) log step_s."""
    launch, ef, hf, af, eb, hb, ab, p, floor = _decode(theta)
    k = NBASE
    if feats is not None and np.size(flop):
        feats = np.asarray(feats, float).reshape(np.size(flop), -1)
        k += feats.shape[1]
        if feats.shape[1]:
            flop = flop * np.exp2(feats @ np.asarray(theta[NBASE:k], float))
            flop = flop.reshape(np.shape(nbytes)) if np.ndim(nbytes) == 0 else flop
    if steps is not None:
        launch = launch + np.exp(theta[k]) * np.asarray(steps, float).reshape(np.shape(flop))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        tc = np.where(flop > 0, flop / (ef * peak) * (1.0 + (hf / np.maximum(flop, 1e-300)) ** af), 0.0)
        tm = np.where(nbytes > 0, nbytes / (eb * bw) * (1.0 + (hb / np.maximum(nbytes, 1e-300)) ** ab), 0.0)
        scale = np.maximum(np.maximum(tc, tm), 1e-300)
        body = launch + scale * ((tc / scale) ** p + (tm / scale) ** p) ** (1.0 / p)
        return body * (1.0 + (floor / body) ** p) ** (1.0 / p)  # smooth max with the host floor


def levenberg_marquardt(residual: Callable[[np.ndarray], np.ndarray], theta0: np.ndarray, *,
                        prior_weight: float = 0.0, iters: int = 200) -> tuple[np.ndarray, float]:
    """Minimise |residual(theta)|^2 + prior_weight |theta - theta0|^2; returns (theta, cost)."""
    theta0 = np.asarray(theta0, float)
    sw = np.sqrt(prior_weight)

    def full(th):
        r = residual(th)
        return np.concatenate([r, sw * (th - theta0)]) if sw else r

    th = theta0.copy()
    r = full(th)
    cost = float(r @ r)
    lam = 1e-2
    for _ in range(iters):
        J = np.empty((r.size, th.size))
        for j in range(th.size):
            d = np.zeros_like(th)
            d[j] = 1e-6 * max(1.0, abs(th[j]))
            J[:, j] = (full(th + d) - r) / d[j]
        g = J.T @ r
        H = J.T @ J
        improved = False
        while lam < 1e10:
            try:
                step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), -g)
            except np.linalg.LinAlgError:
                lam *= 10
                continue
            r_new = full(th + step)
            c_new = float(r_new @ r_new)
            if np.isfinite(c_new) and c_new < cost:
                th, r, lam, improved = th + step, r_new, max(lam / 3, 1e-9), True
                rel = (cost - c_new) / max(cost, 1e-300)
                cost = c_new
                break
            lam *= 4
        if not improved or rel < 1e-10:
            break
    return th, cost


# Fit settings, modelling choices (not measured, not from a source):
BARRIER = 3.0  # weight of the physical-bounds penalty, per unit of log excess
ROBUST_SCALE = 0.05  # soft-L1 knee in log error: points off the curve by more than ~5 % pull linearly


def soft_l1(r: np.ndarray, c: float = ROBUST_SCALE) -> np.ndarray:
    """Residuals rescaled so that their squares sum to the soft-L1 loss 2c^2(sqrt(1 + (r/c)^2) - 1):
    quadratic for small errors, linear for large ones, so a few noisy or odd shapes (launch jitter, a
    cuBLAS heuristic's slow pick) do not bend the whole curve (scipy least_squares' soft_l1)."""
    return np.sign(r) * c * np.sqrt(2.0 * (np.sqrt(1.0 + (r / c) ** 2) - 1.0))


def roofline_residual(flop, nbytes, seconds, peak: float, bw: float, robust: bool = True, weights=None, feats=None,
                      steps=None):
    """Residual function of theta: log error, times per-point weights (1 / relative uncertainty,
    normalised), through soft-L1; plus one-sided barriers that keep the fit physical where the data
    cannot: efficiencies at most 1 (no kernel beats the datasheet peak or HBM bandwidth), and the
    efficiency saturating inside the measured range (half sizes at most the largest measured FLOP and
    bytes), so that beyond the range time grows linearly with work instead of sublinearly forever."""
    y = np.log(seconds)
    w = np.ones_like(y) if weights is None else np.asarray(weights, float)
    flop, nbytes = np.asarray(flop, float), np.asarray(nbytes, float)
    log_fmax = np.log(flop.max()) if (flop > 0).any() else np.inf
    log_bmax = np.log(nbytes.max()) if (nbytes > 0).any() else np.inf

    def res(th):
        r = w * (np.log(roofline_seconds(th, flop, nbytes, peak, bw, feats, steps)) - y)
        r = soft_l1(r) if robust else r
        over = [th[1], th[4], th[2] - log_fmax if (flop > 0).any() else 0.0, th[5] - log_bmax]
        return np.concatenate([r, BARRIER * np.maximum(np.array(over, float), 0.0)])

    return res


def fit_roofline(flop, nbytes, seconds, peak: float, bw: float, *, prior_weight: float = 1e-4,
                 robust: bool = True, weights=None, feats=None, names: tuple[str, ...] = (),
                 steps=None) -> RooflineFit:
    """Fit the compute-op model to measured seconds (several starts, the lowest loss wins). `steps`:
    dependent steps per shape (OpSpec.serial_steps), which adds the per-step latency to the fit."""
    flop, nbytes, seconds = (np.asarray(a, float) for a in (flop, nbytes, seconds))
    res = roofline_residual(flop, nbytes, seconds, peak, bw, robust, weights, feats, steps)

    best = None
    fpos = flop[flop > 0]
    # Starting points only (the fit moves every one of them; the lowest final loss wins): half sizes a
    # decade or two apart around where an H100/H200-class GPU fills (1e11 FLOP, 1e7-1e8 bytes), mid-range
    # efficiencies and exponents, launch and floor as fractions of the fastest measured time.
    for half_f in ([1e9, 1e11, 1e13] if fpos.size else [1e9]):
        for half_b in (1e6, 1e8):
            init = RooflineFit(launch_s=0.3 * float(seconds.min()), eff_flop=0.6, half_flop=half_f, exp_flop=0.5,
                               eff_bytes=0.7, half_bytes=half_b, exp_bytes=0.5, smooth_p=4.0,
                               floor_s=0.5 * float(seconds.min()),
                               peak_flops_per_s=peak, bandwidth_bytes_per_s=bw,
                               eff_exponents={n: 0.0 for n in names},
                               # a tenth of the fastest call per step: a start, not a guess the fit keeps
                               step_s=0.1 * float(seconds.min()) if steps is not None else 0.0)
            th, cost = levenberg_marquardt(res, init.to_theta(), prior_weight=prior_weight)
            if best is None or cost < best[1]:
                best = (th, cost)
    return RooflineFit.from_theta(best[0], peak, bw, names, serial=steps is not None)


def fit_alpha_beta(wire, seconds, *, prior_weight: float = 1e-6, weights=None) -> AlphaBetaFit:
    """Alpha-beta in log space (soft-L1): small messages set alpha, large ones the bus bandwidth."""
    wire, seconds = np.asarray(wire, float), np.asarray(seconds, float)
    y = np.log(seconds)
    w = np.ones_like(y) if weights is None else np.asarray(weights, float)

    def res(th):
        return soft_l1(w * (np.log(np.exp(th[0]) + wire / np.exp(th[1])) - y))

    big = wire >= np.quantile(wire, 0.75)  # never empty: holds the largest message
    beta0 = float(np.median(wire[big] / seconds[big]))  # start: achieved bandwidth of the largest quarter
    # alpha starts under the fastest call
    th, _ = levenberg_marquardt(res, np.array([np.log(seconds.min() * 0.8), np.log(max(beta0, 1.0))]),
                                prior_weight=prior_weight)
    return AlphaBetaFit(alpha_s=float(np.exp(th[0])), bus_bandwidth_bytes_per_s=float(np.exp(th[1])))
