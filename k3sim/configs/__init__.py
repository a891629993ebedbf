"""Config schemas (pydantic v2, extra fields forbidden) and their loaders.

Exports resolve on first use (PEP 562 `__getattr__`): `from k3sim.configs.bounds import option_range`, which
every command module runs while `k3sim --help` builds its command list, then loads the bounds table only, not
every schema (the model, parallel, serving and planning schemas cost ~0.2 s of pydantic class building).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from k3sim.configs.bounds import BOUNDS, check_range
    from k3sim.configs.dtypes import bytes_per_element
    from k3sim.configs.hardware import HardwareProfile
    from k3sim.configs.loaders import load_hardware, load_model, load_scenario, resolve_scenario
    from k3sim.configs.model import KDAConfig, MLAConfig, ModelConfig, MoEConfig, VisionConfig
    from k3sim.configs.parallel import Cluster, Parallelism, Scenario, Workload, check_layout

# export -> the submodule that defines it
_EXPORTS = {
    "bytes_per_element": "dtypes", "HardwareProfile": "hardware",
    "load_hardware": "loaders", "load_model": "loaders", "load_scenario": "loaders", "resolve_scenario": "loaders",
    "KDAConfig": "model", "MLAConfig": "model", "ModelConfig": "model", "MoEConfig": "model",
    "VisionConfig": "model", "BOUNDS": "bounds", "check_range": "bounds",
    "Cluster": "parallel", "Parallelism": "parallel", "Scenario": "parallel", "Workload": "parallel",
    "check_layout": "parallel",
}

__all__ = [
    "BOUNDS", "Cluster", "HardwareProfile", "KDAConfig", "MLAConfig", "ModelConfig", "MoEConfig", "Parallelism",
    "Scenario", "VisionConfig", "Workload", "bytes_per_element", "check_layout", "check_range", "load_hardware", "load_model",
    "load_scenario", "resolve_scenario",
]


def __getattr__(name: str) -> Any:
    """An export, imported from its submodule on first use and kept; a submodule by name (`configs.parallel`)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"k3sim.configs.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):  # dunder probes (inspect, pickle) are no submodule
        try:
            return importlib.import_module(f"k3sim.configs.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"k3sim.configs.{name}":
                raise
    raise AttributeError(f"module 'k3sim.configs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
