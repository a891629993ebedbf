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
fitted on one configuration's profiled points (`fit`) and kept with their provenance in
`<measured dir>/training_glue.yaml`; a profile without its own file uses H200's (the factors describe the
software's glue relative to a copy, not the GPU). `GlueCalibration.proxy()` (factors 1) is the bytes-only
model: a stack with fused permute kernels (Transformer Engine's moe_permute) would sit near it, unmeasured.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

GLUE_FILE = "training_glue.yaml"
GLUE_MODES = ("calibrated", "proxy")  # the training option `moe_glue`: the profile's calibration, or bytes only


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
    return load_glue(hw) if mode == "calibrated" else GlueCalibration.proxy()


def _h200_file() -> Path:
    from k3sim.kernels.hardware import profiles_dir

    return profiles_dir() / "measured" / "h200" / GLUE_FILE


def load_glue(hw: Any) -> GlueCalibration:
    """The glue calibration for `hw`: its measured directory's file, else H200's, else the proxy."""
    from k3sim.kernels.hardware import measured_dir

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
        doc = yaml.safe_load(Path(path).read_text())
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
    glue (`step.wholestep.PROXIED`: elementwise / routing / copies and the short conv). A proxy-priced op
    of another family (the gated norm, in "norms") keeps its plain proxy: fit and prediction agree."""
    from k3sim.step.wholestep import PROXIED, op_family

    return op_family(op) in PROXIED


def fit(run_dir, config: str, points: list[tuple[int, int]], hw: Any = "h200") -> dict:
    """Factors from the profiled `points` (seq, micro-batch) of `config` in a training run directory.

    Per point: forward factor = (profiled glue families - the registry-measured calls among them) /
    proxy-priced calls' predicted seconds; backward the same with forward+backward minus forward.
    The factors are the ratio of summed seconds over the points (one number each, no per-shape terms)."""
    import pandas as pd

    from k3sim.configs import load_hardware
    from k3sim.step.wholestep import PROXIED, kernel_family
    from k3sim.step.wholestep_train import slice_calls

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    K = pd.read_csv(Path(run_dir) / "kernels.csv")
    K = K[(K.part == "train") & (K.config == config)]
    K = K.assign(family=K.kernel.map(kernel_family))
    num_f = num_b = den_f = den_b = 0.0
    for seq, mb in points:
        g = K[(K.seq == seq) & (K.micro_batch == mb) & K.family.isin(PROXIED)]
        if g.empty:
            from k3sim.errors import InputError

            raise InputError(f"{config} {seq}x{mb} was not profiled there", source=str(run_dir), field="points")
        prof_f = g[g.phase == "fwd"].gpu_s.sum()
        prof_b = g[g.phase == "fwd_bwd"].gpu_s.sum() - prof_f
        rows = [r for r in slice_calls(config, hw, seq, mb, None, None) if is_glue(r["op"])]
        num_f += prof_f - sum(r["fwd_s"] for r in rows if not r["proxy"])
        num_b += prof_b - sum(r["bwd_s"] for r in rows if not r["proxy"])
        den_f += sum(r["fwd_s"] for r in rows if r["proxy"])
        den_b += sum(r["bwd_s"] for r in rows if r["proxy"])
    return dict(fwd=round(num_f / den_f, 4), bwd=round(num_b / den_b, 4), config=config,
                points=[f"{q}x{m}" for q, m in points], run=Path(run_dir).name)
