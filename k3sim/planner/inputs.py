"""Load a scenario for the planner: the scenario, its model and hardware, and the planner's sections."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class PlanInputs:
    path: Path
    scenario: Any
    model: Any
    hw: Any
    training: Any          # configs.planning.TrainingSection (defaults when the scenario has none)
    sweep: Any             # configs.planning.SweepSection

    @property
    def mode(self) -> str:
        return self.scenario.workload.mode


def load(path: str | Path) -> PlanInputs:
    """`k3sim.configs.resolve_scenario` plus the `training:` and `sweep:` sections (defaults if absent)."""
    from k3sim.configs.loaders import resolve_scenario
    from k3sim.configs.planning import SweepSection, TrainingSection

    path = Path(path)
    scenario, model, hw = resolve_scenario(path)
    return PlanInputs(path, scenario, model, hw, scenario.training or TrainingSection(),
                      scenario.sweep or SweepSection())
