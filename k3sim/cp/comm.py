"""Times of the communication calls a CP strategy makes, and which link they use.

Inside the scale-up domain (the CP group's GPUs, P x TP with CP ranks strided by TP, all within
`scaleup_domain_gpus`) the calibrated collective predictor answers directly. Across it, or when a
bandwidth override is given (e.g. the H800's 200 GB/s NVLink on H200-measured kernels), an alpha-beta
model is used: alpha = the predictor's time for a 1 KiB call, beta = wire bytes / link bandwidth with the
ring/pairwise wire bytes of nccl-tests (doc/PERFORMANCE.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from k3sim.cp.traffic import Collective, wire_bytes

KernelTime = Callable[..., Any]


def default_kernel_time() -> KernelTime:
    from k3sim.kernels import predict_kernel_time  # lazy: the predictor loads measured data

    return predict_kernel_time


@dataclass
class KernelClock:
    """Memoised kernel-time calls: returns (seconds, source)."""

    hardware: Any
    kernel_time: KernelTime
    _memo: dict | None = None

    def __call__(self, op: str, **params: float) -> tuple[float, str]:
        p = {k: int(round(v)) for k, v in params.items()}
        key = (op, tuple(sorted(p.items())))
        if self._memo is None:
            self._memo = {}
        if key not in self._memo:
            r = self.kernel_time(op, p, self.hardware)
            self._memo[key] = (float(r.seconds), str(r.source))
        return self._memo[key]


@dataclass
class CommModel:
    clock: KernelClock
    P: int
    span_gpus: int                       # GPUs the CP group spans: P x TP
    bandwidth_override: float | None = None

    @property
    def link(self) -> str:
        if self.P == 1:
            return "none"
        return "scale-up" if self.span_gpus <= int(self.clock.hardware.scaleup_domain_gpus) else "scale-out"

    def time(self, c: Collective) -> tuple[float, str]:
        """Seconds for `c.count` sequential calls of the collective, and its source."""
        if self.P == 1 or c.shard_bytes <= 0:
            return 0.0, "none"
        gpus = 2 if c.op == "send_recv" else self.P
        if self.link == "scale-up" and self.bandwidth_override is None:
            s, src = self.clock(c.op, bytes=max(1, c.shard_bytes), gpus=gpus)
            return s * c.count, src
        hw = self.clock.hardware
        bw = self.bandwidth_override or (hw.scaleup_bandwidth_bytes_per_s if self.link == "scale-up"
                                         else hw.scaleout_bandwidth_bytes_per_s)
        alpha, src = self.clock(c.op, bytes=1024, gpus=min(gpus, int(hw.scaleup_domain_gpus)))
        s = alpha + wire_bytes(c.op, c.shard_bytes, gpus) / bw
        return s * c.count, f"alpha({src})+bytes/{self.link}-bandwidth"
