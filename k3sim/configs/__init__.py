"""Config schemas (pydantic v2, extra fields forbidden) and their loaders."""

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.hardware import HardwareProfile
from k3sim.configs.loaders import (
    load_hardware,
    load_model,
    load_scenario,
    resolve_scenario,
)
from k3sim.configs.model import KDAConfig, MLAConfig, ModelConfig, MoEConfig, VisionConfig
from k3sim.configs.bounds import BOUNDS, check_range
from k3sim.configs.parallel import Cluster, Parallelism, Scenario, Workload, check_layout

__all__ = [
    "BOUNDS", "Cluster", "HardwareProfile", "KDAConfig", "MLAConfig", "ModelConfig", "MoEConfig", "Parallelism",
    "Scenario", "VisionConfig", "Workload", "bytes_per_element", "check_layout", "check_range", "load_hardware", "load_model",
    "load_scenario", "resolve_scenario",
]
