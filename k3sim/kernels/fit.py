"""Fit each op's model to a profile's measurements and keep the result in `fitted.yaml`.

One roofline fit per compute op, one alpha-beta fit per collective and GPU count. `fitted.yaml`
records the fit date, a data fingerprint per op (a stale op is refitted in memory, and says so), the
rows and runs each fit used, and the fit's own RMS log error.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from k3sim.errors import InputError
from k3sim.configs.profiles import peak_flops
from k3sim.kernels.model import AlphaBetaFit, RooflineFit, fit_alpha_beta, fit_roofline
from k3sim.kernels.ops import OPS, OpSpec
from k3sim.kernels.points import SIGMA_FLOOR, PointSet

FITTED_NAME = "fitted.yaml"
# Each shape is weighted by its uncertainty (points.PointSet.sigma: its p20-p80 spread, and a larger one for
# a row measured right after a compile). On the first H200 runs this hurt KDA decode, whose launch-bound
# rows then scattered by 10-100 % (host launch time inside the events); with the harness's launch
# headroom (runs e-j) those rows repeat to ~2 %, and weighting lowered decode's leave-one-out MAPE from
# 5.4 to 4.1 % (before the per-token step term) while moving the other families by 0.1 point or less.
WEIGHTED_FIT = True
FORMAT = "k3sim-kernel-fit/1"


@dataclass
class OpFit:
    op: str
    roofline: RooflineFit | None = None
    alpha_beta: dict[int, AlphaBetaFit] = field(default_factory=dict)  # by GPU count
    rows_used: int = 0
    points_used: int = 0
    runs: list[str] = field(default_factory=list)
    rms_log_error: float = 0.0
    data_fingerprint: str = ""  # of this op's measurement files when fitted


@dataclass
class FittedProfile:
    profile: str
    fit_date: str
    data_fingerprint: str
    ops: dict[str, OpFit]


def fit_weights(sigma: np.ndarray) -> np.ndarray:
    """Per-shape fit weights from `PointSet.sigma`: 1 for a repeatable shape, less for one whose
    repetitions scatter or that followed a compile. `fit_op` and `validate`'s refits both use it."""
    sigma = np.asarray(sigma, float)
    return SIGMA_FLOOR / sigma if WEIGHTED_FIT else np.ones(len(sigma))


def fit_op(spec: OpSpec, points, hw: Any) -> OpFit:
    """Fit one op from its aggregated points (`MeasurementStore.points`)."""
    pts = PointSet.from_points(spec, points)
    flop, nbytes, seconds = pts.flop, pts.nbytes, pts.seconds
    w = fit_weights(pts.sigma)
    runs = sorted({r for s in pts.runs for r in s.split(",")})
    out = OpFit(op=spec.name, rows_used=int(pts.rows.sum()), points_used=len(seconds), runs=runs)
    if spec.kind == "collective":
        pred = np.empty_like(seconds)
        for n in sorted(points["gpus"].unique()):
            m = (points["gpus"] == n).to_numpy()
            out.alpha_beta[int(n)] = ab = fit_alpha_beta(nbytes[m], seconds[m], weights=w[m])
            pred[m] = ab.seconds(nbytes[m])
    else:
        out.roofline = fit_roofline(flop, nbytes, seconds, peak_flops(hw, spec.dtype), float(hw.hbm_bandwidth_bytes_per_s),
                                    weights=w, feats=pts.feats, names=tuple(spec.eff_params), steps=pts.steps)
        pred = out.roofline.seconds(flop, nbytes, pts.feats, pts.steps)
    out.rms_log_error = float(np.sqrt(np.mean(np.log(pred / seconds) ** 2)))
    return out


def fit_store_op(store, op: str, hw: Any) -> OpFit:
    f = fit_op(OPS[op], store.points(op), hw)
    f.data_fingerprint = store.op_fingerprints.get(op, "")
    return f


def fit_profile(store, hw: Any) -> FittedProfile:
    """Fit every op with at least one successful measurement; a store with none is bad input (an empty
    fit or an empty validation table would look like a result)."""
    if not store.ops():
        raise InputError("no successful measurement of any known op (a run directory needs provenance.yaml "
                         "and <op>.csv files with status ok)", source=str(store.root))
    ops = {op: fit_store_op(store, op, hw) for op in store.ops()}
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return FittedProfile(profile=str(hw.name), fit_date=date, data_fingerprint=store.fingerprint, ops=ops)


def to_dict(fp: FittedProfile) -> dict:
    ops = {}
    for name, f in fp.ops.items():
        d: dict[str, Any] = {"rows_used": f.rows_used, "points_used": f.points_used, "runs": f.runs,
                             "data_fingerprint": f.data_fingerprint, "rms_log_error": round(f.rms_log_error, 6)}
        if f.roofline is not None:
            d["model"] = "roofline"
            d["params"] = {k: ({n: float(f"{g:.6g}") for n, g in v.items()} if isinstance(v, dict) else float(f"{v:.6g}"))
                           for k, v in f.roofline.as_dict().items()}
        else:
            d["model"] = "alpha-beta"
            d["by_gpus"] = {int(n): {k: float(f"{v:.6g}") for k, v in ab.as_dict().items()}
                            for n, ab in sorted(f.alpha_beta.items())}
        ops[name] = d
    return {"format": FORMAT, "profile": fp.profile, "fit_date": fp.fit_date,
            "data_fingerprint": fp.data_fingerprint, "ops": ops}


def _check_values(f: OpFit) -> None:
    """Every fitted time, size, efficiency and bandwidth is finite and positive (exponents: finite), the
    parameters stay inside the ranges the model is defined on (smooth_p > 1, saturation exponents in
    (0, 1], as `_decode` produces them), and a known op has the model its kind takes, with exactly its
    `eff_params` and, for a collective, GPU counts it can run on; so a hand-edited or damaged fit cannot
    turn into NaN or negative kernel times, or into a traceback at prediction time."""
    spec = OPS.get(f.op)
    vals = {}
    if f.roofline is not None:
        if spec is not None and spec.kind != "compute":
            raise ValueError(f"{f.op}: a {spec.kind} op takes model alpha-beta, not roofline")
        if spec is not None and set(f.roofline.eff_exponents) != set(spec.eff_params):
            raise ValueError(f"{f.op}: eff_exponents names {sorted(f.roofline.eff_exponents)}, the op's "
                             f"efficiency parameters are {sorted(spec.eff_params)}")
        if spec is not None and f.roofline.step_s and spec.serial_steps is None:
            raise ValueError(f"{f.op}: step_s given for an op without serial steps")
        vals = {k: v for k, v in f.roofline.as_dict().items() if k != "eff_exponents"}
        for k, v in f.roofline.eff_exponents.items():
            if not np.isfinite(v):
                raise ValueError(f"{f.op}: eff_exponents.{k}={v} is not finite")
        if not f.roofline.smooth_p > 1:
            raise ValueError(f"{f.op}: smooth_p={f.roofline.smooth_p} must exceed 1 (a p-norm)")
        for k in ("exp_flop", "exp_bytes"):
            if not 0 < getattr(f.roofline, k) <= 1:
                raise ValueError(f"{f.op}: {k}={getattr(f.roofline, k)} outside (0, 1]")
    else:
        if spec is not None and spec.kind != "collective":
            raise ValueError(f"{f.op}: a {spec.kind} op takes model roofline, not alpha-beta")
        if not f.alpha_beta:
            raise ValueError(f"{f.op}: by_gpus is empty")
        lo, hi = spec.ranges["gpus"] if spec is not None else (1, float("inf"))
        bad = [n for n in f.alpha_beta if not lo <= n <= hi]
        if bad:
            raise ValueError(f"{f.op}: by_gpus has {bad[0]} GPUs, outside [{lo}, {hi}]")
    for n, ab in f.alpha_beta.items():
        vals.update({f"{n} GPUs {k}": v for k, v in ab.as_dict().items()})
    for k, v in vals.items():
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{f.op}: {k}={v} is not a positive finite number")


def from_dict(d: dict, source: str) -> FittedProfile:
    try:
        if d.get("format") != FORMAT:
            raise ValueError(f"format is {d.get('format')!r}, expected {FORMAT}")
        ops = {}
        for name, o in d["ops"].items():
            if not isinstance(o.get("runs"), list):
                raise ValueError(f"{name}: runs must be a list of run ids")
            f = OpFit(op=name, rows_used=int(o["rows_used"]), points_used=int(o["points_used"]),
                      runs=[str(r) for r in o["runs"]], rms_log_error=float(o["rms_log_error"]),
                      data_fingerprint=str(o.get("data_fingerprint", "")))
            if o["model"] == "roofline":
                f.roofline = RooflineFit(**{k: ({n: float(g) for n, g in v.items()} if isinstance(v, dict) else float(v))
                                            for k, v in o["params"].items()})
            elif o["model"] == "alpha-beta":
                f.alpha_beta = {int(n): AlphaBetaFit(**{k: float(v) for k, v in ab.items()})
                                for n, ab in o["by_gpus"].items()}
            else:
                raise ValueError(f"{name}: model is {o['model']!r}, expected roofline or alpha-beta")
            _check_values(f)
            ops[name] = f
        return FittedProfile(profile=str(d["profile"]), fit_date=str(d["fit_date"]),
                             data_fingerprint=str(d["data_fingerprint"]), ops=ops)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"not a k3sim kernel fit ({err.__class__.__name__}: {err})", source=source) from None


def write_fitted(path: Path, fp: FittedProfile) -> Path:
    """Atomic write: a temp file in the same directory, then rename."""
    import yaml

    from k3sim.files import atomic_write_text

    path = Path(path)
    text = "# Written by `k3sim calibrate fit`; do not edit (refit instead).\n"
    text += yaml.safe_dump(to_dict(fp), sort_keys=False, default_flow_style=None, width=110)
    atomic_write_text(path, text)
    return path



def read_fitted_bytes(path: Path) -> bytes | None:
    """The bytes of a profile's fit file, None when nothing is at `path` (read through `k3sim.reader`)."""
    from k3sim.kernels.store import read_measured
    from k3sim.reader import exists

    path = Path(path)
    if not exists(path):  # a broken link is there: the reader says so rather than "no fit"
        return None
    return read_measured(path, "kernel fit")


def read_fitted(path: Path, data: bytes | None = None) -> FittedProfile | None:
    """The fit in `path` (or in `data`, its bytes as `read_fitted_bytes` read them), checked; None: no file."""
    import yaml

    path = Path(path)
    if data is None:
        data = read_fitted_bytes(path)
        if data is None:
            return None
    try:
        data = yaml.safe_load(data.decode("utf-8", errors="replace"))
    except yaml.YAMLError as err:
        raise InputError(f"unreadable fit ({err.__class__.__name__})", source=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("not a k3sim kernel fit (not a mapping)", source=str(path))
    return from_dict(data, str(path))


def op_fit(store, fitted: FittedProfile | None, op: str, hw: Any) -> tuple[OpFit, str]:
    """The committed fit of `op` when it was made from the same files, else a fresh in-memory fit."""
    f = fitted.ops.get(op) if fitted is not None else None
    # a fit made before the op's model had its per-step latency term is stale as well
    lacks_step = f is not None and f.roofline is not None and OPS[op].serial_steps is not None and not f.roofline.step_s
    if f is not None and f.data_fingerprint == store.op_fingerprints.get(op) and not lacks_step:
        return f, f"fit of {fitted.fit_date}"
    why = "no fitted.yaml" if fitted is None else ("fitted.yaml is stale for this op" if f else
                                                  "op absent from fitted.yaml")
    return fit_store_op(store, op, hw), f"in-memory fit ({why})"


def load_or_fit(store, hw: Any) -> tuple[FittedProfile, str]:
    """The committed fit when it matches the data, else a fresh in-memory fit; says which."""
    fp = read_fitted(Path(store.root) / FITTED_NAME)
    if fp is not None and fp.data_fingerprint == store.fingerprint:
        return fp, f"fit of {fp.fit_date}"
    why = "no fitted.yaml" if fp is None else "fitted.yaml is stale (data changed)"
    return fit_profile(store, hw), f"in-memory fit ({why})"
