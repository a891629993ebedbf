"""A parallel group's collectives on the link its placement gives: memoised times through the one CP/placement
communication model (`k3sim.cp.comm.CommModel`).

Shared by the training step model (TP, EP, CP, DP groups; `k3sim.training.placement.groups` places them) and
the pipeline's stage-to-stage sends (`k3sim.pipeline.costs.p2p_seconds`), so a send between two stages costs
the same in both. It lives here, beside `CommModel`, below both of its users: inside the scale-up domain the
calibrated collective predictor answers; across it, alpha from the predictor plus wire bytes over the per-GPU
NIC bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Group:
    """One communicator: its size and how many consecutive GPUs its members span (stride x size)."""

    name: str
    gpus: int
    span_gpus: int


def link_of(group: Group, hw: Any) -> str:
    """The group's link: `scale-up` when its GPUs fit in one scale-up domain, `scale-out` when they span more,
    `none` for a group of one."""
    if group.gpus <= 1:
        return "none"
    return "scale-up" if group.span_gpus <= int(hw.scaleup_domain_gpus) else "scale-out"


class Collectives:
    """Memoised collective times for one hardware profile and kernel-time function."""

    def __init__(self, hw: Any, kernel_time: Callable[..., Any]):
        from k3sim.cp.comm import KernelClock

        self.hw = hw
        self.clock = KernelClock(hw, kernel_time)
        self._memo: dict[tuple, tuple[float, str, str]] = {}

    # Sizes at which the collective model is called: 2^(k/8) bytes. A time in between is interpolated
    # linearly in log(bytes)-log(seconds) from its two neighbours (exact at the grid points; within 1 % of
    # a direct call inside the scale-up domain, tests/training). A
    # modelling choice for speed: a sweep's thousands of layouts ask for thousands of distinct sizes
    # (gradient shards per pipeline rank), and one direct call costs milliseconds.
    GRID_STEPS_PER_OCTAVE = 8
    LINE_POINTS = (2 ** 16, 2 ** 32)   # bytes at which a scale-out collective's line is sampled

    def _direct(self, op: str, nbytes: int, group: Group) -> tuple[float, str, str]:
        key = (op, nbytes, group.gpus, group.span_gpus)
        hit = self._memo.get(key)
        if hit is None:
            from k3sim.cp.comm import CommModel
            from k3sim.cp.traffic import Collective

            cm = CommModel(self.clock, group.gpus, group.span_gpus)
            s, src = cm.time(Collective(op, float(nbytes)))
            hit = self._memo[key] = (s, src, cm.link)
        return hit

    def time(self, op: str, shard_bytes: float, group: Group) -> tuple[float, str, str]:
        """(seconds, source, link) of one `op` of `shard_bytes` per rank (nccl-tests convention)."""
        import math

        if group.gpus <= 1 or shard_bytes <= 0:
            return 0.0, "none", "none"
        if link_of(group, self.hw) == "scale-out":
            # Beyond the scale-up domain the collective model (k3sim.comm) is alpha x steps + wire bytes /
            # bandwidth: a line in bytes, fixed by two calls per (op, group) (each call of a wide group
            # builds its placement topology: seconds for 1,024 GPUs). Checked against direct calls in
            # tests/training.
            b1, b2 = self.LINE_POINTS
            t1, src, link = self._direct(op, b1, group)
            t2, _, _ = self._direct(op, b2, group)
            return t1 + (float(shard_bytes) - b1) * (t2 - t1) / (b2 - b1), src, link
        n = self.GRID_STEPS_PER_OCTAVE
        x = max(1.0, float(shard_bytes))
        k = math.floor(math.log2(x) * n)
        lo, hi = 2.0 ** (k / n), 2.0 ** ((k + 1) / n)
        b_lo, b_hi = max(1, round(lo)), max(1, round(hi))
        t_lo, src, link = self._direct(op, b_lo, group)
        if b_lo == round(x) or b_hi == b_lo:
            return t_lo, src, link
        t_hi, _, _ = self._direct(op, b_hi, group)
        if t_lo <= 0 or t_hi <= 0:
            f = (x - b_lo) / (b_hi - b_lo)
            return t_lo + f * (t_hi - t_lo), src, link
        f = (math.log(x) - math.log(b_lo)) / (math.log(b_hi) - math.log(b_lo))
        return math.exp(math.log(t_lo) + f * (math.log(t_hi) - math.log(t_lo))), src, link

    def p2p(self, nbytes: float, link: str) -> tuple[float, str]:
        """One point-to-point send between pipeline stages on `link`."""
        if link == "none" or nbytes <= 0:
            return 0.0, "none"
        span = 2 if link == "scale-up" else int(self.hw.scaleup_domain_gpus) + 1
        s, src, _ = self.time("send_recv", nbytes, Group("pp-hop", 2, span))
        return s, src

    def kernel(self, op: str, **params: float) -> tuple[float, str]:
        return self.clock(op, **params)
