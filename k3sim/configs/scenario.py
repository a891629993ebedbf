"""The scenario schema: a what-if's model file, hardware, cluster, parallel layout and workload, with the
optional serving, training and sweep sections. Its own module (reachable as `k3sim.configs.parallel.Scenario`)
so that a layout check does not build the section schemas (`configs/parallel.py`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from k3sim.configs.parallel import Cluster, Workload
from k3sim.configs.parallelism import Parallelism, _STRICT
from k3sim.configs.planning import SERVE_SWEEP_FIELDS, TRAIN_SWEEP_FIELDS, SweepSection, TrainingSection
from k3sim.configs.serving import MAX_REPLICAS, ServingConfig


class Scenario(BaseModel):
    """A what-if: model file, hardware, cluster, parallel layout, workload."""

    model_config = _STRICT
    name: str
    description: str | None = None
    model: str = Field(description="model file (our YAML or HF config.json), relative to the scenario")
    hardware: str = Field(description="hardware profile name (hardware_profiles/<name>.yaml) or path")
    cluster: Cluster
    parallelism: Parallelism
    workload: Workload
    serving: ServingConfig | None = None  # k3sim serve: replicas, engine, router, P/D pools (configs/serving.py)
    training: TrainingSection | None = None  # k3sim plan: training step-model options (configs/planning.py)
    sweep: SweepSection | None = None  # k3sim sweep: layout grid (configs/planning.py)

    @property
    def replicas(self) -> int:
        """Model replicas the cluster holds: num_gpus / (tp * pp * cp * dp), exact by validation."""
        return self.cluster.num_gpus // self.parallelism.gpus

    @model_validator(mode="after")
    def _fits_cluster(self) -> "Scenario":
        if self.cluster.num_gpus % self.parallelism.gpus:
            raise ValueError(
                f"cluster.num_gpus={self.cluster.num_gpus} is not a multiple of "
                f"tp*pp*cp*dp={self.parallelism.gpus}")
        return self

    @model_validator(mode="after")
    def _sections_of_this_mode(self) -> "Scenario":
        """A section or field no command reads in this scenario's mode is refused, not ignored (issue 19):
        each message starts with the field path, which the loader's one error line names."""
        mode = self.workload.mode
        if mode == "serve" and self.training is not None:
            raise ValueError("training (the training step model's options) has no effect in mode serve: no "
                             "command runs a training step for a serve scenario; remove the section")
        if self.sweep is not None:
            other = SERVE_SWEEP_FIELDS if mode == "train" else TRAIN_SWEEP_FIELDS
            stray = [f for f in other if getattr(self.sweep, f) is not None]
            if stray:
                kind = "serving" if mode == "train" else "training"
                raise ValueError(f"sweep.{stray[0]} is a {kind} sweep dimension and a {mode} scenario's sweep "
                                 f"varies {', '.join(TRAIN_SWEEP_FIELDS if mode == 'train' else SERVE_SWEEP_FIELDS)}"
                                 "; remove it")
        sv = self.serving
        if sv is not None:
            if "router_load_cap" in sv.model_fields_set and sv.router != "prefix-aware":
                raise ValueError(f"serving.router_load_cap is the prefix-aware router's balance threshold and "
                                 f"serving.router is {sv.router}; remove it or set router: prefix-aware")
            pools = [self.parallelism] + ([p.parallelism for p in (sv.disaggregation.prefill,
                                                                   sv.disaggregation.decode)
                                           if p.parallelism is not None] if sv.disaggregation else [])
            if "pp_microbatches" in sv.engine.model_fields_set and all(p.pp == 1 for p in pools):
                raise ValueError("serving.engine.pp_microbatches keeps pp batches in flight per replica and every "
                                 "replica has pp=1; remove it")
        if mode == "serve" and (sv is None or sv.replicas is None) and self.replicas > MAX_REPLICAS:
            raise ValueError(f"cluster.num_gpus={self.cluster.num_gpus:,} holds {self.replicas:,} replicas of "
                             f"{self.parallelism.gpus} GPUs, more than the {MAX_REPLICAS:,} a serving simulation "
                             "runs (k3sim/configs/bounds.py: replicas); set serving.replicas or a smaller cluster")
        return self
