"""Error bands of the step model's headline figures, from the project's own whole-step checks (issue 24 item 4).

A check is one step measured on a GPU (`k3sim/calibration/wholestep/`: CUDA-graph decode steps, eager mixed
prefill steps, eager training forward / forward+backward of layer slices) and predicted by today's step model:
signed error e = predicted / measured - 1. The table of every check (`<measured dir>/step_bands.csv`, written by
`python3 -m k3sim.validation.bands`, which records the fingerprint of its inputs in `step_bands.yaml` beside it)
is data; this module only reads it, so every layer above configs (decode, serving, training, planner, commands)
may band its figures without importing validation.

The band of a figure made of one kind of step (decode, prefill, train) is the envelope of that kind's checks:
a prediction P of a measured M = P / (1 + e), so over the checks' errors [e_min, e_max] the measured value lay in
[P / (1 + e_max), P / (1 + e_min)]. The envelope (every check inside), not a quantile: the checks are tens of
points from a few configurations and runs, not independent draws, so a 5-95 % quantile would claim a coverage
the sample cannot support. Zero is always inside [e_min, e_max] (`low_factor` <= 1 <= `high_factor`): the figure
itself stays in its band, because the point figure is not corrected by the checks' mean bias (that would be
fitting the model to its own test) and a configuration never measured may be predicted exactly.

Which checks a profile gets (`step_band`):
- its own `step_bands.csv` (a profile with measured kernels and whole-step checks: H200): rows of basis
  "measured", calibration "measured";
- a derived profile (`derived_from`, kernels rescaled from the measured source) or a measured profile without
  whole-step checks: the source's (else H200's) "measured" rows, calibration "carried", and the words saying so;
- a datasheet-only profile (no measured kernels: every kernel a datasheet roofline): H200's rows of basis
  "datasheet", calibration "uncalibrated": the same H200 steps predicted from the H200's datasheet figures alone
  against their measured times, the spread a datasheet-only prediction showed on the one GPU where it could be
  checked (wide: the roofline has no latency, launch or efficiency term).
Within the rows: the model's own family (its `name` equals a checked model's) where measured, else every checked
family pooled, said so.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

BAND_FILE = "step_bands.csv"
CHECKED_PROFILE = "h200"  # the profile whose whole-step checks profiles without their own are given
KINDS = ("decode", "prefill", "train")
BASES = ("measured", "datasheet")
COLUMNS = ("profile", "basis", "kind", "family", "config", "run", "point", "measured_s", "predicted_s", "error",
           "used", "note")
MAX_BYTES = 4 * 2 ** 20  # a band table is a few hundred checks (~60 KB); a larger file is not one
KIND_WORDS = {"decode": "decode", "prefill": "mixed prefill", "train": "training"}


@dataclass(frozen=True)
class Band:
    """The band of figures made of one kind of step, for one model on one profile.

    `error_min` / `error_max`: the envelope of the checks' signed errors (predicted / measured - 1);
    a time T lies in [T x low_factor, T x high_factor], a rate R in [R / high_factor, R / low_factor]."""

    kind: str
    model: str
    hardware: str
    profile: str               # whose checks
    basis: str                 # "measured" | "datasheet" (how the checked predictions were made)
    calibration: str           # "measured" | "carried" | "uncalibrated"
    family: str | None         # the checked model the rows are of; None: every checked family pooled
    checks: int
    error_min: float
    error_max: float
    families: tuple[str, ...]  # the checked models the rows are of
    configs: tuple[str, ...]
    runs: tuple[str, ...]
    caveat: str = ""

    @property
    def low_factor(self) -> float:
        return 1.0 / (1.0 + max(self.error_max, 0.0))

    @property
    def high_factor(self) -> float:
        return 1.0 / (1.0 + min(self.error_min, 0.0))

    def times(self, seconds: float) -> tuple[float, float]:
        """(low, high) of a time made of this kind of step (TPOT, TTFT, step time)."""
        return seconds * self.low_factor, seconds * self.high_factor

    def rates(self, rate: float) -> tuple[float, float]:
        """(low, high) of a rate inverse to the step time (tokens/s, MFU)."""
        return rate / self.high_factor, rate / self.low_factor

    def describe(self) -> str:
        """Which checks the band comes from, in words (the report and the CLI print it)."""
        how = "" if self.basis == "measured" else " predicted from datasheet figures alone"
        text = (f"{self.checks} {KIND_WORDS[self.kind]} checks of {', '.join(self.families)} on {self.profile}{how} "
                f"(errors {100 * self.error_min:+.1f} % to {100 * self.error_max:+.1f} %; runs {', '.join(self.runs)})")
        return text + (f"; {self.caveat}" if self.caveat else "")

    def to_json(self) -> dict:
        return {"kind": self.kind, "model": self.model, "hardware": self.hardware, "checks_profile": self.profile,
                "basis": self.basis, "calibration": self.calibration, "family": self.family,
                "families": list(self.families), "checks": self.checks,
                "error_min": self.error_min, "error_max": self.error_max, "low_factor": self.low_factor,
                "high_factor": self.high_factor, "runs": list(self.runs), "caveat": self.caveat,
                "source": self.describe()}


def read_rows(path: str | Path) -> list[dict]:
    """The checks of a band table (CSV, `COLUMNS`), typed; InputError naming the file when it is not one."""
    from k3sim.errors import InputError
    from k3sim.reader import read_text

    rows = list(csv.DictReader(read_text(path, what="band table", max_bytes=MAX_BYTES).splitlines()))
    if rows and set(COLUMNS) - set(rows[0]):
        raise InputError(f"not a band table: columns {', '.join(sorted(set(COLUMNS) - set(rows[0])))} missing "
                         "(write it with `python3 -m k3sim.validation.bands`)", source=str(path))
    out = []
    for r in rows:
        try:
            out.append({**r, "measured_s": float(r["measured_s"]), "predicted_s": float(r["predicted_s"]),
                        "error": float(r["error"]), "used": r["used"].strip().lower() in ("1", "true")})
        except ValueError:
            raise InputError(f"a check with a non-numeric error or time: {r}", source=str(path)) from None
    return out


_CACHE: dict = {}


def _table(path: Path) -> list[dict]:
    """`read_rows` memoised on (path, mtime): a warm query reads the small CSV once."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = read_rows(path)
    return _CACHE[key]


def _band_file(hw: Any) -> tuple[Path | None, str, str]:
    """(the band table `hw` reads or None, its basis, its calibration), per the module docstring."""
    from k3sim.configs.profiles import derived_source, measured_dir, profiles_dir

    own = measured_dir(hw)
    if own is not None and (own / BAND_FILE).is_file():
        return own / BAND_FILE, "measured", "measured"
    src = derived_source(hw)
    src_dir = measured_dir(src) if src is not None else None
    checked = profiles_dir() / "measured" / CHECKED_PROFILE / BAND_FILE
    if src_dir is not None and (src_dir / BAND_FILE).is_file():
        return src_dir / BAND_FILE, "measured", "carried"
    path = checked if checked.is_file() else None
    return path, ("measured" if own is not None or src is not None else "datasheet"), \
        ("carried" if own is not None or src is not None else "uncalibrated")


def _caveat(hw: Any, calibration: str, profile: str) -> str:
    if calibration == "measured":
        return ""
    if calibration == "uncalibrated":
        return (f"{hw.name} has no measured kernels (datasheet figures only), so the band is wide: the spread of "
                f"{profile}'s own steps predicted from its datasheet alone")
    if getattr(hw, "derived_from", None) is not None:
        return (f"carried from {profile}: {hw.name}'s kernels are {profile}'s measurements rescaled to its "
                f"datasheet, and no whole step was checked on {hw.name}")
    return f"carried from {profile}: no whole step was checked on {hw.name}"


def band_from_rows(rows: Iterable[dict], *, kind: str, model: str, hardware: str, basis: str = "measured",
                   calibration: str = "measured", caveat: str = "") -> Band | None:
    """The band of `kind` for `model` from check rows (the used rows of `basis`): the model's family where it
    has checks of this kind, else every family pooled. None when no check of the kind exists."""
    rows = [r for r in rows if r["used"] and r["basis"] == basis and r["kind"] == kind]
    if not rows:
        return None
    own = [r for r in rows if r["family"] == model]
    pick = own or rows
    errs = [r["error"] for r in pick]
    if not all(math.isfinite(e) and e > -1 for e in errs):
        raise ValueError(f"a {kind} check has an error outside (-1, inf): {min(errs)}")
    note = caveat
    if not own:
        pooled = f"{model} has no {KIND_WORDS[kind]} check of its own: every checked model's are pooled"
        note = "; ".join(x for x in (pooled, caveat) if x)
    return Band(kind=kind, model=model, hardware=hardware, profile=pick[0]["profile"], basis=basis,
                calibration=calibration, family=model if own else None, checks=len(pick), error_min=min(errs),
                error_max=max(errs), families=tuple(sorted({r["family"] for r in pick})),
                configs=tuple(sorted({r["config"] for r in pick})),
                runs=tuple(sorted({r["run"] for r in pick})), caveat=note)


def step_band(hw: Any, kind: str, model: str, rows: list[dict] | None = None) -> Band | None:
    """The band of figures made of `kind` steps ("decode", "prefill", "train") of the model named `model` on
    profile `hw` (a HardwareProfile); `rows` replaces the profile's table (tests). None when the profile has no
    table to read or the table no check of the kind."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    path, basis, calibration = _band_file(hw)
    if rows is None:
        if path is None:
            return None
        rows = _table(path)
    profile = rows[0]["profile"] if rows else CHECKED_PROFILE
    return band_from_rows(rows, kind=kind, model=model, hardware=str(hw.name), basis=basis,
                          calibration=calibration, caveat=_caveat(hw, calibration, profile))
