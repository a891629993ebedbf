"""Load a scenario for the planner: the scenario, its model and hardware, and the planner's sections.

The `training:` section is checked against what it acts on (`TRAINING_NEEDS`): a knob for a part the model
lacks (MoE routing skew for a dense model, `mla_cp` without MLA layers) is refused for every command; with
`own_layout` (`k3sim plan`, which runs the scenario's own layout) a knob whose parallel dimension is 1 there
(`tp_overlap` at tp=1, `kda_cp` at cp=1) is refused too. A sweep checks the section per point instead (its
grid varies the layout), and the step model refuses a point whose MoonEP slots exceed what a rank can use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3sim.configs.planning import check_redundant_experts, resolve_recompute
from k3sim.errors import InputError

# Each `training:` knob: the model part it acts on (None: every model) and the parallel degree that must
# exceed 1 for it to change the step (None: any layout). The seed draws the routing samples of the EP
# imbalance, so it acts where the imbalance does.
TRAINING_NEEDS: dict[str, tuple[str | None, str | None]] = {
    "routing_skew": ("moe", "ep"),
    "redundant_experts": ("moe", "ep"),
    "ep_overlap": ("moe", "ep"),
    "seed": ("moe", "ep"),
    "moe_glue": ("moe", None),
    "tp_overlap": (None, "tp"),
    "kda_cp": ("kda", "cp"),
    "mla_cp": ("mla", "cp"),
    "precision": (None, None),
    "recompute": (None, None),
    "recompute_modules": (None, None),
    "pipeline_schedule": (None, "pp"),
    "stage_split": (None, "pp"),
    "tokens": (None, None),
    "days": (None, None),
}
_PARTS = {"moe": "MoE layers", "kda": "KDA layers", "mla": "MLA layers"}


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


def check_training(scenario: Any, model: Any, source: str, *, own_layout: bool) -> None:
    """Refuse a `training:` knob the model (or, with `own_layout`, the scenario's layout) gives no effect,
    naming the field `training.<knob>`; and MoonEP slots beyond the experts a rank does not hold."""
    section = scenario.training
    if section is None:
        return
    par = scenario.parallelism
    for knob in sorted(section.model_fields_set, key=list(TRAINING_NEEDS).index):
        part, degree = TRAINING_NEEDS[knob]
        if part is not None and getattr(model, part) is None:
            raise InputError(f"acts on {_PARTS[part]} and model '{model.name}' has none; remove it",
                             source=source, field=f"training.{knob}")
        if own_layout and degree is not None and getattr(par, degree) == 1:
            raise InputError(f"has no effect with parallelism.{degree}=1 (nothing to act on in this layout); "
                             f"remove it, or raise parallelism.{degree}", source=source, field=f"training.{knob}")
    if own_layout and section.redundant_experts and model.moe is not None and par.ep > 1:
        check_redundant_experts(section.redundant_experts, model.moe.num_routed_experts, par.ep, source)
    # recompute modules the model lacks, or given without `recompute: selective` (the step and memory refuse the
    # same, here before any work)
    resolve_recompute(model, section.recompute, section.recompute_modules,
                      scenario.workload.activation_checkpointing, source)


def load(path: str | Path, *, own_layout: bool = False) -> PlanInputs:
    """`k3sim.configs.resolve_scenario` plus the `training:` and `sweep:` sections (defaults if absent), the
    training section checked against the model (and the scenario's layout, with `own_layout`)."""
    from k3sim.configs.loaders import resolve_scenario
    from k3sim.configs.planning import SweepSection, TrainingSection

    path = Path(path)
    scenario, model, hw = resolve_scenario(path)
    check_training(scenario, model, str(path), own_layout=own_layout)
    return PlanInputs(path, scenario, model, hw, scenario.training or TrainingSection(),
                      scenario.sweep or SweepSection())
