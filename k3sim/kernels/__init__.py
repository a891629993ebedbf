"""Kernel times on a hardware profile: measured data, interpolation, fitted models (DEVELOPING.md,
"Kernel times"). Exports resolve lazily so `import k3sim.kernels` stays cheap (no numpy, no pandas).

Models ask `k3sim.predict.predict_kernel_time`, the facade above kernels and comm: it answers collectives
through `k3sim.comm` and every other op through `k3sim.kernels.predict`, so no kernel-time function that
would miss the collectives is exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from k3sim.kernels.predict import KernelTime

__all__ = ["KernelTime"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from k3sim.kernels import predict

        return getattr(predict, name)
    raise AttributeError(f"module 'k3sim.kernels' has no attribute {name!r}")
