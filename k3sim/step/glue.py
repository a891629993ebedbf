"""Training glue: what the kernels the op registry has not measured really cost, from whole-step profiles.

The step model prices unregistered kernels (MoE permute / combine, short conv, gated norm, KV writes,
the small ops' backward) by the HBM-copy proxy over the bytes they must move. A training framework's
routing glue does far more than that: the whole-step profiles of 2026-12-01 (torch.profiler, run
`20261201-wholestep-train-b`) show token gathers, masked selects, the routing-weight multiply, fp32
index_add with its casts and fills, and autograd's backward of each - the pattern of Megatron-core's
unfused `permute` / `unpermute` (index_select, scatter_add) - at about ten times the proxy's time in the
forward and six in the backward, stable to 2 % across shapes within a configuration.

`GlueCalibration` carries that as two factors on the proxy-priced calls of the glue families (`is_glue`:
forward; backward). They are
fitted on one configuration's profiled points (`k3sim check fit-glue`, validation/glue_fit.py: fitting is
validation work, this module only reads the result) and kept with their provenance in
`<measured dir>/training_glue.yaml`; a profile without its own file uses H200's (the factors describe the
software's glue relative to a copy, not the GPU). `GlueCalibration.proxy()` (factors 1) is the bytes-only
model: a stack with fused permute kernels (Transformer Engine's moe_permute) would sit near it, unmeasured.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from k3sim.configs.planning import GLUE_MODES  # the training option `moe_glue` (one list, in its schema)
from k3sim.step.families import PROXIED, op_family

GLUE_FILE = "training_glue.yaml"


@dataclass(frozen=True)
class GlueCalibration:
    """Factors on the proxy time of the glue calls, with where they were fitted (`config` at `points`,
    each "SEQxMB", of run `run`; empty for the bytes-only proxy)."""

    fwd: float = 1.0
    bwd: float = 1.0
    source: str = "proxy: HBM-copy time of the bytes moved (no glue calibration)"
    run: str = ""
    config: str = ""
    points: tuple[str, ...] = ()

    @classmethod
    def proxy(cls) -> "GlueCalibration":
        return cls()

    def fit_shapes(self) -> set[tuple[str, int, int]]:
        """(config, seq, micro-batch) of the points the factors were fitted on."""
        out = set()
        for p in self.points:
            q, _, m = p.partition("x")
            out.add((self.config, int(q), int(m)))
        return out


def glue_for(hw: Any, mode: str) -> GlueCalibration:
    """The calibration a training option `moe_glue` asks for: the profile's ("calibrated") or none ("proxy")."""
    from k3sim.errors import InputError

    if mode not in GLUE_MODES:
        raise InputError(f"must be {' or '.join(GLUE_MODES)}, got {mode!r}", field="moe_glue")
    return load_glue(hw) if mode in ("calibrated", "auto") else GlueCalibration.proxy()


def _h200_file() -> Path:
    from k3sim.configs.profiles import profiles_dir

    return profiles_dir() / "measured" / "h200" / GLUE_FILE


def load_glue(hw: Any) -> GlueCalibration:
    """The glue calibration for `hw`: its measured directory's file, else H200's, else the proxy."""
    from k3sim.configs.profiles import measured_dir

    try:
        d = measured_dir(hw)
    except Exception:  # noqa: BLE001 - a broken calibration_dir is the predictor's error to report
        d = None
    own = d / GLUE_FILE if d is not None else None
    path = own if own is not None and own.is_file() else _h200_file()
    if not path.is_file():
        return GlueCalibration.proxy()
    fwd, bwd, run, config, points = _read(str(path), path.stat().st_mtime_ns)
    where = "" if path == own else f" (carried to profile '{getattr(hw, 'name', hw)}')"
    return GlueCalibration(fwd, bwd, f"glue calibration {run} {config} at {list(points)}{where}", run, config,
                           points)


@lru_cache(maxsize=16)
def _read(path: str, mtime_ns: int) -> tuple[float, float, str, str, tuple[str, ...]]:
    """The calibration file, parsed and checked once per version (a sweep calls the layer costs thousands
    of times). A broken file is bad input: InputError naming the file and the field."""
    import math
    import re

    import yaml

    from k3sim.errors import InputError

    try:
        from k3sim.kernels.store import read_measured  # one reader: a regular file, size-capped

        doc = yaml.safe_load(read_measured(Path(path), "training glue calibration").decode("utf-8", errors="replace"))
    except yaml.YAMLError as err:
        raise InputError(f"not valid YAML ({str(err).splitlines()[0]})", source=path) from None
    if not isinstance(doc, dict):
        raise InputError("expected a mapping with fwd, bwd, run, config, points", source=path)
    out = []
    for key in ("fwd", "bwd"):
        v = doc.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InputError(f"must be a positive number (a factor on the proxy time), got {v!r}", source=path,
                             field=key)
        out.append(float(v))
    for key in ("run", "config", "points"):
        if key not in doc:
            raise InputError("missing (the provenance of the factors)", source=path, field=key)
    pts = doc["points"]
    if not isinstance(pts, list) or not all(isinstance(p, str) and re.fullmatch(r"[1-9]\d*x[1-9]\d*", p) for p in pts):
        raise InputError(f"expected a list of SEQxMB points like 4096x1, got {pts!r}", source=path, field="points")
    return out[0], out[1], str(doc["run"]), str(doc["config"]), tuple(pts)


def is_glue(op: str) -> bool:
    """Whether the factors apply to a proxy-priced call of `op`: the kernel families the fit measured as
    glue (`step.families.PROXIED`: elementwise / routing / copies and the short conv). A proxy-priced op
    of another family (the gated norm, in "norms") keeps its plain proxy: fit and prediction agree."""
    return op_family(op) in PROXIED

