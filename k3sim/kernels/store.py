"""Measured kernel times of one profile: `hardware_profiles/measured/<profile>/<run_id>/`.

Each run directory holds `provenance.yaml` and one `<op>.csv` per op (schema in DEVELOPING.md,
"Measured data"). All runs are concatenated; rows with status != ok are kept (`failed`) for the
record but never used for prediction. A file that does not parse or does not follow the schema is
an `InputError` naming the file, so bad data never silently turns into a prediction: every numeric
column of an ok row lies in its documented range (the op's parameter ranges, `k3sim.configs.bounds`
for the others, `NUMERIC_COLUMNS`), and, loaded for a profile, no row is faster than that profile's
datasheet roofline by more than `PHYSICAL_FACTOR` (`MeasurementStore.check_physical`). Every file is read
once through `k3sim.reader` (regular files only, at most `MAX_MEASURED_BYTES`).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3sim import reader
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

# Numeric columns besides the op's parameters (DEVELOPING.md, "Measured data"): the `k3sim.configs.bounds`
# kind each value of an ok row must lie in, and whether it is a whole number. `seconds` is required and
# positive; for the others an empty cell or `nan` means "not measured" (host_s before the 2026-11-30 e runs,
# the KCP rel_err of a run that did not check it). rel_err is a fraction: beyond 1 the kernel computed
# something else, so its time is not the op's.
NUMERIC_COLUMNS = {
    "seconds": ("seconds", False), "seconds_p20": ("seconds", False), "seconds_p80": ("seconds", False),
    "host_s": ("seconds", False), "single_gpu_seconds": ("seconds", False),
    "reps": ("measurement_count", True), "calls_per_graph": ("measurement_count", True),
    "operand_sets": ("measurement_count", True), "splits": ("measurement_count", True),
    "distinct_experts": ("experts", False), "rel_err": ("fraction", False),
}

# How much faster than the profile's datasheet roofline a measured row may be (`predict.datasheet_time`, the
# one roofline: max(FLOP / peak, bytes / HBM bandwidth) of the op's own FLOP and byte formulas for a kernel,
# ring wire bytes / link bandwidth for a collective) before it is refused as unphysical (a 1e-300 s row, a
# unit slip, a timer that missed the kernel). Kernels 1.2x: nothing beats its GPU's peak; the committed H200
# rows reach at most 0.90 of the roofline (hbm_copy of 8 GiB), and 20 % covers a datasheet that rounds its
# figures. Collectives 2x: NVLink SHARP (NVLS) reduces inside the switch, so an all-reduce moves each byte
# once each way instead of the ring's 2(n-1)/n (up to 2x fewer bytes); the committed AIConfigurator all-reduce
# on 8 H200 reaches 1.04x the ring roofline, custom_all_reduce 1.04x.
PHYSICAL_FACTOR = {"compute": 1.2, "collective": 2.0}


@dataclass
class MeasurementStore:
    """All runs of one profile. `rows[op]`: every row, with `run_id`; `ignored`: files not read."""

    root: Path
    runs: dict[str, dict]
    rows: dict[str, "pd.DataFrame"]
    ignored: list[str] = field(default_factory=list)
    fingerprint: str = ""  # of all measurement files
    op_fingerprints: dict[str, str] = field(default_factory=dict)  # of each op's files: per-op fit staleness
    content_digest: str = ""  # of every file the store was parsed from (`StoreFiles.digest`): the disk-cache key
    _ops: list[str] | None = field(default=None, repr=False)
    _physical_ok: set = field(default_factory=set, repr=False)  # profiles check_physical has passed

    def check_physical(self, hw: Any) -> None:
        """Refuse the first ok row faster than `hw`'s datasheet roofline by more than `PHYSICAL_FACTOR`, naming
        its file, line and column; once per profile (the store is cached, the check is not repeated)."""
        from k3sim.kernels.predict import _hw_key, datasheet_time

        key = _hw_key(hw)
        if key in self._physical_ok:
            return
        for op, df in self.rows.items():
            spec = OPS[op]
            ok = (df["status"] == "ok").to_numpy()
            if not ok.any():
                continue
            columns = [df[k].to_numpy() for k in spec.params]
            seconds = df["seconds"].to_numpy(float)
            factor = PHYSICAL_FACTOR[spec.kind]
            for i in ok.nonzero()[0]:
                p = {k: int(c[i]) for k, c in zip(spec.params, columns)}
                try:
                    roof = datasheet_time(spec, p, hw, "").seconds
                except InputError:  # the profile lacks this op's peak (e.g. no fp8): no roofline to hold it to
                    break
                if roof > factor * seconds[i]:
                    self._refuse_unphysical(op, df, int(i), roof, factor, hw)
        self._physical_ok.add(key)

    def _refuse_unphysical(self, op: str, df, i: int, roof: float, factor: float, hw: Any) -> None:
        run = df["run_id"].iloc[i]
        in_file = int((df["run_id"].iloc[: i + 1] == run).sum()) - 1  # rows of one run come from one file
        path = self.root / run / f"{op}.csv"
        t = float(df["seconds"].iloc[i])
        raise InputError(f"line {_csv_line(path, in_file)}: seconds={t:.3g} is {roof / t:.3g}x faster than the "
                         f"datasheet roofline of profile '{hw.name}' for this shape ({roof:.3g} s; at most {factor}x "
                         "is physical): remove the row or re-measure it", source=str(path), field="seconds")

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

    def points(self, op: str, convention: str = "graph", only: str | None = None) -> "pd.DataFrame":
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
        time of one eager call.

        `only`: a timer name; only the rows that timer made, as measured (no shift; empty when there are none): one
        series of a collective, whose conventions are separate series (`k3sim.comm.model.SERIES`)."""
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
        if only is not None:  # one timer's series
            df, timer = df[timer == only], timer[timer == only]
            if df.empty:
                return df
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
        offset = self.timer_offset_s(op, df, keys) if only is None else None
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


def read_measured(path: Path, what: str) -> bytes:
    """A measured-data file's bytes, read once through `k3sim.reader`: a regular file (a pipe could not be read
    again when the store reloads, nor fingerprinted), at most `MAX_MEASURED_BYTES`."""
    info = reader.probe(path, what=what)
    if not info.rereadable:
        raise InputError(f"is a pipe, not a file: a {what} must be a regular file", source=str(path))
    return reader.read_bytes(path, what=what, max_bytes=reader.MAX_MEASURED_BYTES)


def _read_provenance(path: Path, data: bytes | None = None) -> dict:
    """A run's provenance.yaml (its bytes when the caller read them already), checked for the keys a run has."""
    import yaml

    text = (read_measured(path, "provenance file") if data is None else data).decode("utf-8", errors="replace")
    try:
        # libyaml's parser when present (~10x faster, the same constructors): 25 runs are read per load
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except yaml.YAMLError as err:
        raise InputError(f"unreadable provenance ({err.__class__.__name__})", source=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("provenance is not a mapping: not a k3sim measurement run", source=str(path))
    missing = [k for k in PROVENANCE_KEYS if k not in data]
    if missing:
        raise InputError(f"provenance lacks {', '.join(missing)}: not a k3sim measurement run", source=str(path))
    return data


def _read_csv(path: Path, op: str, run_id: str, data: bytes) -> "pd.DataFrame":
    """One op's CSV (its bytes, read once by the caller), checked: the schema's columns, statuses, and every
    numeric column of an ok row in its range (`_check_numeric`)."""
    import pandas as pd

    spec = OPS[op]
    try:
        df = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=[""])
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
    ok = (df["status"] == "ok").to_numpy()
    for col in list(spec.params) + [c for c in df.columns if c in NUMERIC_COLUMNS]:
        df[col] = _check_numeric(df, col, ok, spec, path, data)
    df["run_id"] = run_id
    return df


def _check_numeric(df, col: str, ok, spec, path: Path, data: bytes):
    """Column `col` as numbers, refusing the first ok row whose value is not a number in its range: a
    parameter is a positive integer in the op's range (ops.py, as for a query: gpus=1 is no collective),
    `seconds` a positive number, the other `NUMERIC_COLUMNS` numbers in their bounds-table range (empty or
    `nan` = not measured). Vectorised: this runs over every row of every run at each load."""
    import numpy as np
    import pandas as pd

    from k3sim.configs.bounds import BOUNDS

    num = pd.to_numeric(df[col], errors="coerce")
    v = num.to_numpy(float)
    required = col in spec.params or col == "seconds"
    whole = col in spec.params or NUMERIC_COLUMNS[col][1]
    absent = np.isnan(v)
    if required:
        bad = ok & ~((v > 0) & (v < np.inf))  # NaN, non-numeric, zero, negative or infinite
        if col in spec.params:
            bad |= ok & ~absent & (v != np.round(v))
        _refuse_first(bad, df, col, path, data,
                      f"is not a positive {'integer' if col in spec.params else 'number'}")
    else:  # an empty cell or `nan` is "not measured"; any other text is not a number
        written = ok & absent & df[col].notna().to_numpy()
        for i in written.nonzero()[0]:
            written[i] = str(df[col].iloc[i]).strip().lower() != "nan"
        _refuse_first(written, df, col, path, data, "is not a number")
    present = ok & ~absent
    if col in spec.params:
        lo, hi = spec.ranges[col]
        _refuse_first(present & ((v < lo) | (v > hi)), df, col, path, data,
                      f"outside the op's allowed range [{lo}, {hi}]", as_int=True)
        return num
    r = BOUNDS[NUMERIC_COLUMNS[col][0]]
    outside = present & (~np.isfinite(v) | (v < r.lo) | (v > r.hi))
    if whole:
        outside |= present & np.isfinite(v) & (v != np.round(v))
    _refuse_first(outside, df, col, path, data, f"is outside {r.text()}{' (a whole number)' if whole else ''} "
                  f"({r.why}); fix the row or re-measure")
    return num


def _refuse_first(bad, df, col: str, path: Path, data: bytes, why: str, as_int: bool = False) -> None:
    """InputError naming the file, the line of the first row marked `bad`, the column and its value."""
    if not bad.any():
        return
    i = int(bad.argmax())
    cell = df[col].iloc[i]
    if isinstance(cell, str):
        shown = repr(cell)  # 'fast', quoted
    else:
        f = float(cell)
        shown = str(int(f)) if f.is_integer() and (as_int or abs(f) < 1e16) else repr(f)  # 0, -1, inf, 1e-300
    raise InputError(f"line {_csv_line(data, i)}: {col}={shown} {why}", source=str(path), field=col)


def _csv_line(source: bytes | Path, row: int) -> int:
    """The line number (1 = header) where data row `row` (0-based, as pandas counts: blank lines skipped)
    starts. Only for error lines: a quoted field may span lines, so it is not always row + 2."""
    import csv

    data = source if isinstance(source, bytes) else read_measured(source, "measured CSV")
    records = csv.reader(io.StringIO(data.decode("utf-8", errors="replace"), newline=""))
    n, header = -1, False
    while True:
        start = records.line_num + 1
        try:
            rec = next(records)
        except (StopIteration, csv.Error):
            return row + 2
        if not rec or (len(rec) == 1 and not rec[0].strip()):
            continue  # a blank line: pandas skips it too
        if not header:
            header = True
            continue
        n += 1
        if n == row:
            return start


@dataclass(frozen=True)
class StoreFiles:
    """Every file a store is built from, read once (`read_files`): per run directory its provenance and its CSVs
    (bytes, or None for a CSV that names no op: listed in `ignored`, never parsed), and `digest`, the sha256 of
    every name and byte. The store is parsed from these very bytes, so a disk cache keyed by `digest`
    (`k3sim.kernels.cache`) holds what was built and validated from them and nothing else."""

    root: Path
    runs: tuple  # ((run id, provenance path, provenance bytes, ((csv path, bytes | None), ...)), ...)
    digest: str


def read_files(root: Path | str) -> StoreFiles:
    """The bytes of every measured file under `root` (`hardware_profiles/measured/<profile>`), in load order.

    Content, not sizes and mtimes, makes the digest: a file rewritten within one tick of the file system's
    clock (Linux stamps files from a coarse clock, ~4 ms) with the same size keeps its mtime and ctime, so
    only the bytes tell. Reading ~1.5 MB and hashing it takes a few milliseconds; parsing it takes ~1 s."""
    root = Path(root)
    h = hashlib.sha256(b"k3sim-measured/1\0")
    runs = []
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        csvs = sorted(run.glob("*.csv"))
        prov = run / "provenance.yaml"
        if not reader.exists(prov):  # a broken link is there: the reader says what is wrong with it
            if csvs:
                raise InputError("run directory has CSVs but no provenance.yaml", source=str(run))
            continue
        prov_bytes = read_measured(prov, "provenance file")
        _digest_file(h, prov.relative_to(root), prov_bytes)
        files = []
        for path in csvs:
            # a CSV that names no op is never read (listed in `ignored`): its name is in the digest, its bytes
            # cannot change a result
            data = read_measured(path, "measured CSV") if path.stem in OPS else None
            _digest_file(h, path.relative_to(root), data)
            files.append((path, data))
        runs.append((run.name, prov, prov_bytes, tuple(files)))
    return StoreFiles(root=root, runs=tuple(runs), digest=h.hexdigest())


def _digest_file(h, rel: Path, data: bytes | None) -> None:
    """Name, length and bytes of one file (the length keeps two files' bytes from running together)."""
    name = str(rel).encode("utf-8", errors="surrogateescape")
    h.update(len(name).to_bytes(8, "little") + name)
    h.update(b"\xff" * 8 if data is None else len(data).to_bytes(8, "little") + data)


# Parsed stores by (root, content digest): each load reads the files again (a few ms) and reuses the parse.
_CACHE: dict[tuple, MeasurementStore] = {}


def load_store(root: Path | str, hardware: Any = None, files: StoreFiles | None = None) -> MeasurementStore:
    """Load (or return the cached copy of) every run under `root`; reloads when a file's bytes change. With the
    profile (`hardware`: a HardwareProfile or an object with its fields), rows faster than its datasheet
    roofline by more than `PHYSICAL_FACTOR` are refused (`MeasurementStore.check_physical`). `files`: the
    bytes `read_files(root)` already read (the predictor fingerprints them before deciding to parse). For a derived
    profile (`derived_from`) the store is its source's rows rescaled (`Derivation.store`), checked against the
    derived profile's roofline."""
    d = derivation(hardware) if hardware is not None else None
    if d is not None:  # a derived profile: its source's rows (checked against the source), then rescaled
        return d.store(load_store(root, d.source, files))
    root = Path(root).resolve()
    if not root.is_dir():
        raise InputError("no such measured-data directory", source=str(root))
    if files is None or Path(files.root).resolve() != root:
        files = read_files(root)
    key = (str(root), files.digest)
    if key not in _CACHE:
        _CACHE.clear() if len(_CACHE) > 16 else None
        _CACHE[key] = _load_cached(root, files, hardware)
    store = _CACHE[key]
    if hardware is not None:
        _check_physical_cached(store, hardware)
    return store


def _disk_key(root: Path, digest: str) -> str:
    """The disk-cache key of a parsed store: its directory and the digest of every byte it was parsed from."""
    from k3sim.kernels import cache

    return cache.key("store", str(root), digest)


def _load_cached(root: Path, files: StoreFiles, hardware: Any = None) -> MeasurementStore:
    """The parsed store from the disk cache (`k3sim.kernels.cache`) when these exact bytes were parsed and
    validated before, else parsed now and saved once it passed every check: its rows' ranges and, with
    `hardware`, that profile's roofline. pandas is imported either way (the store is DataFrames); the cache
    saves the CSV parsing and the row checks (~0.5 s of a 62-file load)."""
    from k3sim.kernels import cache

    k = _disk_key(root, files.digest)
    plain = cache.load(k, "store")
    store = _store_from_plain(plain, root) if plain is not None else None
    if store is None:
        store = _load(root, files)  # raises for a row that fails its checks: nothing is saved then
        if hardware is not None:
            _check_physical_cached(store, hardware)  # likewise for a row beyond the profile's roofline
        try:
            plain = _store_to_plain(store)
        except TypeError:  # a value the cache does not hold (a YAML date in a provenance): no entry
            return store
        cache.save(k, "store", plain)
    return store


def _check_physical_cached(store: MeasurementStore, hw: Any) -> None:
    """`store.check_physical(hw)`, remembered on disk per (bytes, hardware fields) once it has passed."""
    from k3sim.kernels import cache
    from k3sim.kernels.predict import _hw_key

    hk = _hw_key(hw)
    if hk in store._physical_ok or not store.content_digest:
        return store.check_physical(hw)
    k = _disk_key(store.root, store.content_digest)
    name = "physical." + hashlib.sha256(repr(hk).encode()).hexdigest()[:32]
    if cache.load(k, name) is True:
        store._physical_ok.add(hk)
        return None
    store.check_physical(hw)  # raises for a row beyond the roofline: no marker is saved then
    cache.save(k, name, True)
    return None


def _store_to_plain(store: MeasurementStore) -> Any:
    """The store as builtins for the disk cache: per op its columns in order, numbers as raw arrays, strings
    (pandas' string dtype, with its storage and missing-value marker) and mixed columns as lists. TypeError for
    anything else (then the store is not cached)."""
    import numpy as np
    import pandas as pd

    from k3sim.kernels.cache import to_plain

    rows = []
    for op, df in store.rows.items():
        if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
            raise TypeError("only a default index is cached")
        cols = []
        for name in df.columns:
            col, dt = df[name], df[name].dtype
            if isinstance(dt, np.dtype) and dt.kind in "biuf":
                cols.append((str(name), "numpy", col.to_numpy()))
            elif isinstance(dt, pd.StringDtype) and (dt.na_value is np.nan or dt.na_value is pd.NA):
                cols.append((str(name), "string", dt.storage, "nan" if dt.na_value is np.nan else "NA",
                             [v if isinstance(v, str) else None for v in col.tolist()]))
            elif dt == object:
                cols.append((str(name), "object", col.tolist()))
            else:
                raise TypeError(f"column dtype {dt} is not cached")
            if str(name) != name:
                raise TypeError("only string column names are cached")
        rows.append((op, len(df), cols))
    return to_plain({"rows": rows, "runs": store.runs, "ignored": store.ignored, "fingerprint": store.fingerprint,
                     "op_fingerprints": store.op_fingerprints, "content_digest": store.content_digest})


def _store_from_plain(plain: Any, root: Path) -> MeasurementStore | None:
    """The inverse of `_store_to_plain`; None for an entry that does not decode (it is then rebuilt)."""
    import numpy as np
    import pandas as pd

    from k3sim.kernels.cache import from_plain

    try:
        d = from_plain(plain)
        rows = {}
        for op, n, cols in d["rows"]:
            index = pd.RangeIndex(n)
            data = {}
            for c in cols:
                if c[1] == "numpy":
                    data[c[0]] = c[2]
                elif c[1] == "string":
                    dt = pd.StringDtype(c[2], na_value=np.nan if c[3] == "nan" else pd.NA)
                    data[c[0]] = pd.Series(c[4], dtype=dt, index=index)
                elif c[1] == "object":  # a Series: an object array would be inferred as strings
                    data[c[0]] = pd.Series(c[2], dtype=object, index=index)
                else:
                    return None
            rows[op] = pd.DataFrame(data, index=index)
        return MeasurementStore(root=root, runs=d["runs"], rows=rows, ignored=d["ignored"],
                                fingerprint=d["fingerprint"], op_fingerprints=d["op_fingerprints"],
                                content_digest=d["content_digest"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def _load(root: Path, files: StoreFiles) -> MeasurementStore:
    import pandas as pd

    runs: dict[str, dict] = {}
    parts: dict[str, list] = {}
    ignored: list[str] = []
    digests: dict[str, "hashlib._Hash"] = {}
    for run_id, prov, prov_bytes, csvs in files.runs:
        runs[run_id] = _read_provenance(prov, prov_bytes)
        for path, data in csvs:
            if data is None:
                ignored.append(str(path.relative_to(files.root)))
                continue
            parts.setdefault(path.stem, []).append(_read_csv(path, path.stem, run_id, data))
            d = digests.setdefault(path.stem, hashlib.sha256())
            d.update(str(path.relative_to(files.root)).encode())
            d.update(data)
    rows = {op: pd.concat(dfs, ignore_index=True) for op, dfs in parts.items()}
    op_fp = {op: d.hexdigest()[:16] for op, d in sorted(digests.items())}
    total = hashlib.sha256("".join(f"{k}:{v};" for k, v in op_fp.items()).encode()).hexdigest()[:16]
    return MeasurementStore(root=root, runs=runs, rows=rows, ignored=ignored, fingerprint=total,
                            op_fingerprints=op_fp, content_digest=files.digest)


# ---- derived profiles (issue 21 item 6) ------------------------------------------------------------------

# The rule's version: in the target's hardware key (`kernels.predict._hw_key`, hence every cache key of a derived
# profile) and in the derived store's disk-cache key. Bump it with any change of what `Derivation` computes.
DERIVATION_RULE = "derived-1"
# Fraction of its datasheet roofline from which a row's whole time counts as set by its roof (`Derivation`, the
# latency share): a modelling choice, justified with the committed H200 rows in `Derivation`'s docstring.
BOUND_FRACTION = 0.5
_SOURCES: dict[tuple, tuple] = {}  # (target name, source reference, target compute) -> (source, derivation key)
_DERIVATIONS: dict[tuple, "Derivation"] = {}
_DERIVED: dict[tuple, MeasurementStore] = {}


def _source_of(hw: Any) -> tuple[Any, tuple] | None:
    """(the source profile, the derivation key) of a derived profile, None for any other; checked and loaded
    once per process (`configs.profiles.derived_source`). The key holds the rule, `BOUND_FRACTION` and the
    source's own hardware key: a change of any of them, or of the source's datasheet figures, is a new key."""
    spec = getattr(hw, "derived_from", None)
    if spec is None:
        return None
    ref = spec.profile if isinstance(spec.profile, str) else id(spec.profile)
    compute = (tuple(sorted(dict(hw.peak_flops_per_s or {}).items())), getattr(hw, "num_sms", None))
    k = (str(hw.name), ref, compute)
    hit = _SOURCES.get(k)
    if hit is None or (not isinstance(spec.profile, str) and hit[0] is not spec.profile):
        from k3sim.configs.profiles import derived_source
        from k3sim.kernels.predict import _hw_key

        src = derived_source(hw)
        hit = _SOURCES[k] = (src, (DERIVATION_RULE, BOUND_FRACTION, _hw_key(src)))
    return hit


def derivation_key(hw: Any) -> tuple:
    """What the rows of a derived profile depend on beyond its own fields (`_source_of`); () for others."""
    hit = _source_of(hw)
    return () if hit is None else hit[1]


def derivation(hw: Any) -> "Derivation | None":
    """The `Derivation` of a derived profile (one per hardware key and process), None for any other."""
    hit = _source_of(hw)
    if hit is None:
        return None
    from k3sim.configs.profiles import measured_dir
    from k3sim.kernels.predict import _hw_key

    k = _hw_key(hw)
    if k not in _DERIVATIONS:
        _DERIVATIONS[k] = Derivation(target=hw, source=hit[0], source_dir=measured_dir(hit[0]), key=hit[1])
    return _DERIVATIONS[k]


@dataclass(frozen=True)
class Derivation:
    """A derived profile's rows from its source's (rule `DERIVATION_RULE`; docs/sources.md "Derived hardware profiles", issue 21 item 6).

    The source (H200) and the target (H100 SXM, H800) are one GH100 SXM die: same SMs, clocks, Tensor Cores
    and 50 MB L2 (`configs.profiles.derived_source` refuses any other pair). They differ in HBM (4.8 against
    3.35 TB/s) and, for the H800, in NVLink (400 GB/s bidirectional against 900). Per measured row, with its op's
    own FLOP and byte formulas (`kernels.ops`) and the datasheet figures:

        t_c = FLOP / peak,   t_m = bytes / HBM bandwidth of the source,   r = source / target HBM bandwidth
        s   = max(t_c, r t_m) / max(t_c, t_m)        the roofline's own ratio at the datasheet ridge
        u   = max(t_c, t_m) / t                      the fraction of its source roofline the row reached
        w   = min(1, u / BOUND_FRACTION)             the share of the row's time its roof sets
        t'  = t (1 + (s - 1) w)

    - Compute-bound (t_c >= r t_m): s = 1, the measured time is kept. Memory-bound (t_m >= t_c): s = r, the time
      scales by the HBM bandwidth ratio (4.8 / 3.35 = 1.433). Between the two ridges (t_m < t_c < r t_m) the row
      takes the max of both scaled parts: on the target the slower roof sets the time. Chosen over a blend
      (sum) of the parts because the max is exact at both ends (a compute-bound GEMM with a small memory part
      keeps its time; a pure stream scales by r) and continuous through the ridge, so neighbouring shapes never
      step apart and the interpolation sees a smooth surface.
    - Latency share (w): a row far below its roofline is set by launch, ramp, tail and dependent steps, which a
      slower HBM does not lengthen (the targets' HBM3 latency is taken as the H200's HBM3e latency). In the
      committed H200 rows (graph-preferred points) the kernels bound by a roof by every other sign reach
      0.58-0.90 of it at their large shapes (hbm_copy 0.90, gemm_bf16 0.86, mla_decode 0.84, gemm_fp8 0.80,
      residual_add 0.76, moe_ffn_grouped_bf16 0.69, recurrent_kda_decode 0.67, moe_ffn_grouped_fp8 0.585), while
      the decode-size norms and activations (rmsnorm, silu_mul at T <= 64: under 0.045), router_topk (under
      0.01) and rope (under 0.05) sit on their latency plateau, their time not falling with the shape; copies
      of 1-4 MiB reach 0.20-0.46. At u >= 0.5 (`BOUND_FRACTION`) the whole time counts as the roof's; below,
      the scaled share falls linearly with u, so a 1 %-of-roofline kernel stays as measured (x1.009 at most) and
      no step appears at the threshold. chunk_kda (fla's chunked KDA, 0.03-0.08 of its HBM roofline: bound by
      the serial chunk recurrence and its launches, by neither roof) moves by at most 7 %; the MXFP4 token
      expert kernel (moe_mxfp4_decode, at most 0.33: dequantisation and its launches) by at most 29 %, which is
      why a derived H100 K3 decode step is x1.28 the H200's and not x1.43 (x1.39 with BOUND_FRACTION 0.25,
      x1.16 with 1.0: the weight of the choice; kimi-k3, TP8 PP2 EP8, batch 64, 32K context, graph).
    - Collectives: t' = alpha + (t - alpha) L, alpha the source fit's latency for the row's GPU count (capped at
      t), L = source / target link bandwidth for that count (`configs.profiles.link_bandwidth`: NVLink inside a
      node, 450 / 200 = 2.25 for the H800, 1 for the H100 SXM). The achieved fraction of the link is the
      source's; the collective model (`k3sim.comm`) reads it from the rescaled fit (`fit`), so it stays <= 1.
    - Where it applies: every row of the source (`store`: the derived store, each ok row with its `source` words
      and `derived_factor`); every single-GPU kernel answer (`kernel_time`: the source predictor's answer at the
      shape, rescaled by the same rule, so interpolated and modelled shapes follow it too); every collective
      answer through the collective model over the derived rows and the rescaled fit (`fit`: each roofline
      fit's HBM bandwidth replaced by the target's, each bus bandwidth divided by L, latencies kept).

    What it ignores (the profile's `derived_from.ignores`, named in every derived answer's detail): clocks under
    each board's power limit, HBM latency and L2 behaviour beyond "equal", the target machine's host (launch
    times `host_s` are kept), NVLink hop latency at the H800's lower link bandwidth, scale-out (no cross-node
    row was measured: the NIC figures are the profile's own)."""

    target: Any
    source: Any
    source_dir: Path
    key: tuple

    @property
    def hbm_ratio(self) -> float:
        """Source over target HBM bandwidth: the time factor of a memory-bound row (4.8 / 3.35 for the H100)."""
        return float(self.source.hbm_bandwidth_bytes_per_s) / float(self.target.hbm_bandwidth_bytes_per_s)

    def link_ratio(self, gpus: int) -> float:
        """Source over target link bandwidth for a collective over `gpus` ranks (the link it runs on)."""
        from k3sim.configs.profiles import link_bandwidth

        return link_bandwidth(self.source, gpus)[0] / link_bandwidth(self.target, gpus)[0]

    def fingerprint(self, fp: str, chars: int = 16) -> str:
        """A source fingerprint (store or fit) carried to the derived rows: equal derived fingerprints mean equal
        source fingerprints under the same rule, so the rescaled fit matches the derived rows exactly when the
        source's fit matched the source's rows (`fit.op_fit`)."""
        return hashlib.sha256(f"{fp}\0{self.key!r}".encode()).hexdigest()[:chars] if fp else ""

    def roofs(self, spec, rows: list[dict]):
        """(t_c, t_m) per row on the source's datasheet: the op's own FLOP / peak and bytes / HBM bandwidth."""
        import numpy as np

        from k3sim.configs.profiles import peak_flops

        try:
            peak = peak_flops(self.source, spec.dtype)
        except InputError:  # no peak for this dtype: the row is priced by its bytes only
            peak = float("inf")
        bw = float(self.source.hbm_bandwidth_bytes_per_s)
        return (np.array([spec.flop(p) / peak for p in rows], float),
                np.array([spec.bytes(p) / bw for p in rows], float))

    def kernel_factors(self, spec, rows: list[dict], seconds):
        """(t' / t, s, w) per row of a single-GPU kernel (the class docstring's rule)."""
        import numpy as np

        tc, tm = self.roofs(spec, rows)
        roof = np.maximum(tc, tm)
        s = np.maximum(tc, self.hbm_ratio * tm) / roof
        w = np.minimum(1.0, roof / np.asarray(seconds, float) / BOUND_FRACTION)
        return 1.0 + (s - 1.0) * w, s, w

    def collective_factors(self, rows: list[dict], seconds, alphas):
        """t' / t per collective row: the latency (alpha, capped at t) kept, the rest times the link ratio."""
        import numpy as np

        t = np.asarray(seconds, float)
        a = np.minimum(np.asarray(alphas, float), t)
        L = np.array([self.link_ratio(int(p["gpus"])) for p in rows], float)
        return (a + (t - a) * L) / t, L

    def kernel_class(self, s: float, w: float) -> str:
        """A row's place in the rule, in words (its `source` column and every derived answer's)."""
        if abs(s - 1.0) < 1e-12:
            return "compute-bound, kept"
        if w < 1.0:
            return "latency share kept"
        return "memory-bound" if abs(s - self.hbm_ratio) < 1e-12 else "near the ridge"

    def note(self) -> str:
        """What every derived answer's detail adds: the rule, its ratios, and where the profile lists what the
        rule ignores."""
        up = self.link_ratio(2)
        return (f"derived for {self.target.name} from {self.source.name}'s measured rows by rule {DERIVATION_RULE} "
                f"(k3sim.kernels.store.Derivation: compute-bound kept, memory-bound x{self.hbm_ratio:.4g} HBM, "
                f"collective bandwidth part x{up:.4g} NVLink, latency kept); what it ignores: derived_from.ignores "
                f"of profile {self.target.name}")

    def _source_fit(self, src: MeasurementStore):
        """The source's committed fit (None without one) and the sha256 of its bytes ('none')."""
        from k3sim.kernels.fit import FITTED_NAME, read_fitted, read_fitted_bytes

        data = read_fitted_bytes(Path(src.root) / FITTED_NAME)
        if data is None:
            return None, "none"
        return read_fitted(Path(src.root) / FITTED_NAME, data), hashlib.sha256(data).hexdigest()

    def store(self, src: MeasurementStore) -> MeasurementStore:
        """The derived store of the source store `src`: in-process once per (source bytes, fit, rule, hardware),
        on disk like the source's parsed store (`k3sim.kernels.cache`, builtins only), saved only after its rows
        passed the target's roofline check. A warm predictor never gets here: its op entries are cached under
        a key holding the same parts (`kernels.predict.ProfilePredictor`)."""
        from k3sim.kernels import cache
        from k3sim.kernels.predict import _hw_key

        fitted, fit_digest = self._source_fit(src)
        k = (str(src.root), src.content_digest, fit_digest, repr(_hw_key(self.target)))
        if k in _DERIVED:
            return _DERIVED[k]
        disk = cache.key("derived-store", *k)
        plain = cache.load(disk, "store")
        store = _store_from_plain(plain, Path(src.root)) if plain is not None else None
        if store is None:
            store = self._derive(src, fitted)
            _check_physical_cached(store, self.target)  # raises for a row beyond the target's roofline
            try:
                cache.save(disk, "store", _store_to_plain(store))
            except TypeError:  # a value the cache does not hold: derived again next time
                pass
        _DERIVED.clear() if len(_DERIVED) > 16 else None
        _DERIVED[k] = store
        return store

    def _derive(self, src: MeasurementStore, fitted) -> MeasurementStore:
        """Every row of `src` rescaled by the rule; ok rows get `derived_factor` (t' / t) and `source` (the rule's
        words), failed rows keep their (absent) times with factor 1."""
        import numpy as np

        from k3sim.kernels.fit import op_fit

        rows = {}
        for op, df in src.rows.items():
            spec = OPS[op]
            t = df["seconds"].to_numpy(float)
            ok = ((df["status"] == "ok").to_numpy() & np.isfinite(t) & (t > 0)).nonzero()[0]
            cols = [df[k].to_numpy() for k in spec.params]
            params = [{k: int(c[i]) for k, c in zip(spec.params, cols)} for i in ok]
            factor = np.ones(len(df))
            words = np.full(len(df), "", dtype=object)
            tk = self._kernel_seconds(src, op, df, t)
            if len(ok) and spec.kind == "collective":
                fit = op_fit(src, fitted, op, self.source)[0].alpha_beta
                alphas = [fit[min(fit, key=lambda n, g=p["gpus"]: (abs(n - g), n))].alpha_s for p in params]
                f, L = self.collective_factors(params, tk[ok], alphas)
                what = [f"collective: bandwidth part x{x:.4g}, latency kept" for x in L]
            elif len(ok):
                f, s, w = self.kernel_factors(spec, params, tk[ok])
                what = [self.kernel_class(a, b) for a, b in zip(s, w)]
            if len(ok):  # the increment of the kernel's own time, added to the row as timed (see _kernel_seconds)
                factor[ok] = (t[ok] + (f - 1.0) * tk[ok]) / t[ok]
                words[ok] = [f"derived from {self.source.name} ({x}; x{y:.4g})" for x, y in zip(what, factor[ok])]
            out = df.copy()
            for col in ("seconds", "seconds_p20", "seconds_p80"):  # the spread of the repetitions is kept
                if col in out.columns:
                    out[col] = out[col].to_numpy(float) * factor
            out["derived_factor"] = factor
            out["source"] = words
            rows[op] = out
        return MeasurementStore(root=src.root, runs=src.runs, rows=rows, ignored=list(src.ignored),
                                fingerprint=self.fingerprint(src.fingerprint),
                                op_fingerprints={op: self.fingerprint(v) for op, v in src.op_fingerprints.items()},
                                content_digest=self.fingerprint(src.content_digest, 64))

    @staticmethod
    def _kernel_seconds(src: MeasurementStore, op: str, df, t):
        """Each row's kernel time as a CUDA-graph replay runs it: graph rows as measured, event-timed rows plus the
        op's graph-minus-events offset (`MeasurementStore.timer_offset_s`, with `points`' guard of half the row)
        where some shape was timed both ways. The rule rescales this time and the row gains the increment, so
        the offset between the timers (a per-launch latency) is kept, not rescaled: a compute-bound shape timed
        by events only answers exactly as on the source after `points` shifts it."""
        import numpy as np

        tk = np.array(t, float)
        offset = src.timer_offset_s(op) if "timer" in df.columns else None
        if offset is not None:
            ev = (df["timer"].fillna("events").astype(str) != "graph").to_numpy()
            tk[ev] = np.maximum(tk[ev] + offset, 0.5 * tk[ev])
        return tk

    def fit(self, fp):
        """The source's `FittedProfile` for the target: each roofline fit's HBM bandwidth replaced by the target's
        (its memory term x r; compute, launch and floor kept), each alpha-beta fit's bus bandwidth divided by the
        link ratio of its GPU count (alpha kept); data fingerprints carried (`fingerprint`). None stays None."""
        import dataclasses

        from k3sim.kernels.fit import FittedProfile
        from k3sim.kernels.model import AlphaBetaFit

        if fp is None:
            return None
        ops = {}
        for name, f in fp.ops.items():
            roof = None if f.roofline is None else dataclasses.replace(
                f.roofline, bandwidth_bytes_per_s=f.roofline.bandwidth_bytes_per_s / self.hbm_ratio)
            ab = {n: AlphaBetaFit(a.alpha_s, a.bus_bandwidth_bytes_per_s / self.link_ratio(n))
                  for n, a in f.alpha_beta.items()}
            ops[name] = dataclasses.replace(f, roofline=roof, alpha_beta=ab, runs=list(f.runs),
                                            data_fingerprint=self.fingerprint(f.data_fingerprint))
        return FittedProfile(profile=str(self.target.name),
                             fit_date=f"{fp.fit_date}, {self.source.name}'s fit rescaled by rule {DERIVATION_RULE}",
                             data_fingerprint=self.fingerprint(fp.data_fingerprint), ops=ops)

    def kernel_time(self, spec, p: dict, convention: str):
        """A single-GPU kernel's answer on the target: the source predictor's answer for shape `p` (measured,
        interpolated, model or extrapolated), rescaled by the rule at this shape: t' = t + (f - 1) t_graph, f from
        the source's graph-convention time t_graph (the kernel's own time), so under "eager" the host launch
        time is kept. Applied to answers rather than interpolated from the derived rows: the fitted model splits
        compute and memory differently from the datasheet ridge, and residuals interpolated over rescaled rows
        would answer off-grid shapes with a factor the rule does not give (mla_decode at B=64, C=32K,
        H=16: x1.485 against the rule's x1.433). At a shape measured under CUDA-graph replay this is the derived
        row (`_derive`) exactly. A source without any row of the op gives the target's own datasheet roofline,
        labelled as such."""
        import dataclasses

        from k3sim.kernels.predict import datasheet_time, profile_predictor

        src = profile_predictor(self.source)  # the predictor memoises this answer (ProfilePredictor.predict)
        g = src.predict(spec.name, p, "graph")
        if g.source == "datasheet-roofline":
            return dataclasses.replace(datasheet_time(spec, p, self.target, f"{self.source.name}, which profile "
                                                     f"{self.target.name} is derived from, has no usable row of "
                                                     f"{spec.name}"), convention=convention)
        base = g if convention == "graph" else src.predict(spec.name, p, convention)
        f, s, w = (float(x[0]) for x in self.kernel_factors(spec, [p], [g.seconds]))
        t_new = base.seconds + (f - 1.0) * g.seconds
        return dataclasses.replace(base, seconds=t_new, source=f"derived from {self.source.name} "
                                   f"({self.kernel_class(s, w)}; x{t_new / base.seconds:.4g}): {base.source}",
                                   detail=f"{base.detail}; {self.note()}")

    def collective_label(self, p: dict, kt):
        """A collective's answer (the collective model over the derived rows and fit) with its source saying it is
        derived and how; a datasheet answer (no measured collective to derive from) keeps its source."""
        import dataclasses

        if kt.source == "datasheet-roofline":
            return dataclasses.replace(kt, detail=f"{kt.detail}; profile {self.target.name} is derived from "
                                                  f"{self.source.name}, which has no usable row of this collective")
        return dataclasses.replace(kt, source=f"derived from {self.source.name} (collective: bandwidth part "
                                              f"x{self.link_ratio(int(p['gpus'])):.4g}, latency kept): {kt.source}",
                                   detail=f"{kt.detail}; {self.note()}")
