"""Measured kernel times of one profile: `hardware_profiles/measured/<profile>/<run_id>/`.

Each run directory holds `provenance.yaml` and one `<op>.csv` per op (schema in DEVELOPING.md,
"Measured data"). All runs are concatenated; rows with status != ok are kept (`failed`) for the
record but never used for prediction. A file that does not parse or does not follow the schema is
an `InputError` naming the file, so bad data never silently turns into a prediction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from k3sim.errors import InputError
from k3sim.kernels.ops import OPS

if TYPE_CHECKING:
    import pandas as pd

TIMING_COLUMNS = ("seconds", "status")
CONVENTIONS = ("graph", "eager")
PREFERRED_TIMER = {"graph": "graph", "eager": "events"}  # which rows a convention takes first (points())
PROVENANCE_KEYS = ("gpu_name", "command")
STATUSES = ("ok", "failed")
# The harness (calibration/timing.time_cuda) cuts repetitions only when per-call time x reps would pass the
# shape's budget_s, which is at least 1.5 s (the collectives'). A row under its base count of repetitions
# (25; short kernels get 200 since 2026-11-30's later runs) whose median x 25 is under 0.25 s (6x inside
# that) cannot have been cut for being slow: its warm-up was slow instead.
BASE_REPS = 25
WARMUP_CUT_S = 0.25


@dataclass
class MeasurementStore:
    """All runs of one profile. `rows[op]`: every row, with `run_id`; `ignored`: files not read."""

    root: Path
    runs: dict[str, dict]
    rows: dict[str, "pd.DataFrame"]
    ignored: list[str] = field(default_factory=list)
    fingerprint: str = ""  # of all measurement files
    op_fingerprints: dict[str, str] = field(default_factory=dict)  # of each op's files: per-op fit staleness
    _ops: list[str] | None = field(default=None, repr=False)

    def ok(self, op: str) -> "pd.DataFrame":
        import pandas as pd

        df = self.rows.get(op)
        return df[df["status"] == "ok"] if df is not None else pd.DataFrame()

    def failed(self, op: str) -> "pd.DataFrame":
        import pandas as pd

        df = self.rows.get(op)
        return df[df["status"] != "ok"] if df is not None else pd.DataFrame()

    def run_order(self) -> list[str]:
        """Runs oldest first: by provenance `date_utc`, then directory name."""
        return sorted(self.runs, key=lambda r: (str(self.runs[r].get("date_utc", "")), r))

    def points(self, op: str, convention: str = "graph") -> "pd.DataFrame":
        """One row per measured shape. A shape measured by several runs takes the latest run's median
        (a re-measurement supersedes: e.g. runs that fixed a warm-up problem); `rows` counts all ok rows,
        `runs` names the run used; `spread` = (p80 - p20) / median of the repetitions (0 if absent);
        `warmup`: the harness cut the repetitions of a short kernel below its base count (25), which
        happens when the warm-up was slow (a compile or autotune just before): the GPU clocks may still
        have been ramping (hardware_profiles/measured/h200/README.md), so the row is trusted less.

        `convention` (issue 10): rows carry the timer that made them (`timer` column: `graph` for
        CUDA-graph replay, `events` for one call between CUDA events, the default of runs without the
        column). Under "graph" a shape's graph rows win over its event rows whatever their dates; under
        "eager" the event rows win. A shape measured by the other timer only is shifted by the op's
        offset between the timers (`timer_offset_s`: the median of graph minus events over the shapes
        timed both ways, a per-launch overhead a graph does not pay) and marked `events-shifted` /
        `graph-shifted`; with no shape timed both ways it is kept as measured. Without the shift the
        two timers' rows would meet at a step (at GEMM M = 1024 -> 1536: graph rows are 0.55-0.97x the
        event rows) that the fit and the interpolation cannot follow. `host_s` is the chosen row's host
        time of one eager call."""
        import numpy as np
        import pandas as pd

        df = self.ok(op)
        if df.empty:
            return df
        keys = list(OPS[op].params)
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        order = {r: i for i, r in enumerate(self.run_order())}
        timer = (df["timer"].fillna("events").astype(str) if "timer" in df.columns
                 else pd.Series("events", index=df.index))
        preferred = (timer == PREFERRED_TIMER[convention]).astype(int)
        df = df.assign(_order=df["run_id"].map(order), _pref=preferred, timer=timer)
        df = df.sort_values(["_pref", "_order"], kind="stable")
        spread = np.zeros(len(df))
        if {"seconds_p20", "seconds_p80"} <= set(df.columns):
            p20 = pd.to_numeric(df["seconds_p20"], errors="coerce")
            p80 = pd.to_numeric(df["seconds_p80"], errors="coerce")
            spread = ((p80 - p20) / df["seconds"]).clip(lower=0).fillna(0.0).to_numpy()
        warm = np.zeros(len(df), bool)
        if "reps" in df.columns:
            reps = pd.to_numeric(df["reps"], errors="coerce")
            warm = ((reps < BASE_REPS) & (df["seconds"] * BASE_REPS < WARMUP_CUT_S)).fillna(False).to_numpy()
        df = df.assign(spread=spread, warmup=warm)
        if "host_s" not in df.columns:
            df = df.assign(host_s=np.nan)
        df = df.assign(host_s=pd.to_numeric(df["host_s"], errors="coerce"))
        g = df.groupby(keys, sort=True)
        last = g.tail(1).set_index(keys).sort_index()  # the chosen row itself (last() would mix NaN columns)
        out = last[["seconds", "spread", "warmup", "run_id", "timer", "host_s"]].rename(columns={"run_id": "runs"})  # params float: failed rows may lack them
        out.insert(1, "rows", g.size())
        offset = self.timer_offset_s(op, df, keys)
        if offset is not None:
            other = out["timer"] != PREFERRED_TIMER[convention]
            sign = 1.0 if convention == "graph" else -1.0  # graph = events + offset
            shifted = out.loc[other, "seconds"] + sign * offset
            # modelling guard: a shift never takes more than half of a row's time
            out.loc[other, "seconds"] = np.maximum(shifted, 0.5 * out.loc[other, "seconds"])
            out.loc[other, "timer"] = out.loc[other, "timer"] + "-shifted"
        out = out.reset_index()
        out[keys] = out[keys].astype("int64")
        return out

    def timer_offset_s(self, op: str, df=None, keys=None) -> float | None:
        """Median over the shapes of `op` timed both ways of (graph seconds - event seconds), each the
        latest row of its timer; None when no shape has both. Negative: the graph saves the event and
        launch latency a lone kernel pays."""
        import numpy as np
        import pandas as pd

        if df is None:
            df = self.ok(op)
            if df.empty:
                return None
            order = {r: i for i, r in enumerate(self.run_order())}
            timer = (df["timer"].fillna("events").astype(str) if "timer" in df.columns
                     else pd.Series("events", index=df.index))
            df = df.assign(_order=df["run_id"].map(order), timer=timer).sort_values("_order", kind="stable")
        keys = keys or list(OPS[op].params)
        if "timer" not in df.columns or set(df["timer"]) < {"graph", "events"}:
            return None
        latest = df.groupby(keys + ["timer"], sort=False)["seconds"].last().unstack("timer")
        both = latest.dropna(subset=["graph", "events"])
        return float(np.median(both["graph"] - both["events"])) if len(both) else None

    def ops(self) -> list[str]:
        """Ops with at least one successful row, in registry order (computed once)."""
        if self._ops is None:
            self._ops = [op for op in OPS if op in self.rows and not self.ok(op).empty]
        return self._ops


def _read_provenance(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise InputError(f"unreadable provenance ({err.__class__.__name__})", source=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("provenance is not a mapping: not a k3sim measurement run", source=str(path))
    missing = [k for k in PROVENANCE_KEYS if k not in data]
    if missing:
        raise InputError(f"provenance lacks {', '.join(missing)}: not a k3sim measurement run", source=str(path))
    return data


def _read_csv(path: Path, op: str, run_id: str) -> "pd.DataFrame":
    import pandas as pd

    spec = OPS[op]
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as err:
        raise InputError(f"corrupt CSV ({err.__class__.__name__}: {str(err).splitlines()[0][:120]})",
                         source=str(path)) from None
    need = list(spec.params) + list(TIMING_COLUMNS)
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}: not a {op} measurement file", source=str(path))
    df["status"] = df["status"].astype(str).str.strip()
    bad = sorted(set(df["status"]) - set(STATUSES))
    if bad:
        raise InputError(f"status must be ok or failed, found {bad[0]!r}", source=str(path), field="status")
    ok = df["status"] == "ok"
    for col in list(spec.params) + ["seconds"]:
        num = pd.to_numeric(df[col], errors="coerce")
        bad_rows = ok & ~((num > 0) & (num < float("inf")))  # NaN, non-numeric, zero, negative or infinite
        if col in spec.params:
            bad_rows |= ok & (num.notna()) & (num != num.round())
        if bad_rows.any():
            line = int(bad_rows.idxmax()) + 2  # header is line 1
            cell = df.loc[bad_rows.idxmax(), col]
            cell = cell if isinstance(cell, str) else float(cell)  # 'fast' quoted, a number as written: inf
            raise InputError(f"line {line}: {col}={cell!r} is not a positive "
                             f"{'integer' if col in spec.params else 'number'}", source=str(path), field=col)
        if col in spec.params:  # the op's own bounds (ops.py), as for a query: gpus=1 is no collective
            lo, hi = spec.ranges[col]
            out = ok & ((num < lo) | (num > hi))
            if out.any():
                line = int(out.idxmax()) + 2
                raise InputError(f"line {line}: {col}={int(num[out.idxmax()])} outside the op's allowed range "
                                 f"[{lo}, {hi}]", source=str(path), field=col)
        df[col] = num
    df["run_id"] = run_id
    return df


def _signature(root: Path) -> tuple:
    """Names, sizes and mtimes of every file under root: the cache key of a loaded store."""
    sig = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            sig.append((str(p.relative_to(root)), st.st_size, st.st_mtime_ns))
    return tuple(sig)


_CACHE: dict[tuple, MeasurementStore] = {}


def load_store(root: Path | str) -> MeasurementStore:
    """Load (or return the cached copy of) every run under `root`; reloads when a file changes."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise InputError("no such measured-data directory", source=str(root))
    key = (str(root), _signature(root))
    if key not in _CACHE:
        _CACHE.clear() if len(_CACHE) > 16 else None
        _CACHE[key] = _load(root)
    return _CACHE[key]


def _load(root: Path) -> MeasurementStore:
    import pandas as pd

    runs: dict[str, dict] = {}
    parts: dict[str, list] = {}
    ignored: list[str] = []
    digests: dict[str, "hashlib._Hash"] = {}
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        csvs = sorted(run.glob("*.csv"))
        prov = run / "provenance.yaml"
        if not prov.exists():
            if csvs:
                raise InputError("run directory has CSVs but no provenance.yaml", source=str(run))
            continue
        runs[run.name] = _read_provenance(prov)
        for path in csvs:
            if path.stem not in OPS:
                ignored.append(str(path.relative_to(root)))
                continue
            parts.setdefault(path.stem, []).append(_read_csv(path, path.stem, run.name))
            d = digests.setdefault(path.stem, hashlib.sha256())
            d.update(str(path.relative_to(root)).encode())
            d.update(path.read_bytes())
    rows = {op: pd.concat(dfs, ignore_index=True) for op, dfs in parts.items()}
    op_fp = {op: d.hexdigest()[:16] for op, d in sorted(digests.items())}
    total = hashlib.sha256("".join(f"{k}:{v};" for k, v in op_fp.items()).encode()).hexdigest()[:16]
    return MeasurementStore(root=root, runs=runs, rows=rows, ignored=ignored, fingerprint=total,
                            op_fingerprints=op_fp)
