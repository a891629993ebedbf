"""Load a scenario for the planner: the scenario, its model and hardware, and the planner's sections."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3sim.errors import InputError

PLANNER_SECTIONS = ("training", "sweep")


@dataclass
class PlanInputs:
    path: Path
    scenario: Any
    model: Any
    hw: Any
    training: Any          # TrainingSection
    sweep: Any             # SweepSection

    @property
    def mode(self) -> str:
        return self.scenario.workload.mode


def load(path: str | Path) -> PlanInputs:
    """Like `k3sim.configs.resolve_scenario`, plus the `training:` and `sweep:` sections.

    While the Scenario schema does not list those sections itself, they are split off here before the
    rest is validated by the schema, and the model / hardware references are resolved as
    resolve_scenario does (same helpers, same error lines)."""
    from k3sim.configs import loaders
    from k3sim.configs.parallel import Scenario
    from k3sim.planner.options import sections

    path = Path(path)
    data = loaders.read_mapping(path)
    training, sweep = sections(data, str(path))
    if all(k in Scenario.model_fields for k in PLANNER_SECTIONS) or not any(k in data for k in PLANNER_SECTIONS):
        scenario, model, hw = loaders.resolve_scenario(path)
        return PlanInputs(path, scenario, model, hw, training, sweep)
    rest = {k: v for k, v in data.items() if k not in PLANNER_SECTIONS}
    scenario = loaders.validate(Scenario, rest, str(path))
    base = path.resolve().parent
    model_path = loaders.resolve_relative(scenario.model, base)
    if not model_path.exists():
        raise InputError(f"file not found: {scenario.model} (looked in {base}, the working directory "
                         "and the repository root)", source=str(path), field="model")
    model = loaders.load_model(model_path)
    hw_ref = scenario.hardware
    hw_path = loaders.resolve_relative(hw_ref, base) if Path(hw_ref).suffix else hw_ref
    try:
        hw_file = loaders.hardware_path(hw_path)
    except InputError as err:
        raise InputError(f"'{hw_ref}': {err.reason}", source=str(path), field="hardware") from None
    if not hw_file.exists():
        raise InputError(f"file not found: {hw_ref}", source=str(path), field="hardware")
    hw = loaders.load_hardware(hw_file)
    try:
        from k3sim.configs.parallel import check_layout
    except ImportError:
        scenario.parallelism.check_against(model, source=str(path))
    else:
        check_layout(model, scenario.parallelism, cluster=scenario.cluster, mode=scenario.workload.mode,
                     source=str(path), hardware=hw)
    return PlanInputs(path, scenario, model, hw, training, sweep)
