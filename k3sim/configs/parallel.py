"""Parallel layout, cluster and workload schemas and the one layout check; the scenario that ties them to a
model is `configs/scenario.py` (`Scenario`, also reachable here)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator
from typing_extensions import Annotated

from k3sim.configs.bounds import _finite, _not_bool, bounded_int
from k3sim.configs.model import ModelConfig
from k3sim.configs.parallelism import Degree, Parallelism, _STRICT  # noqa: F401 - re-exported
from k3sim.errors import InputError

# Documented ranges (k3sim/configs/bounds.py); `tp: true` is refused, not read as 1.
GPUs = bounded_int("gpus")
Tokens = bounded_int("tokens")
Batch = bounded_int("batch")
Fraction = Annotated[float, BeforeValidator(_finite), Field(ge=0, lt=1, allow_inf_nan=False)]


class Cluster(BaseModel):
    """The GPUs available (their kind is the scenario's `hardware`)."""

    model_config = _STRICT
    num_gpus: GPUs
    gpus_per_node: GPUs = 8


# Workload fields that only one mode reads; setting one in the other mode is refused, not ignored.
MODE_FIELDS = {"serve": ("prefill_chunk_tokens",),
               "train": ("micro_batch_size", "num_micro_batches", "activation_checkpointing")}


class Workload(BaseModel):
    """What the cluster runs. serve: requests of `context_tokens`; train: sequences of that length."""

    model_config = _STRICT
    mode: Literal["serve", "train"]
    context_tokens: Tokens = Field(description="serve: context per request; train: sequence length")
    prefill_chunk_tokens: Tokens = Field(8192, description="serve: tokens per chunked-prefill step")
    micro_batch_size: Batch = Field(1, description="train: sequences per micro-batch")
    num_micro_batches: Batch | None = Field(None, description="train: per step; None = pp*virtual")
    activation_checkpointing: StrictBool = Field(True, description="train: full per-layer recompute")
    workspace_fraction: Fraction = Field(
        0.10, description="HBM share reserved for CUDA context, NCCL buffers, temporaries")

    @model_validator(mode="after")
    def _fields_of_this_mode(self) -> "Workload":
        other = "train" if self.mode == "serve" else "serve"
        stray = [f for f in MODE_FIELDS[other] if f in self.model_fields_set]
        if stray:
            raise ValueError(f"{stray[0]} applies to mode {other} only and has no effect in mode {self.mode}; "
                             "remove it")
        return self


def check_layout(model: ModelConfig, parallelism: Parallelism, *, cluster: Cluster | None = None,
                 mode: str | None = None, source: str | None = None, hardware=None) -> None:
    """The one layout check every command and planner calls: raise InputError (one line naming the field)
    if `parallelism` cannot run `model` in `mode` on `cluster` / `hardware`.

    - model: tp splits every mixer kind's heads, groups or channels (`configs/kinds` `tp_rules`), ep divides
      the routed experts + redundant_experts (and is
      no larger) and the tp*cp*dp GPUs of a stage, ep = 1 without MoE, pp*virtual_stages <= layers (`Parallelism.check_against`);
    - mode "serve": `zero_stage` (optimizer/gradient sharding) and `virtual_stages` (an interleaved training
      schedule) have no effect and are refused if given;
    - hardware (with or without a cluster): a TP group is no larger than one NVLink domain
      (`scaleup_domain_gpus`: tensor parallelism needs the scale-up fabric);
    - cluster: num_gpus is a multiple of the replica's tp*pp*cp*dp GPUs; with `hardware`, gpus_per_node
      tiles the NVLink domain (a node holds whole domains or a domain whole nodes); without `hardware`,
      a TP group is no larger than one node.
    Field names are the scenario's (`parallelism.tp`, `cluster.gpus_per_node`); a command that sets them from
    options maps them to its option names.
    """

    def fail(field: str, reason: str) -> None:
        raise InputError(reason, source=source, field=field)

    parallelism.check_against(model, source=source)
    if mode is not None and mode not in ("serve", "train"):
        fail("workload.mode", f"unknown mode '{mode}' (serve or train)")
    if mode == "serve" and "zero_stage" in parallelism.model_fields_set:
        fail("parallelism.zero_stage", "ZeRO shards optimizer states and gradients of training; it has no "
             "effect in mode serve; remove it")
    if mode == "serve" and "virtual_stages" in parallelism.model_fields_set:
        fail("parallelism.virtual_stages", "virtual stages interleave a training pipeline schedule (1F1B); a "
             "serving replica runs its stages in sequence, so it has no effect in mode serve; remove it")
    par = parallelism
    _check_serving_at_scale(par, mode, cluster, hardware, fail)
    if hardware is not None and par.tp > int(hardware.scaleup_domain_gpus):
        domain = int(hardware.scaleup_domain_gpus)
        fail("parallelism.tp", f"tp={par.tp} does not fit in the {domain}-GPU NVLink domain of "
             f"{hardware.name} (tensor parallelism needs the scale-up fabric; at most {domain})")
    if cluster is None:
        return
    if cluster.num_gpus % par.gpus:
        fail("cluster.num_gpus", f"{cluster.num_gpus} GPUs is not a multiple of tp*pp*cp*dp={par.gpus} "
             "(the GPUs of one replica)")
    node = cluster.gpus_per_node
    if hardware is not None:
        domain = int(hardware.scaleup_domain_gpus)
        if domain % node and node % domain:
            fail("cluster.gpus_per_node", f"{node} GPUs per node does not tile the {domain}-GPU NVLink domain "
                 f"of {hardware.name} (use a divisor or a multiple of {domain})")
    elif par.tp > node:
        fail("parallelism.tp", f"tp={par.tp} does not fit in a node of {node} GPUs "
             f"(cluster.gpus_per_node; at most {node})")


SERVE_ONLY = ("ep_kernel", "dispatch_dtype", "max_nodes_per_token", "tbo", "tbo_variant", "routing_zipf",
              "mla_decode_kernel")


def _check_serving_at_scale(par: Parallelism, mode, cluster, hardware, fail) -> None:
    """The serving-at-scale fields (DeepEP kernels, node-limited routing, TBO): what the step model of serving
    reads. Training has its own (training.redundant_experts per rank, training.routing_skew), so these are
    refused in mode train; node-limited routing needs an EP group spanning more nodes than the limit; FP8
    dispatch needs FP8 on the profile."""
    if mode == "train":
        for name in SERVE_ONLY + ("redundant_experts",):
            if name in par.model_fields_set:
                alt = {"redundant_experts": " (training.redundant_experts gives MoonEP slots per rank)",
                       "routing_zipf": " (training.routing_skew is training's)"}.get(name, "")
                fail(f"parallelism.{name}", f"{name} is a serving step setting and has no effect in mode train"
                     f"{alt}; remove it")
    node = cluster.gpus_per_node if cluster is not None else (
        int(hardware.scaleup_domain_gpus) if hardware is not None else None)
    if par.max_nodes_per_token is not None:
        nodes = max(1, -(-par.ep // node)) if node else None
        if par.ep <= 1 or par.dp <= 1:
            fail("parallelism.max_nodes_per_token", "node-limited routing applies to the expert all-to-all of "
                 "an attention-DP layout (dp > 1, ep > 1); remove it or set dp and ep")
        if nodes is not None and par.max_nodes_per_token > nodes:
            fail("parallelism.max_nodes_per_token", f"max_nodes_per_token={par.max_nodes_per_token} exceeds the "
                 f"{nodes} node(s) of the ep={par.ep} group ({node} GPUs per node); at most {nodes}")
    if "tbo_variant" in par.model_fields_set and not par.tbo:
        fail("parallelism.tbo_variant", "tbo_variant chooses the two-batch-overlap schedule; it has no effect "
             "without tbo: true; set tbo or remove it")
    if par.dispatch_dtype == "fp8" and hardware is not None and "fp8" not in (hardware.peak_flops_per_s or {}):
        fail("parallelism.dispatch_dtype", f"FP8 dispatch needs FP8 on the GPU; profile '{hardware.name}' has "
             "no fp8 peak: use bf16 (or auto)")


# The scenario schema and the sections it holds (`configs/scenario.py`: the serving, training and sweep sections
# of configs/serving.py and configs/planning.py) load on first use: a layout check, which every what-if command
# runs, needs none of them (~20 ms of pydantic class building in a 0.3 s query).
_LAZY = {"Scenario": "scenario", "MAX_REPLICAS": "serving", "ServingConfig": "serving",
         "SERVE_SWEEP_FIELDS": "planning", "TRAIN_SWEEP_FIELDS": "planning", "SweepSection": "planning",
         "TrainingSection": "planning"}


def __getattr__(name: str):
    """`Scenario` and the section schemas this module used to define or import, from their modules on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"k3sim.configs.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
