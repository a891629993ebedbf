"""Kernel times on a hardware profile: measured data, interpolation, fitted models (DEVELOPING.md,
"Kernel times"). Exports resolve lazily so `import k3sim.kernels` stays cheap (no numpy, no pandas).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from k3sim.kernels.predict import KernelTime, predict_kernel_time

__all__ = ["KernelTime", "predict_kernel_time"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from k3sim.kernels import predict

        return getattr(predict, name)
    raise AttributeError(f"module 'k3sim.kernels' has no attribute {name!r}")
