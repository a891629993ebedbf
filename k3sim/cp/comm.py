"""Times of the communication calls a CP strategy makes, and which link they use.

Every collective goes through the kernel-time facade (`k3sim.predict.predict_kernel_time`), which hands
it to the one collective model (`k3sim.comm.collective_time`): the same call `k3sim kernel-time <op>
--set bytes=.. --set gpus=.. [--set gpus_per_node=..]` answers. The placement: the CP group's P ranks are strided by TP over
P x TP GPUs, packed `scaleup_domain_gpus` to a node, so P / nodes of them share an NVSwitch domain
(`gpus_per_node`). A bandwidth override (e.g. the H800's 200 GB/s NVLink on H200-measured kernels)
goes to `collective_time` directly with `link_bandwidth`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from k3sim.cp.traffic import Collective, wire_bytes

KernelTime = Callable[..., Any]


def default_kernel_time() -> KernelTime:
    from k3sim.predict import predict_kernel_time  # lazy: the predictor loads measured data

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

    @property
    def nodes(self) -> int:
        """Scale-up domains the group spans."""
        domain = max(1, int(self.clock.hardware.scaleup_domain_gpus))
        return max(1, -(-int(self.span_gpus) // domain))

    def placement(self, op: str) -> tuple[int, int | None]:
        """(gpus, gpus_per_node) of one call: a ring hop (send_recv) between neighbours crosses nodes
        when the group does; None keeps the predictor's default (the whole call inside one domain)."""
        if op == "send_recv":
            return 2, (1 if self.nodes > 1 else None)
        return self.P, (-(-self.P // self.nodes) if self.nodes > 1 else None)

    def time(self, c: Collective) -> tuple[float, str]:
        """Seconds for `c.count` sequential calls of the collective, and its source."""
        if self.P == 1 or c.shard_bytes <= 0:
            return 0.0, "none"
        gpus, gpn = self.placement(c.op)
        nbytes = max(1, int(round(c.shard_bytes)))
        if self.bandwidth_override is None:
            params = dict(bytes=nbytes, gpus=gpus, **({"gpus_per_node": gpn} if gpn else {}))
            s, src = self.clock(c.op, **params)
            return s * c.count, src
        from k3sim.comm import collective_time

        kt = collective_time(c.op, nbytes, gpus, self.clock.hardware, gpus_per_node=gpn,
                             link_bandwidth=self.bandwidth_override, convention="barrier")
        return kt.seconds * c.count, f"{kt.source} ({kt.method}, link bandwidth override)"
