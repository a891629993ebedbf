"""Kernel calls: what one layer of a step launches, and how each call is timed.

A `Call` names a kernel in the predictor's op vocabulary with its per-rank shape. `Timer` turns calls
into `StepComponent` rows (bytes, FLOP, seconds, source) through the one kernel predictor, under the
step's timing convention. Small ops (norms, activations, router top-k, conv) that the profile has not
measured fall back to an HBM-streaming proxy over the bytes they must move, and say so in `source`.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

BF16 = 2


@dataclass(frozen=True)
class Call:
    """One kernel launch (or `count` identical ones) of a layer.

    hidden: runs off the critical path (a side stream or overlapped with other work), so it adds its
    bytes but not its time to the step. proxy_bytes: bytes it must move, for the HBM proxy when `op` is
    not measured on the profile.
    """

    component: str
    op: str
    params: Mapping[str, int]
    count: float = 1.0
    hidden: bool = False
    proxy_bytes: float = 0.0
    overlap_with: str | None = None  # a component whose time hides this one's (exposed = max(0, t - t_other))


@dataclass
class StepComponent:
    """One row of a step breakdown: seconds on the critical path, bytes moved in HBM (or on the wire for
    a collective), FLOP, where the time came from, and the pipeline stage."""

    component: str
    op: str
    bytes: float
    flop: float
    seconds: float
    source: str
    stage: int = 0
    count: float = 1.0
    hidden: bool = False
    detail: str = field(default="", repr=False)


def _ceil(x: float) -> int:
    return max(1, int(math.ceil(x)))


class Timer:
    """Times calls with `kernel_time(op, params, hardware=hw[, convention=...])`, memoised per shape."""

    def __init__(self, hw: Any, kernel_time: Callable | None = None, convention: str = "graph"):
        from k3sim.predict import predict_kernel_time

        self.hw = hw
        self.kernel_time = kernel_time or predict_kernel_time
        self.convention = convention
        try:
            self._takes_convention = "convention" in inspect.signature(self.kernel_time).parameters
        except (TypeError, ValueError):
            self._takes_convention = False
        self._memo: dict[tuple, tuple[float, str, str]] = {}

    def known(self, op: str) -> bool:
        from k3sim.kernels.ops import OPS

        return op in OPS

    def time(self, op: str, params: Mapping[str, int]) -> tuple[float, str, str]:
        """(seconds, source, detail) of one call."""
        key = (op, *sorted(params.items()))
        hit = self._memo.get(key)
        if hit is None:
            kw = {"hardware": self.hw}
            if self._takes_convention:
                kw["convention"] = self.convention
            kt = self.kernel_time(op, dict(params), **kw)
            hit = self._memo[key] = (float(kt.seconds), str(kt.source), str(getattr(kt, "detail", "")))
        return hit

    def row(self, call: Call, stage: int) -> StepComponent:
        from k3sim.kernels.ops import OPS

        if call.op in OPS:
            spec = OPS[call.op]
            p = dict(call.params)
            s, src, det = self.time(call.op, p)
            nbytes, flop = spec.bytes(p), spec.flop(p)
            op = call.op
        else:  # not measured anywhere: stream its bytes through HBM (a read-modify-write copy)
            nbytes, flop = call.proxy_bytes, 0.0
            s, src, det = self.time("hbm_copy", {"bytes": _ceil(nbytes / 2)})
            src, det, op = f"proxy:hbm_copy({src})", f"{call.op} not in the op registry; {det}", call.op
        return StepComponent(call.component, op, nbytes * call.count, flop * call.count, s * call.count,
                             src, stage, call.count, call.hidden, det)
