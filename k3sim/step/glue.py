"""Training glue: what the kernels the op registry has not measured really cost, from whole-step profiles.

The step model prices unregistered kernels (MoE permute / combine, short conv, gated norm, KV writes,
the small ops' backward) by the HBM-copy proxy over the bytes they must move. A training framework's
routing glue does far more than that: the whole-step profiles of 2026-12-01 (torch.profiler, runs
`20261201-wholestep-train-b`..`-e`) show token gathers, masked selects, the routing-weight multiply, fp32
index_add with its casts and fills, and autograd's backward of each - the pattern of Megatron-core's
unfused `permute` / `unpermute` (index_select, scatter_add) - at ten to twelve and a half times the proxy's
time in the forward and six to seven in the backward. Within a configuration the factor is stable to a few
per cent across shapes; between configurations it is not (K3 slices 11.4-12.5 forward, Kimi-Linear
9.9-10.2, at 4096 x 1), which is why it is pooled over six configurations and its spread and
leave-one-configuration-out errors are reported (`k3sim check fit-glue`, validation/glue_fit.py;
reports/training/README.md).

Three ways to price the glue (the training option `moe_glue`, `glue_for`):
- "calibrated": `GlueCalibration` carries two factors on the proxy-priced calls of the glue families
  (`is_glue`: forward; backward), read from `<measured dir>/training_glue.yaml` with its provenance (fitting is
  validation work; this module only reads the result). A profile without its own file uses H200's and says
  "carried from h200" in its source (the factors describe the software's glue relative to a copy, not the
  GPU; nothing was measured on that profile).
- "fused": the MoE permute and combine calls (`FUSED_GLUE_OPS`) priced from measured fused kernels of our
  own instead (`GlueCalibration.fused_costs`); every other unmeasured glue call (short conv, KV write, gate
  multiply, AttnRes read: the calibrated factors; the gated norm: its plain proxy) stays as in "calibrated",
  because no fused stack of ours has measured them.
- "proxy" (`GlueCalibration.proxy()`, factors 1): bytes only, not measured.
"auto" picks "fused" for a model whose published training stack uses fused permute kernels
(`ModelConfig.training_stack_fused_permute`: K3's MoonEP, DeepSeek-V3's DeepEP), "calibrated" otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from k3sim.configs.recipe import GLUE_MODES  # the training option `moe_glue` (one list, in its schema)
from k3sim.step.families import PROXIED, op_family

GLUE_FILE = "training_glue.yaml"
CARRIED_FROM = "h200"  # the profile whose calibration file another profile uses

# The MoE calls the fused path prices (step.layers.expert_calls: `routed_experts_permute` op "moe_permute",
# `routed_experts_combine` op "moe_combine"; params T tokens, topk local picks per token, D row width).
FUSED_GLUE_OPS: tuple[str, ...] = ("moe_permute", "moe_combine")
# Our fused Triton kernels (forward; backward alone: k3sim/calibration/permute_fused.py), registered and
# measured on the H200 by the GPU harness (k3sim/calibration/train_fp8.py, CONTRACTS22): the fused path uses
# them where both of a pair have measurements on the profile (or on the profile it is derived from).
FUSED_KERNELS = {"moe_permute": ("moe_permute_fused", "moe_permute_fused_bwd"),
                 "moe_combine": ("moe_unpermute_fused", "moe_unpermute_fused_bwd")}
# Until then: the dispatch kernels measured in runs 20261202-1gpu-deployed(-b) (k3sim/kernels/ops_decode.py,
# k3sim/calibration/dispatch_ops.py). `ep_unpermute` is our own fused Triton kernel (each token gathers its
# picks through the permute's inverse, weighted sum in fp32); `ep_permute` is torch's stable sort plus one
# gather. A backward is the transposed kernel: the permute's backward sums each token's topk row gradients
# (an unpermute with unit weights), the combine's backward gathers the output gradient back to the picks (a
# permute). Modelling choices with a known bias: the permute priced as the combine's backward keeps the
# sort the backward reuses (over), and the routing weights' gradient (one dot product per pick, reading
# the rows once more) is not priced (under).
FALLBACK_KERNELS = {"moe_permute": ("ep_permute", "ep_unpermute"),
                    "moe_combine": ("ep_unpermute", "ep_permute")}
FALLBACK_RUN = "20261202-1gpu-deployed-b"
PROBE = {"T": 4096, "topk": 8, "D": 7168}  # a shape to ask the predictor whether an op has measurements
UNMEASURED = "datasheet-roofline"  # the predictor's source for an op the profile has no measurements of


def fused_kernels(op: str, timer: Any) -> tuple[str, str, bool]:
    """(forward op, backward op, whether they are our fused kernels) pricing glue call `op` in the fused path
    on `timer`'s profile: the fused pair where both are registered and measured there, else the measured
    dispatch kernels (`FALLBACK_KERNELS`)."""
    from k3sim.kernels.ops import OPS

    pair = FUSED_KERNELS[op]
    if all(o in OPS and UNMEASURED not in timer.time(o, PROBE)[1] for o in pair):
        return pair[0], pair[1], True
    fb = FALLBACK_KERNELS[op]
    return fb[0], fb[1], False


def _profile_key(hw: Any) -> tuple:
    """What the glue of a profile depends on besides file contents: its name, measured directory, derivation
    and the profiles root (a sweep asks once per layout: the answers are memoised on this key)."""
    from k3sim.configs.profiles import profiles_dir
    from k3sim.kernels.ops import OPS

    return (str(getattr(hw, "name", hw)), str(getattr(hw, "calibration_dir", None)),
            repr(getattr(hw, "derived_from", None)), str(profiles_dir()), len(OPS))


_MEMO: dict[tuple, Any] = {}  # (kind, profile key, ...) -> answer; cleared when it grows past MEMO_MAX
MEMO_MAX = 256


def _memo(key: tuple, make):
    if key not in _MEMO:
        if len(_MEMO) >= MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = make()
    return _MEMO[key]


def fused_source(hw: Any) -> str:
    """What the fused path prices the MoE permute / combine with on `hw`, for sources and assumption rows."""
    return _memo(("fused", _profile_key(hw)), lambda: _fused_source(hw))


def _fused_source(hw: Any) -> str:
    from k3sim.step.calls import Timer

    timer = Timer(hw)
    picks = {op: fused_kernels(op, timer) for op in FUSED_GLUE_OPS}
    how = "; ".join(f"{op}: {f} + backward {b}" + ("" if own else " (the transposed kernel)")
                    for op, (f, b, own) in picks.items())
    if all(own for _, _, own in picks.values()):
        return (f"fused permute / unpermute, our Triton kernels measured on the H200 ({how}; "
                "k3sim/calibration/permute_fused.py)")
    return (f"our fused permute kernels not measured: the measured dispatch kernels of run {FALLBACK_RUN} "
            f"({how}; ep_unpermute our fused Triton kernel, ep_permute torch sort + gather)")


@dataclass(frozen=True)
class GlueCalibration:
    """Factors on the proxy time of the glue calls, with where they were fitted: `points` ("CONFIG:SEQxMB")
    of `runs`, `per_config` (config, fwd, bwd) each configuration's own factors at its points (their min and
    max are the spread, `spread()`); empty for the bytes-only proxy. `fused`: the MoE permute / combine priced
    by `fused_costs` instead. `carried_from`: the profile whose file this is, when not the profile's own."""

    fwd: float = 1.0
    bwd: float = 1.0
    source: str = "proxy: HBM-copy time of the bytes moved (no glue calibration)"
    runs: tuple[str, ...] = ()
    points: tuple[str, ...] = ()
    per_config: tuple[tuple[str, float, float], ...] = ()
    fused: bool = False
    carried_from: str = ""
    fused_note: str = ""  # `fused_source` of the profile (set by `glue_for`)

    @classmethod
    def proxy(cls) -> "GlueCalibration":
        return cls()

    def fit_shapes(self) -> set[tuple[str, int, int]]:
        """(config, seq, micro-batch) of the points the factors were fitted on."""
        out = set()
        for p in self.points:
            cfg, _, sm = p.rpartition(":")
            q, _, m = sm.partition("x")
            out.add((cfg, int(q), int(m)))
        return out

    def spread(self) -> dict[str, tuple[float, float]]:
        """{"fwd": (min, max), "bwd": (min, max)} of the per-configuration factors (empty without them)."""
        if not self.per_config:
            return {}
        return {k: (min(r[i] for r in self.per_config), max(r[i] for r in self.per_config))
                for i, k in ((1, "fwd"), (2, "bwd"))}

    def fused_costs(self, timer: Any, call: Any) -> tuple[float, float, float]:
        """(forward, backward input, backward weight) seconds of a MoE permute / combine call (`FUSED_GLUE_OPS`)
        from measured kernels at the call's (T, topk, D): see `fused_kernels`. No weight gradient (no weights)."""
        f_op, b_op, _ = fused_kernels(call.op, timer)
        p = {k: call.params[k] for k in ("T", "topk", "D")}
        return timer.time(f_op, p)[0] * call.count, timer.time(b_op, p)[0] * call.count, 0.0

    @property
    def note(self) -> str:
        """One line for the source of every row whose seconds include the glue (`k3sim.training`)."""
        carried = f", carried from {self.carried_from} (not measured on this profile)" if self.carried_from else ""
        if self.fused:
            return f"MoE glue: {self.fused_note}; other glue x {self.fwd:.1f} / x {self.bwd:.1f}{carried}"
        if not self.points:
            return "MoE glue: HBM-copy proxy of the bytes (not measured)"
        return f"MoE glue: unfused calibration x {self.fwd:.1f} forward / x {self.bwd:.1f} backward{carried}"


def resolve_mode(mode: str, model: Any = None) -> str:
    """The `moe_glue` mode that prices `model`: "auto" is "fused" where the model's published training stack
    runs fused permute kernels (`training_stack_fused_permute`), "calibrated" otherwise; others as given."""
    from k3sim.errors import InputError

    if mode not in GLUE_MODES:
        raise InputError(f"must be {' or '.join(GLUE_MODES)}, got {mode!r}", field="moe_glue")
    if mode != "auto":
        return mode
    if model is None:
        raise ValueError("moe_glue 'auto' depends on the model: pass it")
    return "fused" if getattr(model, "training_stack_fused_permute", False) else "calibrated"


def glue_for(hw: Any, mode: str, model: Any = None) -> GlueCalibration:
    """The calibration a training option `moe_glue` asks for on `hw` (see the module docstring); `model` is
    needed for "auto"."""
    mode = resolve_mode(mode, model)
    if mode == "proxy":
        return GlueCalibration.proxy()
    cal = load_glue(hw)
    if mode == "fused":
        def make():
            how = fused_source(hw)
            return cal, replace(cal, fused=True, fused_note=how, source=f"{how}; other unmeasured glue: {cal.source}")
        kept, fused = _memo(("fused-cal", _profile_key(hw), id(cal)), make)
        return fused if kept is cal else make()[1]
    return cal


def _h200_file() -> Path:
    from k3sim.configs.profiles import profiles_dir

    return profiles_dir() / "measured" / CARRIED_FROM / GLUE_FILE


def load_glue(hw: Any) -> GlueCalibration:
    """The glue calibration for `hw`: its measured directory's file, else H200's (labelled carried), else the
    proxy. Memoised per profile and file version."""
    key = _profile_key(hw)
    path, own = _memo(("path", key), lambda: _glue_path(hw))
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return GlueCalibration.proxy()
    return _memo(("glue", key, str(path), mtime), lambda: _load(hw, path, own, mtime))


def _glue_path(hw: Any) -> tuple[Path, Path | None]:
    """(the calibration file `hw` uses, its own file or None)."""
    from k3sim.configs.profiles import measured_dir

    try:
        d = measured_dir(hw)
    except Exception:  # noqa: BLE001 - a broken calibration_dir is the predictor's error to report
        d = None
    own = d / GLUE_FILE if d is not None else None
    return (own if own is not None and own.is_file() else _h200_file()), own


def _load(hw: Any, path: Path, own: Path | None, mtime: int) -> GlueCalibration:
    fwd, bwd, runs, points, per_config = _read(str(path), mtime)
    carried = "" if path == own else CARRIED_FROM
    configs = sorted({p.rpartition(":")[0] for p in points})
    src = (f"glue calibration pooled over {len(configs)} configuration(s) at {len(points)} point(s) of "
           f"{', '.join(runs)} ({GLUE_FILE})")
    if len(per_config) > 1:
        lo_f, hi_f = min(r[1] for r in per_config), max(r[1] for r in per_config)
        lo_b, hi_b = min(r[2] for r in per_config), max(r[2] for r in per_config)
        src += f"; per configuration x {lo_f:.1f}-{hi_f:.1f} forward, x {lo_b:.1f}-{hi_b:.1f} backward"
    if carried:
        src += f"; carried from {carried} to profile '{getattr(hw, 'name', hw)}' (not measured there)"
    return GlueCalibration(fwd, bwd, src, runs, points, per_config, False, carried)


def _positive(v: Any, path: str, field: str) -> float:
    import math

    from k3sim.errors import InputError

    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InputError(f"must be a positive number (a factor on the proxy time), got {v!r}", source=path,
                         field=field)
    return float(v)


@lru_cache(maxsize=16)
def _read(path: str, mtime_ns: int) -> tuple[float, float, tuple[str, ...], tuple[str, ...], tuple]:
    """The calibration file, parsed and checked once per version (a sweep calls the layer costs thousands
    of times): (fwd, bwd, runs, points, per_config). A broken file is bad input: InputError naming the file
    and the field."""
    import re

    import yaml

    from k3sim.errors import InputError

    try:
        from k3sim.kernels.store import read_measured  # one reader: a regular file, size-capped

        doc = yaml.safe_load(read_measured(Path(path), "training glue calibration").decode("utf-8", errors="replace"))
    except yaml.YAMLError as err:
        raise InputError(f"not valid YAML ({str(err).splitlines()[0]})", source=path) from None
    if not isinstance(doc, dict):
        raise InputError("expected a mapping with fwd, bwd, points, runs, per_config", source=path)
    fwd, bwd = (_positive(doc.get(k), path, k) for k in ("fwd", "bwd"))
    for key in ("points", "runs", "per_config"):
        if key not in doc:
            raise InputError("missing (the provenance of the factors)", source=path, field=key)
    pts = doc["points"]
    if not isinstance(pts, list) or not pts or not all(
            isinstance(p, str) and re.fullmatch(r"[A-Za-z0-9._-]+:[1-9]\d*x[1-9]\d*", p) for p in pts):
        raise InputError(f"expected a list of CONFIG:SEQxMB points like k3-tp8-ep8-l5-8:4096x1, got {pts!r}",
                         source=path, field="points")
    runs = doc["runs"]
    if not isinstance(runs, dict) or any(not isinstance(runs.get(p), str) for p in pts):
        raise InputError("expected a mapping from every point to the run it was profiled in", source=path,
                         field="runs")
    per = doc["per_config"]
    configs = sorted({p.rpartition(":")[0] for p in pts})
    if not isinstance(per, dict) or any(not isinstance(per.get(c), dict) for c in configs):
        raise InputError(f"expected fwd and bwd for every configuration of the points ({', '.join(configs)})",
                         source=path, field="per_config")
    per_config = tuple((c, _positive(per[c].get("fwd"), path, f"per_config.{c}.fwd"),
                        _positive(per[c].get("bwd"), path, f"per_config.{c}.bwd")) for c in configs)
    return fwd, bwd, tuple(sorted(set(runs[p] for p in pts))), tuple(pts), per_config


# Proxy-priced ops no fitted configuration ran: the whole-step runs build no Block AttnRes (no run's
# manifest lists it), so factors fitted on routing gathers and the short conv are not carried to its reads;
# they keep the plain HBM time of their bytes (a lower bound, labelled in the rows' source).
UNFITTED_PROXIES = ("attn_res_read",)


def is_glue(op: str) -> bool:
    """Whether the factors apply to a proxy-priced call of `op`: the kernel families the fit measured as
    glue (`step.families.PROXIED`: elementwise / routing / copies and the short conv), less the ops no fitted
    configuration ran (`UNFITTED_PROXIES`). A proxy-priced op of another family (the gated norm, in "norms")
    keeps its plain proxy: fit and prediction agree."""
    return op_family(op) in PROXIED and op not in UNFITTED_PROXIES
