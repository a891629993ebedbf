"""Footings: one pricing of kernel times shared by every profile of a cross-GPU comparison (`k3sim compare`).

A profile's own answers (`k3sim.predict.predict_kernel_time`) stand on what it has: the H200's measured rows, a
derived profile's rescaled H200 rows, or, for a profile with neither (B200, GB200), the datasheet roofline
(max(FLOP / peak, bytes / bandwidth), no launch or latency term: a lower bound). Set side by side they compare a
kernel's real time on one GPU with an ideal bound on the other. A footing prices every profile the same way:

- `measured`: each profile's own measured rows (the facade as it is); only when every profile has rows of its
  own (`native_footing(hw) == "measured"`), refused otherwise.
- `derived`: every profile from one measured source profile's answers (the H200's), rescaled per kernel call to
  the profile's datasheet figures by the roofline regime of the call (`derived_factor`), collectives by the link
  ratio with their latency kept. The rule is `k3sim.kernels.store.Derivation`'s with a compute ratio added (the
  derived profiles' rule keeps compute-bound times because their pairs share one die: r_c = 1 there, and this
  rule gives their answers, tested):

      t_c = FLOP / peak_src(dtype),  t_m = bytes / HBM_src        (the op's own formulas, `kernels.ops`)
      r_c = peak_src(dtype) / peak_tgt(dtype),  r_m = HBM_src / HBM_tgt
      s   = max(r_c t_c, r_m t_m) / max(t_c, t_m)    compute-bound: r_c; memory-bound: r_m; between: the max
      u   = max(t_c, t_m) / t                       the fraction of the source's roofline the call reached
      w   = min(1, u / BOUND_FRACTION)              the share of its time its roof sets (the rest is latency)
      t'  = t + (s - 1) w t_graph                    t_graph: the call's CUDA-graph time on the source

  Collectives, the EP all-to-all and everything the facade routes: the facade on a copy of the profile that has
  the source's compute (peaks, SMs) and `derived_from` the source (`derived_copy`), i.e. the Derivation's
  collective rule (bandwidth part x source / target link bandwidth, latency kept) over the profile's own
  topology and scale-up domain. Published kernels (FlashMLA): min(the derived base op, the published roofline on
  the profile's own peaks), as the facade does.
- `datasheet`: every profile, H200 included, by the datasheet roofline at 100 % of its peak FLOP/s, HBM and link
  bandwidth with no launch or latency term (the facade on a copy without measured data, `datasheet_copy`); the EP
  all-to-all is the one DeepEP-calibrated model on each profile's links, as on every footing.

`Footing` is a `kernel_time` callable (op, params, hardware, convention) for the step, decode, prefill and
training models. It takes the facade as an argument (`facade`): the facade sits above this layer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

FOOTINGS = ("measured", "derived", "datasheet")  # most measured first: the default is the first every profile has
DEFAULT_SOURCE = "h200"  # the one profile with measured kernel rows (hardware_profiles/measured/h200)

# What the derived footing leaves out, beyond what `Derivation` already lists for the GH100 pairs (the target
# profile's `derived_from.ignores`): said with every derived comparison.
DERIVED_IGNORES = (
    "compute-bound kernels reach the same fraction of the profile's dense peak as the source's kernels reached of "
    "the source's (a kernel tuned for another architecture, e.g. Blackwell's tensor-memory MMA, may reach more or "
    "less)",
    "each op computes in its registry dtype (the MXFP4 expert kernel dequantises to BF16 on the H200): a native "
    "FP4 tensor-core kernel is not modelled, the op's BF16 peak ratio applies",
    "latency-bound kernels (below half their roofline) keep the source's launch, ramp and tail times: clocks, SM "
    "count and L2 size are taken as the source's",
    "HBM and NVLink latency are the source's; host launch times (eager) are the source machine's CPU",
    "scale-out: the NIC link takes the source's NVLink-measured fraction and latency, as every model in k3sim",
)


def native_footing(hw: Any) -> str:
    """The footing a profile's own answers stand on: measured (its own rows), derived (`derived_from`) or
    datasheet (neither)."""
    from k3sim.configs.profiles import measured_dir

    if getattr(hw, "derived_from", None) is not None:
        return "derived"
    return "measured" if measured_dir(hw) is not None else "datasheet"


def datasheet_copy(hw: Any) -> Any:
    """The profile with no measured data: every answer of the facade on it is the datasheet roofline. A profile
    that has none already is returned as it is (its answers are unchanged)."""
    if native_footing(hw) == "datasheet":
        return hw
    # renamed: an uncalibrated profile still reads hardware_profiles/measured/<name> when that exists
    return hw.model_copy(update={"name": f"{hw.name} (datasheet)", "calibration_dir": None, "derived_from": None})


def derived_copy(hw: Any, source: Any, source_ref: str) -> Any:
    """The profile with the source's compute (dense peaks, SMs) and `derived_from` the source: the facade on it
    answers collectives and the EP all-to-all by `Derivation`'s rule over this profile's links and topology."""
    from k3sim.configs.hardware import DerivedFrom

    ignores = tuple(getattr(getattr(hw, "derived_from", None), "ignores", ()) or ()) or DERIVED_IGNORES
    return hw.model_copy(update={"peak_flops_per_s": dict(source.peak_flops_per_s), "num_sms": source.num_sms,
                                 "calibration_dir": None,
                                 "derived_from": DerivedFrom(profile=source_ref, ignores=ignores)})


@dataclass(frozen=True)
class Rescale:
    """One call's derived factor: t' / t_graph - 1 = (s - 1) w; `regime` says which roof set it."""

    s: float
    w: float
    regime: str


def derived_factor(spec: Any, p: Mapping[str, int], t_graph: float, source: Any, target: Any) -> Rescale:
    """The module docstring's rule for one single-GPU call of `spec` at shape `p` that took `t_graph` seconds on
    `source`. A dtype without a peak on the source is priced by its bytes only there (as `Derivation` does); one
    the target lacks is refused (`configs.profiles.peak_flops`: the datasheet footing refuses it too)."""
    from k3sim.configs.profiles import peak_flops
    from k3sim.errors import InputError
    from k3sim.kernels.store import BOUND_FRACTION

    flop, nbytes = float(spec.flop(p)), float(spec.bytes(p))
    try:
        peak_src = peak_flops(source, spec.dtype)
    except InputError:
        peak_src = float("inf")
    tc, tm = flop / peak_src, nbytes / float(source.hbm_bandwidth_bytes_per_s)
    rc = peak_src / peak_flops(target, spec.dtype) if tc > 0.0 else 1.0
    rm = float(source.hbm_bandwidth_bytes_per_s) / float(target.hbm_bandwidth_bytes_per_s)
    roof = max(tc, tm)
    if roof <= 0.0 or t_graph <= 0.0:
        return Rescale(1.0, 0.0, "no work: kept")
    s = max(rc * tc, rm * tm) / roof
    w = min(1.0, roof / t_graph / BOUND_FRACTION)
    if rc * tc >= rm * tm:
        regime = f"compute-bound x{rc:.4g}" if tc >= tm else f"near the ridge, compute x{rc:.4g}"
    else:
        regime = f"memory-bound x{rm:.4g}" if tm >= tc else f"near the ridge, HBM x{rm:.4g}"
    if w < 1.0:
        regime += f" on {w:.3g} of the time (latency share kept)"
    return Rescale(s, w, regime)


@dataclass
class Footing:
    """A `kernel_time(op, params, hardware, convention)` callable pricing every profile on footing `name`.

    `facade`: `k3sim.predict.predict_kernel_time` (passed in: it sits above this layer). `source` (derived only):
    the measured profile every answer is rescaled from, a name or path."""

    name: str
    facade: Callable[..., Any]
    source_ref: str = DEFAULT_SOURCE
    _source: Any = None
    _copies: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from k3sim.configs.profiles import load_profile
        from k3sim.errors import InputError

        if self.name not in FOOTINGS:
            raise InputError(f"must be one of {', '.join(FOOTINGS)}, got {self.name!r}", field="footing")
        if self.name == "derived":
            self._source = load_profile(self.source_ref)
            if native_footing(self._source) != "measured":
                raise InputError(f"profile '{self._source.name}' has no measured rows of its own "
                                 f"({native_footing(self._source)}): the derived footing rescales a measured "
                                 "profile's answers; name one", field="derived_from")

    @property
    def source(self) -> Any:
        return self._source

    def _copy(self, hw: Any) -> Any:
        key = (id(hw), self.name)
        hit = self._copies.get(key)
        if hit is None or hit[0] is not hw:
            made = datasheet_copy(hw) if self.name == "datasheet" else derived_copy(hw, self._source, self.source_ref)
            hit = self._copies[key] = (hw, made)
        return hit[1]

    def is_source(self, hw: Any) -> bool:
        from k3sim.configs.profiles import measured_dir

        src = self._source
        return native_footing(hw) == "measured" and hw.name == src.name and measured_dir(hw) == measured_dir(src)

    def __call__(self, op: str, params: Mapping[str, object], hardware: Any = "h200", convention: str = "graph"):
        from k3sim.configs.profiles import load_profile

        hw = load_profile(hardware)
        if self.name == "measured" or (self.name == "derived" and self.is_source(hw)):
            return self.facade(op, params, hw, convention)
        if self.name == "datasheet":
            return self.facade(op, params, self._copy(hw), convention)
        from k3sim.kernels.ops import get_op

        spec = get_op(op)
        if spec.kind == "compute":
            return self._derived_kernel(spec, params, hw, convention)
        if spec.kind == "published":
            return self._derived_published(op, spec, params, hw, convention)
        return self.facade(op, params, self._copy(hw), convention)  # collectives, the EP all-to-all

    def _derived_kernel(self, spec: Any, params: Mapping[str, object], hw: Any, convention: str):
        """The source's answer at this shape, rescaled by `derived_factor` (the increment on its graph time)."""
        from k3sim.kernels.ops import validate_params

        p = validate_params(spec, params)
        g = self.facade(spec.name, p, self._source, "graph")
        base = g if convention == "graph" else self.facade(spec.name, p, self._source, convention)
        r = derived_factor(spec, p, g.seconds, self._source, hw)
        t = base.seconds + (r.s - 1.0) * r.w * g.seconds
        return dataclasses.replace(base, seconds=t, source=f"derived from {self._source.name} ({r.regime}; "
                                   f"x{t / base.seconds if base.seconds else 1.0:.4g}): {base.source}",
                                   detail=f"{base.detail}; derived footing for {hw.name} "
                                          "(k3sim.kernels.footing.derived_factor)")

    def _derived_published(self, op: str, spec: Any, params: Mapping[str, object], hw: Any, convention: str):
        """min(the derived base op, the published roofline on the profile's own peaks), as the facade prices a
        published kernel over the measured base op."""
        from k3sim.kernels.ops import get_op, validate_params
        from k3sim.kernels.published import PUBLISHED, published_seconds

        pub = PUBLISHED[op]
        p = validate_params(spec, params)
        base = self._derived_kernel(get_op(pub.base_op), p, hw, convention)
        roof = published_seconds(pub, spec.flop(p), spec.bytes(p), hw)
        if base.seconds <= roof:
            return base
        return dataclasses.replace(base, seconds=roof, source=f"published: {pub.source}", method="published roofline",
                                   detail=f"published throughput fractions on {hw.name}'s peaks; the derived "
                                          f"{pub.base_op} takes {base.seconds:.3g} s")


def footing_line(name: str, chosen: str, profiles: list[Any], source: Any = None) -> str:
    """The one line a comparison prints about its footing: which, why, and what it stands on."""
    why = "given (--footing)" if chosen == "given" else "the most measured footing every profile has (default)"
    native = ", ".join(f"{hw.name} {native_footing(hw)}" for hw in profiles)
    what = {"measured": "every profile's own measured kernel rows",
            "derived": (f"{getattr(source, 'name', DEFAULT_SOURCE)}'s measured kernels rescaled to each profile's "
                        "datasheet compute and HBM by each call's roofline regime, collectives by link bandwidth "
                        "with latency kept"),
            "datasheet": ("every profile's datasheet roofline at 100 % of peak FLOP/s, HBM and link bandwidth, no "
                          "launch or latency term (a lower bound)")}[name]
    return f"footing {name}: {what}; {why}; profiles' own: {native}"

