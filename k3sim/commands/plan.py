"""`k3sim plan`: the main job on a scenario. For now: the scenario's per-GPU memory plan."""

from __future__ import annotations

from pathlib import Path

import typer

DEFAULT_SCENARIO = Path("scenarios/default.yaml")


def scenario_path(path: Path) -> Path:
    """The path as given, or (for the default) the repository's copy when run from elsewhere."""
    if path.exists() or path != DEFAULT_SCENARIO:
        return path
    from k3sim.configs.loaders import REPO_ROOT

    return REPO_ROOT / DEFAULT_SCENARIO


def plan_scenario(path: Path):
    """(scenario, memory plan) for a scenario file; bad input raises InputError, a misfit DoesNotFit."""
    from k3sim.configs import resolve_scenario
    from k3sim.memory.plan import workload_plan

    scenario, model, hw = resolve_scenario(path)
    return scenario, workload_plan(model, hw, scenario.parallelism, scenario.workload, source=str(path))


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(
        scenario: Path = typer.Option(DEFAULT_SCENARIO, "--scenario", help="scenario YAML"),
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Plan a scenario (default: scenarios/default.yaml): per-GPU memory for now."""
        from k3sim.commands.memory import print_plan
        from k3sim.output import print_json

        path = scenario_path(scenario)
        sc, result = plan_scenario(path)
        if json_out:
            print_json({"scenario": sc.name, "scenario_file": str(path),
                        "cluster_gpus": sc.cluster.num_gpus,
                        "replicas": sc.replicas, "memory": result})
            return
        print(f"scenario {sc.name}: {sc.description or ''}".rstrip(": "))
        print(f"cluster: {sc.cluster.num_gpus} x {sc.hardware}, "
              f"{sc.replicas} replica(s) of {sc.parallelism.gpus} GPUs")
        print_plan(result, json_out=False)
