"""`k3sim memory`: per-GPU memory plan for serving or training under a parallel layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


def print_plan(plan: Any, json_out: bool) -> None:
    """Render a ServePlan / TrainPlan: JSON as is, or a summary and a breakdown table."""
    from k3sim.output import human_bytes, print_json, print_kv, print_table

    if json_out:
        print_json(plan)
        return
    par = plan.parallelism
    layout = " ".join(f"{k}={v}" for k, v in par.items() if k != "zero_stage" and v != 1) or "single GPU"
    pp = par.get("pp", 1)
    pairs = [("model", plan.model), ("hardware", plan.hardware), ("mode", plan.mode), ("layout", layout),
             ("HBM per GPU", f"{human_bytes(plan.hbm_bytes)} ({plan.hbm_bytes / 1e9:,.1f} GB)"),
             ("fullest pipeline stage (numbered from 0)", f"{plan.worst_stage} of 0..{pp - 1}")]
    if plan.mode == "serve":
        pairs += [
            ("context per request", f"{plan.context_tokens:,} tokens"),
            ("KDA state per request (model)", human_bytes(plan.kda_state_bytes_per_request)),
            ("MLA KV per token (model)", human_bytes(plan.mla_kv_bytes_per_token)),
            ("per request on this GPU (fullest stage)", human_bytes(plan.per_request_bytes_per_gpu)),
            ("max concurrent requests (each at the full context)", plan.max_concurrent_requests),
        ]
    else:
        pairs += [
            ("sequence x micro-batch", f"{plan.seq_len_tokens:,} x {plan.micro_batch_size}"),
            ("activation checkpointing", plan.activation_checkpointing),
            ("micro-batches in flight", f"{plan.in_flight_micro_batches:g}"),
            ("params per GPU (fullest stage)", f"{plan.params_per_gpu:,}"),
        ]
    pairs += [("total used per GPU (fullest stage)", human_bytes(plan.per_gpu_bytes["total"])),
              ("free per GPU (fullest stage)", human_bytes(plan.per_gpu_bytes["free"]))]
    print_kv("memory plan (per GPU; sizes in GiB = 2^30 bytes)", pairs)
    print_table(f"per-GPU breakdown, pipeline stage {plan.worst_stage}", ["component", "size", "from"],
                [(r.component, human_bytes(r.bytes), r.source) for r in plan.breakdown])


# Workload fields and the options that set them (layout fields map to --tp, --virtual-stages, ...).
WORKLOAD_OPTIONS = {"mode": "--mode", "context_tokens": "--context", "micro_batch_size": "--micro-batch",
                    "prefill_chunk_tokens": "--prefill-chunk", "workspace_fraction": "--workspace-fraction",
                    "activation_checkpointing": "--recompute/--no-recompute",
                    "num_micro_batches": "--num-micro-batches"}


def build_plan(model_path: str, hardware: str, mode: str, layout: dict, *, context: int,
               micro_batch: int | None = None, recompute: bool | None = None, num_micro_batches: int | None = None,
               prefill_chunk: int | None = None, workspace_fraction: float | None = None,
               source: str = "command line"):
    """Load the inputs and compute the plan; bad input raises InputError, a misfit DoesNotFit.

    Options left as None were not given: a mode-specific option given in the other mode is refused by the
    Workload schema (e.g. --micro-batch with --mode serve), and so is a layout field that has no effect
    (`--zero-stage` with --mode serve), by `check_layout`."""
    from k3sim.configs import Parallelism, Workload, check_layout, load_hardware, load_model
    from k3sim.configs.loaders import validate
    from k3sim.errors import DoesNotFit, InputError
    from k3sim.memory.plan import workload_plan

    def from_option(err: InputError) -> InputError:
        """An error about a field the command line set names the option (--tp, --context), not the field."""
        if isinstance(err, DoesNotFit) or err.field is None:
            return err
        name = err.field.split(".")[-1]
        if name in WORKLOAD_OPTIONS:
            return InputError(err.reason, source=WORKLOAD_OPTIONS[name])
        if name in layout or name in Parallelism.model_fields:
            return InputError(err.reason, source="--" + name.replace("_", "-"))
        return err

    if mode not in ("serve", "train"):
        raise InputError(f"unknown mode '{mode}' (serve or train)", source="--mode")
    given = dict(micro_batch_size=micro_batch, num_micro_batches=num_micro_batches, workspace_fraction=workspace_fraction,
                 activation_checkpointing=recompute, prefill_chunk_tokens=prefill_chunk)
    try:
        workload = validate(Workload, dict(mode=mode, context_tokens=context,
                                           **{k: v for k, v in given.items() if v is not None}), source)
    except InputError as err:
        raise from_option(err) from None
    model = load_model(model_path)
    hw = load_hardware(hardware)
    try:
        par = validate(Parallelism, {k: v for k, v in layout.items() if v is not None}, source)
        check_layout(model, par, mode=mode, source=source, hardware=hw)
        if mode == "serve":
            model.check_context(context, source="--context")
        return workload_plan(model, hw, par, workload)
    except InputError as err:
        raise from_option(err) from None


def register(app: typer.Typer) -> None:
    from k3sim.configs import Parallelism, Workload

    def default(cls, name: str):
        """The schema's default, shown in --help: the one place it is written is the schema."""
        value = cls.model_fields[name].default
        return {True: "recompute", False: "no-recompute"}.get(value, value) if isinstance(value, bool) else value

    @app.command("memory")
    def memory(
        model: Path = typer.Option(..., "--model", help="our model YAML or a Hugging Face config.json"),
        hardware: str = typer.Option("h200", "--hardware", help="profile name or path"),
        mode: str = typer.Option("serve", "--mode", help="serve or train"),
        tp: int = typer.Option(1, "--tp"),
        pp: int = typer.Option(1, "--pp"),
        ep: int = typer.Option(1, "--ep"),
        cp: int = typer.Option(1, "--cp"),
        dp: int = typer.Option(1, "--dp"),
        virtual_stages: int = typer.Option(1, "--virtual-stages", help="model chunks per pipeline rank"),
        zero_stage: Optional[int] = typer.Option(
            None, "--zero-stage", help=f"train: 0-3, shards over data-parallel replicas [default: {default(Parallelism, 'zero_stage')}]"),
        context: int = typer.Option(131072, "--context", help="serve: tokens per request; train: sequence"),
        micro_batch: Optional[int] = typer.Option(
            None, "--micro-batch", help=f"train: sequences per micro-batch [default: {default(Workload, 'micro_batch_size')}]"),
        recompute: Optional[bool] = typer.Option(
            None, "--recompute/--no-recompute", help=f"train: activation checkpointing [default: {default(Workload, 'activation_checkpointing')}]"),
        prefill_chunk: Optional[int] = typer.Option(
            None, "--prefill-chunk", help=f"serve: chunked-prefill tokens [default: {default(Workload, 'prefill_chunk_tokens')}]"),
        workspace_fraction: float = typer.Option(default(Workload, "workspace_fraction"), "--workspace-fraction",
                                                 help="HBM held back"),
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Per-GPU memory: weights, KV cache, KDA state (serve) or grads, optimizer, activations (train)."""
        layout = dict(tp=tp, pp=pp, ep=ep, cp=cp, dp=dp, virtual_stages=virtual_stages, zero_stage=zero_stage)
        plan = build_plan(str(model), hardware, mode, layout, context=context, micro_batch=micro_batch,
                          recompute=recompute, prefill_chunk=prefill_chunk,
                          workspace_fraction=workspace_fraction)
        print_plan(plan, json_out)
