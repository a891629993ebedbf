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
        ]
        if plan.recurrent_state_bytes_per_request != plan.kda_state_bytes_per_request or \
                plan.kv_bytes_per_token != plan.mla_kv_bytes_per_token:  # kinds beyond KDA and MLA
            pairs[-2:] = [("recurrent state per request (model)", human_bytes(plan.recurrent_state_bytes_per_request)),
                          ("KV per token, full-context attention (model)", human_bytes(plan.kv_bytes_per_token))]
        pairs += [
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
    except DoesNotFit as err:
        raise DoesNotFit(misfit_line(model, hw, par, workload, err), source=err.source) from None
    except InputError as err:
        raise from_option(err) from None


GiB = 2 ** 30
# Fixes tried when a plan does not fit, each one option changed alone, in the order a user would reach for
# them: (option, field, how the value moves). Doubling steps stop at the documented range's end.
FIX_STEPS = {"serve": (("--pp", "pp", "x2"), ("--ep", "ep", "x2"), ("--tp", "tp", "x2"), ("--cp", "cp", "x2"),
                       ("--context", "context_tokens", "/2"), ("--prefill-chunk", "prefill_chunk_tokens", "/2")),
             "train": (("--recompute", "activation_checkpointing", "on"), ("--micro-batch", "micro_batch_size", "/2"),
                       ("--pp", "pp", "x2"), ("--tp", "tp", "x2"), ("--ep", "ep", "x2"), ("--cp", "cp", "x2"),
                       ("--dp", "dp", "x2"), ("--zero-stage", "zero_stage", "+1"))}
MAX_FIXES = 3  # shown on the error line (the line is capped at 300 characters)


def _used_bytes(model, hw, par, workload) -> float | None:
    """Per-GPU bytes of the plan if it fits, None if it does not or the layout is refused: a fix is only a
    fix when the whole plan, layout check included, accepts it."""
    from k3sim.configs import check_layout
    from k3sim.errors import InputError
    from k3sim.memory.plan import train_plan, workload_plan

    try:
        check_layout(model, par, mode=workload.mode, hardware=hw)
        if workload.mode == "serve":
            model.check_context(workload.context_tokens)
            return workload_plan(model, hw, par, workload).per_gpu_bytes["total"]
        plan = train_plan(model, hw, par, workload.context_tokens, micro_batch_size=workload.micro_batch_size,
                          activation_checkpointing=workload.activation_checkpointing,
                          num_micro_batches=workload.num_micro_batches,
                          workspace_fraction=workload.workspace_fraction, allow_overflow=True)
        return plan.per_gpu_bytes["total"] if plan.fits else None
    except InputError:
        return None


def fixes_that_fit(model, hw, par, workload) -> list[str]:
    """Single-option changes that make the plan fit, each computed (not guessed): the smallest step of each
    option in FIX_STEPS that fits, as the option the user would write and the GiB per GPU it leaves."""
    from k3sim.configs.bounds import BOUNDS

    found = []
    for option, name, how in FIX_STEPS[workload.mode]:
        on_layout = name in par.model_fields
        value = getattr(par if on_layout else workload, name)
        while True:
            if how == "on":
                value = None if value else True
            elif how == "/2":
                value = value // 2 if value > 1 else None
            elif how == "+1":
                value = value + 1 if value < 3 else None
            else:
                value = value * 2 if value * 2 <= BOUNDS["parallel"].hi else None
            if value is None:
                break
            trial_par = par.model_copy(update={name: value}) if on_layout else par
            trial_wl = workload if on_layout else workload.model_copy(update={name: value})
            used = _used_bytes(model, hw, trial_par, trial_wl)
            if used is not None:
                text = option if how == "on" else f"{option} {value}"
                found.append(f"{text} ({used / GiB:.1f} GiB)")
                break
            if how == "on":
                break
    return found


def misfit_line(model, hw, par, workload, err) -> str:
    """The planner's "does not fit" line, its advice replaced by the options that were computed to fit
    (`memory --no-recompute` said nothing of --recompute; the serve advice named pp or ep by the largest
    term, not by trying them)."""
    fixes = fixes_that_fit(model, hw, par, workload)
    head = err.reason
    if workload.mode == "train":  # the component list is long: keep the two largest
        from k3sim.memory.plan import train_plan

        plan = train_plan(model, hw, par, workload.context_tokens, micro_batch_size=workload.micro_batch_size,
                          activation_checkpointing=workload.activation_checkpointing,
                          num_micro_batches=workload.num_micro_batches,
                          workspace_fraction=workload.workspace_fraction, allow_overflow=True)
        top = sorted(plan.breakdown, key=lambda r: -r.bytes)[:2]
        head = (f"does not fit: pipeline stage {plan.worst_stage} (of 0..{par.pp - 1}) needs "
                f"{plan.per_gpu_bytes['total'] / GiB:.1f} GiB per GPU (largest: "
                f"{', '.join(f'{r.component} {r.bytes / GiB:.1f}' for r in top)} GiB) > "
                f"{plan.hbm_bytes / GiB:.1f} GiB HBM of {hw.name} ({plan.hbm_bytes / 1e9:.1f} GB)")
    elif "; " in head:
        head = head.rsplit("; ", 1)[0]  # serve_plan's advice by the largest term: replaced below
    if not fixes:
        options = ", ".join(dict.fromkeys(o for o, _, _ in FIX_STEPS[workload.mode]))
        return f"{head}; no single change of {options} fits: combine them or use a larger GPU"
    for n in range(min(MAX_FIXES, len(fixes)), 0, -1):
        line = f"{head}; fits with {' or '.join(fixes[:n])}"
        if len(line) <= 280:  # the CLI's 300-character line, with the source in front
            return line
    return line


def register(app: typer.Typer) -> None:
    from k3sim.commands.options import MODEL_SET
    from k3sim.configs import Parallelism, Workload

    def default(cls, name: str):
        """The schema's default, shown in --help: the one place it is written is the schema."""
        value = cls.model_fields[name].default
        return {True: "recompute", False: "no-recompute"}.get(value, value) if isinstance(value, bool) else value

    @app.command("memory")
    def memory(
        model: Path = typer.Option(Path("models/kimi-k3.yaml"), "--model",
                                   help="our model YAML or a Hugging Face config.json"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        hardware: str = typer.Option("h200", "--hardware", help="profile name or path"),
        mode: str = typer.Option("serve", "--mode", help="serve or train"),
        tp: int = typer.Option(1, "--tp", help="tensor-parallel ranks [default: 1, as every layout degree here: the "
                               "scenario schema's, so the plan starts from one GPU and a layout that does not fit "
                               "names the single changes that do; decode and prefill default to TP 8]",
                               show_default=False),
        pp: int = typer.Option(1, "--pp"),
        ep: int = typer.Option(1, "--ep"),
        cp: int = typer.Option(1, "--cp"),
        dp: int = typer.Option(1, "--dp"),
        virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages", help="train: model chunks per "
                                                     "pipeline rank [default: 1]"),
        zero_stage: Optional[int] = typer.Option(
            None, "--zero-stage", help=f"train: 0-3, shards over data-parallel replicas [default: {default(Parallelism, 'zero_stage')}]"),
        context: int = typer.Option(131072, "--context", help="serve: tokens per request; train: sequence [default: "
                                    "131072, the default scenario's requests: memory sizes the longest request "
                                    "admitted, where decode's 32768 is a context decoded]", show_default=False),
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
        from k3sim.commands.options import MEMORY, check

        check(MEMORY)  # every option given changes the result (k3sim.commands.options)
        layout = dict(tp=tp, pp=pp, ep=ep, cp=cp, dp=dp, virtual_stages=virtual_stages, zero_stage=zero_stage)
        plan = build_plan(str(model), hardware, mode, layout, context=context, micro_batch=micro_batch,
                          recompute=recompute, prefill_chunk=prefill_chunk,
                          workspace_fraction=workspace_fraction)
        print_plan(plan, json_out)
