"""The one kernel-time facade: `predict_kernel_time(op, params, hardware, convention)` for every op of the
registry, single-GPU kernels and collectives alike (DEVELOPING.md, "Kernel times", "Collectives").

It sits above `k3sim.kernels` (measured store, fits, the single-GPU predictor) and `k3sim.comm` (the one
collective model over a topology), which sit side by side and never dispatch to each other: an op whose
registry kind is "collective" goes to `k3sim.comm.collective_time`, everything else to the kernel predictor.
Every model that needs a kernel time takes a `kernel_time` callable defaulting to this function.

Heavy modules (numpy, the store) are imported on the first call, so importing this module costs nothing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from k3sim.kernels.predict import KernelTime

# Collective answers per profile predictor (simulators ask the same shapes over and over). Keyed weakly by the
# predictor, so `k3sim.kernels.predict.clear_cache()` (a new predictor) drops them with it.
_COLLECTIVE_ANSWERS: WeakKeyDictionary = WeakKeyDictionary()
# Answers kept per profile before the memo is emptied: a memory bound only (~100 MB), answers do not depend on it.
MAX_ANSWERS = 200_000


def predict_kernel_time(op: str, params: Mapping[str, object], hardware: Any = "h200",
                        convention: str = "graph") -> KernelTime:
    """Kernel time in seconds with its source; `hardware` is a profile name, a path or a HardwareProfile.

    `convention`: "graph" (default; the kernel as a CUDA-graph replay runs it, back to back with no host
    launch) or "eager" (one call between CUDA events plus the host's launch time); the answer's detail
    says which timer's measurements it stands on. A collective (`bytes` per rank as nccl-tests counts it,
    `gpus`, optional `gpus_per_node`, 0 = the profile's scale-up domain) is answered by the collective model.
    Raises InputError for an unknown op or parameter, a missing one, or a shape outside the op's range.
    """
    from k3sim.errors import InputError
    from k3sim.kernels.ops import get_op, validate_params
    from k3sim.kernels.predict import profile_predictor
    from k3sim.kernels.store import CONVENTIONS

    predictor = profile_predictor(hardware)
    if convention not in CONVENTIONS:
        raise InputError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}",
                         field="convention")
    spec = get_op(op)
    if spec.kind == "ep":  # EP dispatch / combine: the DeepEP-class all-to-all model (k3sim.comm.ep)
        return _ep(op, validate_params(spec, params), predictor, convention)
    if spec.kind == "published":  # a deployed stack's kernel from its published figures (k3sim.kernels.published)
        return _published(op, spec, validate_params(spec, params), predictor, convention)
    if spec.kind != "collective":
        return predictor.predict(op, params, convention)
    p = validate_params(spec, params)
    derived = getattr(predictor, "derivation", None)  # a derived profile: its answers say so (kernels.store)

    def answer() -> KernelTime:
        hit = _collective(op, p, predictor.hw, convention)
        return hit if derived is None else derived.collective_label(p, hit)

    return _memo(predictor, (op, convention, *p.values()), answer)


def _memo(predictor: Any, key: tuple, answer) -> KernelTime:
    """The answer for `key` from the predictor's memo of communication answers, computed once."""
    answers = _COLLECTIVE_ANSWERS.setdefault(predictor, {})
    hit = answers.get(key)
    if hit is None:
        if len(answers) > MAX_ANSWERS:
            answers.clear()
        hit = answers[key] = answer()
    return hit


# A kernel convention's collective series (`k3sim.comm.model.SERIES`): a CUDA-graph step replays its collectives
# (graph-timed rows first); an eager call is launched on its own, as the barrier-started runs timed them.
COLLECTIVE_CONVENTION = {"graph": "graph", "eager": "barrier"}


def _collective(op: str, p: dict[str, int], hw: Any, convention: str) -> KernelTime:
    """The collective model's answer for the caller's kernel convention (`COLLECTIVE_CONVENTION`), carrying the
    convention of the rows it came from (`KernelTime.convention`: graph, stream or barrier; the detail says why)."""
    from k3sim.comm import collective_time

    return collective_time(op, p["bytes"], p["gpus"], hw, gpus_per_node=p.get("gpus_per_node") or None,
                           convention=COLLECTIVE_CONVENTION[convention])


def _ep(op: str, p: dict[str, int], predictor: Any, convention: str) -> KernelTime:
    """`k3sim.comm.ep.ep_time`'s answer, memoised with the collectives' (per predictor), labelled with the
    caller's convention (the low-latency kernels are CUDA-graph captured; the normal ones' time is their GPU
    time, their detail says they cannot be captured)."""
    from k3sim.comm.ep import ep_time
    from k3sim.kernels.ops import EP_OPS

    return _memo(predictor, (op, convention, *p.values()),
                 lambda: dataclasses.replace(ep_time(EP_OPS[op], p, predictor.hw), convention=convention))


def _published(op: str, spec: Any, p: dict[str, int], predictor: Any, convention: str) -> KernelTime:
    """min(the measured base op, the published roofline on this profile): `k3sim.kernels.published`."""
    from k3sim.kernels.published import PUBLISHED, published_seconds

    pub = PUBLISHED[op]
    base = predictor.predict(pub.base_op, p, convention)
    roof = published_seconds(pub, spec.flop(p), spec.bytes(p), predictor.hw)
    if base.seconds <= roof:
        return dataclasses.replace(base, detail=f"{base.detail}; {op}: the measured {pub.base_op} is at or under "
                                                f"the published roofline ({pub.source}: {roof:.3g} s)")
    return dataclasses.replace(base, seconds=roof, source=f"published: {pub.source}", method="published roofline",
                               detail=f"published throughput fractions (compute {pub.compute_fraction:.3f}, memory "
                                      f"{pub.memory_fraction:.3f} of the datasheet) on {predictor.hw.name}'s peaks; "
                                      f"the measured {pub.base_op} takes {base.seconds:.3g} s")
