"""Per-virtual-stage costs the engine needs, and the uniform-cost form used to check the formulas."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from k3sim.errors import InputError


@dataclass(frozen=True)
class StageCosts:
    """Seconds per micro-batch for each virtual stage s = chunk * p + device (length p * v).

    backward_input_s + backward_weight_s is the whole backward; schedules without a split backward
    run them as one op. send_forward_s[s]: activation transfer s -> s+1 (last entry unused);
    send_backward_s[s]: gradient transfer s -> s-1 (first entry unused). activation_bytes[s]: bytes a
    micro-batch keeps on its device between its forward and backward on stage s (None: unknown).

    comm_forward_s[s] / comm_backward_s[s]: the part of forward_s[s] / backward_input_s[s] that is the
    expert-parallel all-to-all (dispatch and combine), which an overlapped F&B op hides under the other
    chunk's compute (None: none); comm_sm_share: the share of the GPU's SMs compute keeps while such an
    all-to-all is in flight (DeepEP's normal kernels hold 20 SMs: `k3sim.comm.ep.comm_sms`)."""

    forward_s: tuple[float, ...]
    backward_input_s: tuple[float, ...]
    backward_weight_s: tuple[float, ...]
    send_forward_s: tuple[float, ...]
    send_backward_s: tuple[float, ...]
    activation_bytes: tuple[float, ...] | None = None
    source: str = ""
    rows: list = field(default_factory=list)
    comm_forward_s: tuple[float, ...] | None = None
    comm_backward_s: tuple[float, ...] | None = None
    comm_sm_share: float = 1.0

    def __post_init__(self) -> None:
        n = len(self.forward_s)
        names = ["backward_input_s", "backward_weight_s", "send_forward_s", "send_backward_s"]
        names += [k for k in ("comm_forward_s", "comm_backward_s") if getattr(self, k) is not None]
        for name in names:
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, forward_s {n}")
        for name in ["forward_s"] + names:
            for x in getattr(self, name):
                if not (math.isfinite(x) and x >= 0):
                    raise InputError(f"costs must be finite and >= 0, got {x!r}", field=name)
        for name, whole in (("comm_forward_s", self.forward_s), ("comm_backward_s", self.backward_input_s)):
            part = getattr(self, name)
            if part is not None and any(c > w * (1 + 1e-12) + 1e-15 for c, w in zip(part, whole)):
                raise ValueError(f"{name} exceeds the op it is part of")
        if not 0.0 < self.comm_sm_share <= 1.0:
            raise ValueError(f"comm_sm_share must be in (0, 1], got {self.comm_sm_share}")

    def mirrored(self) -> "StageCosts":
        """These p stages twice over (2p entries): DualPipe's direction-1 stage p + j is model stage j."""
        twice = {k: getattr(self, k) + getattr(self, k) for k in
                 ("forward_s", "backward_input_s", "backward_weight_s", "send_forward_s", "send_backward_s")}
        for k in ("activation_bytes", "comm_forward_s", "comm_backward_s"):
            twice[k] = None if getattr(self, k) is None else getattr(self, k) + getattr(self, k)
        return StageCosts(**twice, source=self.source, rows=self.rows, comm_sm_share=self.comm_sm_share)

    @property
    def num_stages(self) -> int:
        return len(self.forward_s)


def check_seconds(values, source: str) -> None:
    """Each cost inside the bounds table's "seconds" range: 1e308-second costs overflowed the step time to
    inf and the results to null."""
    from k3sim.configs.bounds import check_range

    for x in values:
        check_range(x, "seconds", source)


def uniform_costs(p: int, v: int, forward_s: float, backward_s: float, weight_s: float | None = None,
                  *, send_s: float = 0.0, source: str = "--uniform-costs", visits: int | None = None) -> StageCosts:
    """One micro-batch costs `forward_s` / `backward_s` on one device (all its chunks together), so a
    chunk costs 1/v of it (Megatron's convention behind (p-1)/(v m)). `weight_s` None: the backward
    is split into equal input- and weight-gradient halves (used only by ZB-H1); given: backward_s is
    the input gradient alone and the whole backward is backward_s + weight_s. `visits`: how many of a
    device's v chunks one micro-batch runs (default v; DualPipe 1: a micro-batch meets one of the two)."""
    vals = [forward_s, backward_s] + ([] if weight_s is None else [weight_s]) + [send_s]
    if any(not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0) for x in vals):
        raise InputError(f"costs must be finite and >= 0, got {vals}", source=source)
    check_seconds(vals, source)
    if weight_s is None:
        bi = bw = backward_s / 2
    else:
        bi, bw = backward_s, weight_s
    n, k = p * v, (v if visits is None else visits)
    return StageCosts((forward_s / k,) * n, (bi / k,) * n, (bw / k,) * n, (send_s,) * n, (send_s,) * n,
                      source=f"uniform ({source})")


def parse_uniform_costs(text: str, source: str = "--uniform-costs") -> tuple[float, float, float | None]:
    """'F,B' or 'F,B,W' seconds -> (F, B, W or None); anything else is one InputError line."""
    parts = [x.strip() for x in str(text).split(",")]
    if len(parts) not in (2, 3) or any(not x for x in parts):
        raise InputError(f"expected F,B or F,B,W seconds, got {text!r}", source=source)
    try:
        vals = [float(x) for x in parts]
    except ValueError:
        raise InputError(f"expected F,B or F,B,W seconds, got {text!r}", source=source) from None
    if any(not math.isfinite(x) or x < 0 for x in vals):
        raise InputError(f"costs must be finite and >= 0 seconds, got {text!r}", source=source)
    check_seconds(vals, source)
    if vals[0] == 0 and vals[1] == 0:
        raise InputError(f"forward and backward cannot both be 0, got {text!r}", source=source)
    return vals[0], vals[1], (vals[2] if len(vals) == 3 else None)
