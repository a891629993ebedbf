"""`predict_kernel_time`: how long kernel X with shape Y takes on hardware Z, and where that comes from.

Sources, best first:
- "measured": the shape was measured (median of its repetitions, latest run that measured it);
- "interpolated": inside the measured range; the fitted model times the interpolated residual
  (see `interp.py`);
- "model": outside the measured range; the fitted model (roofline with fitted efficiency, latency and
  launch terms; alpha-beta for collectives), times the residual held at the nearest boundary
  (AIConfigurator's "hold the boundary utilisation");
- "datasheet-roofline": the profile has no measurements of this op; max(FLOP / peak, bytes /
  bandwidth) from the datasheet, with no launch or latency term: a lower bound, and said so;
- "extrapolated": a KDA op at head dims K, V other than the measured 128: the answer at 128 (any of the
  sources above) times the fitted model's ratio between the two shapes (its FLOP and bytes at K, V
  against those at 128), so the kernel's measured efficiency carries over and only the work changes.
Collectives are not answered here: the facade `k3sim.predict.predict_kernel_time` sends them to the one
collective model, `k3sim.comm.collective_time`, which reads their measured points and alpha-beta fits from
this predictor (`ProfilePredictor.op`); kernels never import comm.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from k3sim.configs.profiles import link_bandwidth, load_profile, measured_dir, peak_flops
from k3sim.kernels.interp import ResidualGrid
from k3sim.kernels.ops import OpSpec, get_op, validate_params
from k3sim.kernels.points import PointSet

EXTRAPOLATION = "hold"  # "hold": boundary residual kept outside the range; "model": pure fitted model


@dataclass(frozen=True)
class KernelTime:
    """seconds: predicted kernel time (s); source: measured | interpolated | model | datasheet-roofline;
    method: how, within the source: exact | the interpolation method (multilinear, axis-line,
    line-nearest, idw) | boundary-held | model | datasheet."""

    seconds: float
    source: str
    detail: str
    method: str = ""
    convention: str = "graph"  # "graph" (a CUDA-graph replay's per-kernel time) or "eager" (+ host launch)


def log2_coords(spec: OpSpec, params: Mapping[str, int]) -> np.ndarray:
    return np.array([math.log2(params[p]) for p in spec.params if p not in spec.categorical], float)


def datasheet_time(spec: OpSpec, p: Mapping[str, int], hw: Any, why: str) -> KernelTime:
    if spec.kind == "collective":
        bw, which = link_bandwidth(hw, p["gpus"])
        t = spec.bytes(p) / bw
        how = f"wire bytes / {which}"
    else:
        tc = spec.flop(p) / peak_flops(hw, spec.dtype) if spec.flop(p) else 0.0
        tm = spec.bytes(p) / float(hw.hbm_bandwidth_bytes_per_s)
        t = max(tc, tm)
        how = f"max(FLOP / peak {spec.dtype}, bytes / HBM bandwidth) = {'compute' if tc >= tm else 'memory'} bound"
    return KernelTime(float(t), "datasheet-roofline",
                      f"{why}; datasheet roofline {how}, no launch or latency term (a lower bound)", "datasheet")


class OpPredictor:
    """One op on one calibrated profile: exact hits, residual grids per categorical group, the fit."""

    def __init__(self, spec: OpSpec, points: "PointSet", fit, hw: Any, fit_note: str, timers=None, host_s=None):
        self.spec, self.fit, self.hw, self.fit_note = spec, fit, hw, fit_note
        # the point of each measured shape (its parameters as Python ints; a shape listed twice: the later), one
        # dictionary: a query's exact hit, the timer of the row used ("graph" | "events") and its host time (s)
        # index the point arrays through it (`exact`, `timers`, `host` are built only when asked for)
        self._row = {tuple(r): i for i, r in enumerate(np.asarray(points.params, "int64").tolist())}
        self._points = points
        self._timers = list(timers) if timers is not None else None
        self._host_s = list(host_s) if host_s is not None else None
        resid = np.log(points.seconds) - np.log(self._model(points.flop, points.nbytes, points))
        self.groups: dict[tuple, ResidualGrid] = {}
        cat_idx = [spec.params.index(c) for c in spec.categorical]
        num_idx = [i for i, n in enumerate(spec.params) if n not in spec.categorical]
        cat_vals = points.params[:, cat_idx]
        X = np.log2(points.params[:, num_idx].astype(float))
        for g in {tuple(v) for v in cat_vals.tolist()}:
            m = (cat_vals == np.array(g, int)).all(axis=1)
            self.groups[g] = ResidualGrid(X[m], resid[m], points.sigma[m])
        self.n_points = len(points.seconds)

    def timer_of(self, shape: tuple) -> str | None:
        """The timer of the row measured at `shape` ("graph" | "events"); None for a shape not measured."""
        i = self._row.get(shape)
        return None if i is None else "events" if self._timers is None else str(self._timers[i])

    def host_of(self, shape: tuple) -> float:
        """The host time (s) of one eager call at a measured `shape`; NaN when not recorded or not measured."""
        i = self._row.get(shape)
        return float("nan") if i is None or self._host_s is None else float(self._host_s[i])

    @functools.cached_property
    def exact(self) -> dict[tuple, tuple[float, int, str]]:
        """Measured shape -> (median seconds, rows, runs)."""
        pts = self._points
        return {row: (float(pts.seconds[i]), int(pts.rows[i]), pts.runs[i]) for row, i in self._row.items()}

    @functools.cached_property
    def timers(self) -> dict[tuple, str]:
        """Measured shape -> the timer of its row."""
        return {row: self.timer_of(row) for row in self._row}

    @functools.cached_property
    def host(self) -> dict[tuple, float]:
        """Measured shape -> host seconds of one eager call (NaN where not recorded)."""
        return {row: self.host_of(row) for row in self._row}

    @functools.cached_property
    def host_median(self) -> float:
        """The median host time (s) over the measured shapes that recorded one; NaN when none did. Computed on
        first use: only an eager answer for a shape without its own host time needs it, and np.median's
        first call imports numpy.ma (~20 ms of a warm query's start)."""
        known = [h for h in self.host.values() if h == h]
        return float(np.median(known)) if known else float("nan")

    @functools.cached_property
    def timer_summary(self) -> tuple[str, str]:
        """(which timer's rows an interpolated answer stands on: "graph" | "events" | "mixed", the note that says
        so), over the measured shapes; once per op, not per answer."""
        timers = set(self.timers.values())
        used = "graph" if timers == {"graph"} else "events" if timers == {"events"} else "mixed"
        note = (f"from {used}-timed rows" if used != "mixed"
                else f"from graph- and event-timed rows ({sum(t == 'graph' for t in self.timers.values())} "
                     f"of {len(self.timers)} shapes graph-timed)")
        return used, note

    def _model(self, flop, nbytes, points: "PointSet") -> np.ndarray:
        if self.spec.kind != "collective":
            return self.fit.roofline.seconds(flop, nbytes, points.feats, points.steps)
        gpus = points.params[:, self.spec.params.index("gpus")]
        return np.array([self._alpha_beta(int(n))[0].seconds(w) for n, w in zip(gpus, nbytes)])

    def _alpha_beta(self, gpus: int):
        """The fit for this GPU count, else the nearest count's (bus bandwidth carries across counts)."""
        fits = self.fit.alpha_beta
        if gpus in fits:
            return fits[gpus], f"alpha-beta fit for {gpus} GPUs"
        near = min(fits, key=lambda n: (abs(math.log2(n) - math.log2(gpus)), n))
        ab = fits[near]
        note = f"alpha-beta fit of {near} GPUs reused for {gpus} (nccl-tests bus bandwidth carries across counts)"
        own, which = link_bandwidth(self.hw, gpus)
        ref, ref_which = link_bandwidth(self.hw, near)
        if which != ref_which:  # leaves the scale-up domain: same achieved fraction of the slower link
            from k3sim.kernels.model import AlphaBetaFit

            ab = AlphaBetaFit(ab.alpha_s, ab.bus_bandwidth_bytes_per_s * own / ref)
            note += f", bandwidth scaled by {which}/{ref_which}"
        return ab, note

    def model_seconds(self, p: Mapping[str, int]) -> tuple[float, str]:
        flop, nbytes = self.spec.flop(p), self.spec.bytes(p)
        if self.spec.kind == "collective":
            ab, note = self._alpha_beta(p["gpus"])
            return float(ab.seconds(nbytes)), note
        feats = self.spec.features([p]) if self.spec.eff_params else None
        t = self.fit.roofline.seconds(np.array([flop]), np.array([nbytes]), feats, self.spec.steps([p]))
        return float(t[0]), f"roofline fit of {self.spec.name}"

    def predict(self, p: Mapping[str, int], extrapolation: str = EXTRAPOLATION) -> KernelTime:
        key = tuple(p[k] for k in self.spec.params)
        i = self._row.get(key)
        if i is not None:
            s, rows, runs = float(self._points.seconds[i]), int(self._points.rows[i]), self._points.runs[i]
            return KernelTime(s, "measured", f"median of the repetitions in run {runs}"
                              + (f" (the latest of {rows} measurements of this shape)" if rows > 1 else ""), "exact")
        base, note = self.model_seconds(p)
        g = tuple(p[c] for c in self.spec.categorical)
        grid = self.groups.get(g)
        q = log2_coords(self.spec, p)
        hit = grid(q) if grid is not None else None
        if hit is not None:
            r, method = hit
            return KernelTime(base * math.exp(r), "interpolated",
                              f"{note} x residual interpolated ({method}) over {len(grid.z)} measured points; "
                              f"{self.fit_note}", method)
        if grid is None:
            why = ", ".join(f"{c}={v}" for c, v in zip(self.spec.categorical, g)) + " not measured"
            if extrapolation == "hold" and self.groups:
                # the nearest measured GPU count's residual at this shape: the same kernels and protocol
                near = min(self.groups, key=lambda h: (sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(h, g)), h))
                ng = self.groups[near]
                r, method = ng(ng.clip(q))
                held = ", ".join(f"{c}={v}" for c, v in zip(self.spec.categorical, near))
                return KernelTime(base * math.exp(r), "model",
                                  f"{note} ({why}), residual of {held} held ({method}); {self.fit_note}",
                                  "boundary-held")
            return KernelTime(base, "model", f"{note} ({why}); {self.fit_note}", "model")
        outside = [f"{n}={p[n]}" for n, x, lo, hi in zip([n for n in self.spec.params if n not in self.spec.categorical],
                                                            q, grid.lo, grid.hi) if x < lo - 1e-9 or x > hi + 1e-9]
        if extrapolation == "hold":
            r, method = grid(grid.clip(q))
            return KernelTime(base * math.exp(r), "model",
                              f"{note}, residual held at the range boundary ({method}); outside the measured "
                              f"range ({', '.join(outside)}); {self.fit_note}", "boundary-held")
        return KernelTime(base, "model", f"{note}; outside the measured range ({', '.join(outside)}); {self.fit_note}",
                          "model")


class ProfilePredictor:
    """All ops of one profile: the store and the fit, loaded once.

    What each op's predictor is built from (its points, fit and notes) comes from the disk cache
    (`k3sim.kernels.cache`) when an entry exists for these exact measured bytes, fit file, hardware fields and
    code; otherwise from the store, parsed and validated (`load_store`), and is then saved. A warm query
    therefore reads and hashes the files (a few ms) and loads the ops it asks for, without pandas."""

    def __init__(self, hw: Any):
        self.hw = hw
        from k3sim.kernels.store import derivation  # a derived profile reads its source's rows, rescaled

        self.derivation = derivation(hw)
        self.dir = measured_dir(hw) if self.derivation is None else self.derivation.source_dir
        self._store = None
        self._files = None  # store.StoreFiles: the bytes read once, parsed only on a cache miss
        self._fitted_bytes: bytes | None = None
        self._fitted: list = []  # [FittedProfile | None] once parsed
        self._key: str | None = None  # disk-cache key of these files, this fit, this hardware and this code
        self._op_names: list[str] = []
        self._ops: dict[tuple[str, str], OpPredictor] = {}  # by (op, convention)
        self._answers: dict[tuple, KernelTime] = {}  # simulators ask the same shapes over and over
        if self.dir is not None:
            self._open()

    def _open(self) -> None:
        """Read and fingerprint the profile's files; the op list from the cache, else from the validated store
        (a cache entry is written only once the store and the fit passed their checks)."""
        from k3sim.kernels import cache
        from k3sim.kernels.fit import FITTED_NAME, read_fitted_bytes
        from k3sim.kernels.store import read_files

        self._files = read_files(self.dir)
        self._fitted_bytes = read_fitted_bytes(self.dir / FITTED_NAME)
        fit_digest = "none" if self._fitted_bytes is None else hashlib.sha256(self._fitted_bytes).hexdigest()
        self._key = cache.key("profile", str(Path(self.dir).resolve()), self._files.digest, fit_digest,
                              repr(_hw_key(self.hw)))
        index = cache.load(self._key, "index")
        if not (isinstance(index, dict) and isinstance(index.get("ops"), list)
                and all(isinstance(op, str) for op in index["ops"])):
            store = self.store  # parsed, rows checked, rows beyond the datasheet roofline refused
            _ = self.fitted  # parsed and checked
            index = {"ops": list(store.ops())}
            cache.save(self._key, "index", index)
        self._op_names = list(index["ops"])

    @property
    def store(self):
        """The parsed store (pandas), from the bytes this predictor fingerprinted; parsed on first use."""
        if self._store is None and self.dir is not None:
            from k3sim.kernels.store import load_store

            self._store = load_store(self.dir, hardware=self.hw, files=self._files)
            self._files = None  # the store holds what it needs
        return self._store

    @property
    def fitted(self):
        """The profile's fit file (`fitted.yaml`), parsed and checked on first use; None without one."""
        if not self._fitted and self.dir is not None:
            from k3sim.kernels.fit import FITTED_NAME, read_fitted

            fp = None if self._fitted_bytes is None else read_fitted(self.dir / FITTED_NAME, self._fitted_bytes)
            self._fitted.append(fp if self.derivation is None else self.derivation.fit(fp))
        return self._fitted[0] if self._fitted else None

    def ops(self) -> list[str]:
        """Ops with at least one successful row, in registry order (`MeasurementStore.ops`)."""
        return list(self._op_names)

    def op(self, name: str, convention: str = "graph") -> OpPredictor | None:
        """The op's predictor over the points `convention` prefers (store.points); one fit serves both
        conventions (it is made on the graph-preferred points), the residual grid is each one's own."""
        if name not in self._op_names:
            return None
        if (name, convention) not in self._ops:
            from k3sim.kernels import cache

            spec = get_op(name)
            entry = cache.load(self._key, f"op.{name}.{convention}")
            parts = _op_from_entry(entry) if entry is not None else None
            if parts is None:
                parts = self._op_parts(spec, convention)
                try:
                    cache.save(self._key, f"op.{name}.{convention}", _op_entry(*parts))
                except TypeError:  # a value the cache does not hold: answered, not saved
                    pass
            pts, fit, note, timers, host = parts
            self._ops[(name, convention)] = OpPredictor(spec, pts, fit, self.hw, note, timers, host)
        return self._ops[(name, convention)]

    def series(self, name: str, timer: str) -> OpPredictor | None:
        """A collective's predictor over the rows one timer made (`store.points(..., only=timer)`: "events" for the
        barrier-started runs, "graph" for CUDA-graph replays), or None when the op has no such row. Each timing
        convention of a collective is its own series of rows (`k3sim.comm.model.SERIES`): no row of one timer is
        shifted into another's. The fit is the op's one fit (`op`'s, made on the graph-preferred points), as for
        the kernel conventions: each series interpolates its own rows' residuals. From the disk cache like `op`."""
        if name not in self._op_names:
            return None
        if (name, f"series:{timer}") not in self._ops:
            from k3sim.kernels import cache

            spec = get_op(name)
            entry = cache.load(self._key, f"op.{name}.series-{timer}")
            parts = None
            if isinstance(entry, dict) and entry.get("empty") is True:
                parts = ()
            elif entry is not None:
                parts = _op_from_entry(entry)
            if parts is None:
                parts = self._series_parts(spec, timer)
                try:
                    cache.save(self._key, f"op.{name}.series-{timer}", _op_entry(*parts) if parts else {"empty": True})
                except TypeError:  # a value the cache does not hold: answered, not saved
                    pass
            self._ops[(name, f"series:{timer}")] = (
                OpPredictor(spec, parts[0], parts[1], self.hw, parts[2], parts[3], parts[4]) if parts else None)
        return self._ops[(name, f"series:{timer}")]

    def _series_parts(self, spec: OpSpec, timer: str) -> tuple:
        """(points, fit, fit note, timers, host seconds) of one timer's rows of an op with the op's fit; () when
        there are none."""
        from k3sim.kernels.fit import op_fit

        pts_df = self.store.points(spec.name, "graph", only=timer)
        if pts_df.empty:
            return ()
        fit, note = op_fit(self.store, self.fitted, spec.name, self.hw)
        return (PointSet.from_points(spec, pts_df), fit, note, pts_df["timer"].tolist(),
                pts_df["host_s"].tolist() if "host_s" in pts_df else None)

    def _op_parts(self, spec: OpSpec, convention: str) -> tuple:
        """(points, fit, fit note, timer per shape, host seconds per shape) of one op, from the store."""
        from k3sim.kernels.fit import op_fit

        fit, note = op_fit(self.store, self.fitted, spec.name, self.hw)
        pts_df = self.store.points(spec.name, convention)
        pts = PointSet.from_points(spec, pts_df)
        return (pts, fit, note, pts_df["timer"].tolist() if "timer" in pts_df else None,
                pts_df["host_s"].tolist() if "host_s" in pts_df else None)

    def predict(self, op: str, params: Mapping[str, object], convention: str = "graph") -> KernelTime:
        from k3sim.errors import InputError
        from k3sim.kernels.store import CONVENTIONS

        if convention not in CONVENTIONS:
            raise InputError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}",
                             field="convention")
        spec = get_op(op)
        p = validate_params(spec, params)
        key = (op, convention, *p.values())
        hit = self._answers.get(key)
        if hit is None:
            if len(self._answers) > 200_000:  # memory bound only (~100 MB); answers do not depend on it
                self._answers.clear()
            hit = self._answers[key] = (self._convention(spec, p, convention) if self.derivation is None or
                                        spec.kind == "collective" else self.derivation.kernel_time(spec, p, convention))
        return hit

    def _convention(self, spec: OpSpec, p: dict[str, int], convention: str) -> KernelTime:
        """The answer under `convention`, saying which timer's rows it stands on (issue 10).

        graph: graph-timed rows where the shape (or its neighbourhood) has them, event-timed rows
        otherwise (those carry a lone kernel's event and launch latency: an upper bound of the graph
        time, said in the detail). eager: event-timed rows first, plus the host time of one eager call
        (`host_s` of the row used; the op's median where the shape has none)."""
        import dataclasses

        if spec.kind == "collective":  # kernels hold a collective's points and fits; the collective model answers
            raise ValueError(f"{spec.name} is a collective: k3sim.predict.predict_kernel_time (k3sim.comm."
                             "collective_time) answers it; the kernel predictor only holds its measured points")
        kt = self._predict(spec, p, convention)
        opp = self.op(spec.name, convention)
        if opp is None:
            return dataclasses.replace(kt, convention=convention)
        key = tuple(p[k] for k in spec.params)
        used = opp.timer_of(key) if kt.method == "exact" else None
        if used is not None:
            note = f"{used}-timed row"
        else:
            used, note = opp.timer_summary
        if convention == "graph":
            if used == "events":
                note += " (no graph-replay measurement: a lone kernel's event and launch latency included, an upper bound)"
            return dataclasses.replace(kt, detail=f"{kt.detail}; graph convention, {note}", convention="graph")
        host = opp.host_of(key) if kt.method == "exact" else float("nan")
        where = "the row's"
        if not host == host:
            host, where = opp.host_median, f"the median over {spec.name}'s measured shapes"
        if not host == host:
            return dataclasses.replace(kt, detail=f"{kt.detail}; eager convention, {note}; no host time recorded "
                                                  "for this op: GPU time only", convention="eager")
        return dataclasses.replace(kt, seconds=kt.seconds + host, convention="eager",
                                   detail=f"{kt.detail}; eager convention, {note}, + host launch time "
                                          f"{host * 1e6:.1f} us ({where} host_s)")

    def _predict(self, spec: OpSpec, p: dict[str, int], convention: str = "graph") -> KernelTime:
        op = spec.name
        if "K" in spec.optional and (p["K"], p["V"]) != (spec.optional["K"], spec.optional["V"]):
            return self._other_head_dim(spec, p, convention)
        opp = self.op(op, convention)
        if opp is not None:
            return opp.predict(p)
        if self.dir is None:
            from k3sim.configs.profiles import uncalibrated_reason

            why = uncalibrated_reason(self.hw)
        else:
            why = f"no successful measurement of {op} in {self.dir.name}"
        return datasheet_time(spec, p, self.hw, why)


    def _other_head_dim(self, spec: OpSpec, p: dict[str, int], convention: str = "graph") -> KernelTime:
        """Time at head dims (K, V) from the measured K = V = 128: the 128 answer times the model's ratio."""
        ref = dict(p, **spec.optional)
        base = self._predict(spec, ref, convention)
        opp = self.op(spec.name, convention)
        if opp is not None:
            num, _ = opp.model_seconds(p)
            den, _ = opp.model_seconds(ref)
            how = f"fitted model of {spec.name}"
        else:
            num = datasheet_time(spec, p, self.hw, "").seconds
            den = datasheet_time(spec, ref, self.hw, "").seconds
            how = "datasheet roofline"
        ratio = num / den
        return KernelTime(base.seconds * ratio, "extrapolated",
                          f"K={p['K']}, V={p['V']} not measured: the K=V={ref['K']} time ({base.source}: {base.detail}) "
                          f"x {ratio:.4g}, the {how}'s ratio of the two shapes (FLOP and bytes at K, V)",
                          base.method)


def _op_entry(pts: PointSet, fit, note: str, timers, host) -> dict:
    """One op's predictor inputs as builtins (`cache.to_plain`): the point arrays, the fit's fields, the notes."""
    import dataclasses

    from k3sim.kernels.cache import to_plain

    def fields(obj) -> dict:
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}

    f = fields(fit)
    f["roofline"] = None if fit.roofline is None else fields(fit.roofline)
    f["alpha_beta"] = [(n, fields(ab)) for n, ab in fit.alpha_beta.items()]
    return to_plain({"points": fields(pts), "fit": f, "note": note, "timers": timers, "host": host})


def _op_from_entry(entry: Any) -> tuple | None:
    """The inverse of `_op_entry`; None when the entry does not fit today's classes (then it is rebuilt)."""
    from k3sim.kernels.cache import from_plain
    from k3sim.kernels.fit import OpFit
    from k3sim.kernels.model import AlphaBetaFit, RooflineFit

    try:
        e = from_plain(entry)
        f = dict(e["fit"])
        f["roofline"] = None if f["roofline"] is None else RooflineFit(**f["roofline"])
        f["alpha_beta"] = {n: AlphaBetaFit(**ab) for n, ab in f["alpha_beta"]}
        return PointSet(**e["points"]), OpFit(**f), e["note"], e["timers"], e["host"]
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None


_PROFILES: dict[tuple, ProfilePredictor] = {}
_BY_NAME: dict[str, ProfilePredictor] = {}


def _hw_key(hw: Any) -> tuple:
    peaks = tuple(sorted((k, float(v)) for k, v in dict(hw.peak_flops_per_s or {}).items()))
    links = tuple(float(getattr(hw, f, 0) or 0) for f in
                  ("scaleup_bandwidth_bytes_per_s", "scaleup_domain_gpus", "scaleout_bandwidth_bytes_per_s"))
    from k3sim.kernels.store import derivation_key  # () unless derived: then the rule and the source's key

    return (str(hw.name), str(getattr(hw, "calibration_dir", None)), peaks, float(getattr(hw, "hbm_bandwidth_bytes_per_s", 0) or 0), links,
            derivation_key(hw))


def profile_predictor(hardware: Any) -> ProfilePredictor:
    """Cached per profile for the life of the process (`clear_cache()` after changing files)."""
    if isinstance(hardware, (str, Path)):
        name = str(hardware)
        if name not in _BY_NAME:
            _BY_NAME[name] = profile_predictor(load_profile(name))
        return _BY_NAME[name]
    hw = load_profile(hardware)
    key = _hw_key(hw)
    if key not in _PROFILES:
        _PROFILES[key] = ProfilePredictor(hw)
    return _PROFILES[key]


def clear_cache() -> None:
    _PROFILES.clear()
    _BY_NAME.clear()


def predict_kernel_time(op: str, params: Mapping[str, object], hardware: Any = "h200",
                        convention: str = "graph") -> KernelTime:
    """Kernel time in seconds with its source; `hardware` is a profile name, a path or a HardwareProfile.

    `convention`: "graph" (default; the kernel as a CUDA-graph replay runs it, back to back with no host
    launch) or "eager" (one call between CUDA events plus the host's launch time); the answer's detail
    says which timer's measurements it stands on.
    Raises InputError for an unknown op or parameter, a missing one, or a shape outside the op's range.
    """
    return profile_predictor(hardware).predict(op, params, convention)
