"""`k3sim pipeline`: step time, bubble and encoder hiding of one pipeline layout (discrete-event)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    from k3sim.commands.options import MODEL_SET

    @app.command("pipeline")
    def pipeline(
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        stages: int = typer.Option(8, "--stages", help="Pipeline stages (devices) p."),
        virtual: int = typer.Option(1, "--virtual", help="Model chunks per stage v (interleaved-1f1b)."),
        microbatches: int = typer.Option(16, "--microbatches", help="Micro-batches per step m."),
        schedule: str = typer.Option("1f1b", "--schedule", help="gpipe | 1f1b | interleaved-1f1b | zb-h1 | dualpipe | dualpipev."),
        uniform_costs: Optional[str] = typer.Option(
            None, "--uniform-costs", help="F,B or F,B,W seconds of one micro-batch on one stage (overrides the model)."),
        encoder_policy: str = typer.Option("bubble", "--encoder-policy", help="none | serial | decoupled | bubble."),
        encoder_cost: Optional[float] = typer.Option(
            None, "--encoder-cost", help="Encoder forward of one micro-batch in stage forwards [default: from the model]."),
        encoder_cp: str = typer.Option("dynamic", "--encoder-cp", help="Encoder CP: none | fixed | dynamic."),
        images: float = typer.Option(2.0, "--images-per-microbatch", help="Mean images per micro-batch (sampler)."),
        seed: int = typer.Option(0, "--seed", help="Image-size sampler seed."),
        upfront: Optional[int] = typer.Option(None, "--encoder-upfront",
                                              help="bubble: encodes run up front [default: stages]."),
        model: str = typer.Option("models/kimi-k3.yaml", "--model", help="Model YAML or HF config.json."),
        hardware: str = typer.Option("h200", "--hardware", help="Hardware profile name or path."),
        tp: int = typer.Option(8, "--tp", help="TP degree of a stage (its GPUs run the encoder)."),
        ep: int = typer.Option(8, "--ep", help="EP degree inside a stage."),
        cp: int = typer.Option(1, "--cp", help="Text CP degree of a stage."),
        mb_tokens: int = typer.Option(4096, "--microbatch-tokens", help="Tokens per micro-batch."),
        seq_len: int = typer.Option(4096, "--seq-len", help="Tokens per sequence."),
        attn_res_cache: bool = typer.Option(True, "--attn-res-cache/--no-attn-res-cache",
                                            help="Hops carry only unseen AttnRes blocks."),
        gantt: Optional[Path] = typer.Option(None, "--gantt", help="Write the Gantt chart (PNG)."),
        trace: Optional[Path] = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace (JSON); '-': to "
                                             "stdout, and nothing else is printed."),
        as_json: bool = typer.Option(False, "--json", help="Stable JSON, SI units."),
    ) -> None:
        """Simulate a pipeline schedule: step time, bubble ratio, idle per stage, encoder hidden share."""
        from k3sim.pipeline import LayoutSpec, parse_uniform_costs, simulate_layout

        from k3sim.errors import InputError

        from k3sim.files import check_output_file

        # refused before any work is done: a device, FIFO, socket, link or directory is never replaced
        if gantt is not None:
            check_output_file(gantt, source="--gantt")  # a PNG cannot go to stdout
        if trace is not None and check_output_file(trace, source="--trace", stdout_ok=True) is None and as_json:
            raise InputError("'-' sends the trace to stdout, where --json goes too; give a file or drop --json",
                             source="--trace")
        if gantt is not None and trace is not None and str(trace) != "-" and \
                Path(gantt).absolute() == Path(trace).absolute():
            raise InputError("is the --gantt path too; give two files", source="--trace")
        uni = parse_uniform_costs(uniform_costs) if uniform_costs is not None else None
        spec = LayoutSpec(schedule=schedule, stages=stages, virtual=virtual, microbatches=microbatches,
                          uniform=uni, encoder_policy=encoder_policy, encoder_cost=encoder_cost,
                          encoder_cp=encoder_cp, images_per_microbatch=images, seed=seed, tp=tp, ep=ep, cp=cp,
                          microbatch_tokens=mb_tokens, seq_len=seq_len, attn_res_cache=attn_res_cache,
                          upfront=upfront)
        need_model = uni is None or (encoder_policy != "none" and encoder_cost is None)
        from k3sim.commands.options import PIPELINE, check
        from k3sim.pipeline.run import check_spec

        # every option given changes the result, every number in range, the work bounded: before the model loads
        check(PIPELINE, {"model_used": need_model,
                         "encoder_from_model": encoder_policy != "none" and encoder_cost is None})
        check_spec(spec)
        m = hw = None
        if need_model:
            from k3sim.configs import load_hardware, load_model

            m, hw = load_model(model), load_hardware(hardware)
        res = simulate_layout(spec, m, hw, keep_timeline=bool(gantt or trace))
        files = _write_files(res, gantt, trace, schedule=schedule, stages=stages, virtual=virtual,
                             microbatches=microbatches)
        if trace and str(trace) == "-":
            return  # stdout carries the trace alone
        _print_result(res, files, as_json, schedule=schedule, stages=stages, virtual=virtual,
                      microbatches=microbatches)


def _write_files(res, gantt, trace, *, schedule: str, stages: int, virtual: int, microbatches: int) -> dict:
    """The Gantt chart and the Perfetto trace the options ask for; returns what was written, by kind."""
    files = {}
    if gantt:
        from k3sim.pipeline.trace import write_gantt

        files["gantt"] = str(write_gantt(res.timeline, gantt, title=(
            f"{schedule} p={stages} v={virtual} m={microbatches}, encoder {res.encoder_policy}: "
            f"step {res.step_time_s:.4g} s, bubble {res.bubble_ratio:.3f}")))
    if trace:
        from k3sim.pipeline.trace import write_perfetto

        files["trace"] = str(write_perfetto(res.timeline, trace))
    return files


def _print_result(res, files: dict, as_json: bool, *, schedule: str, stages: int, virtual: int,
                  microbatches: int) -> None:
    """The layout's step time, bubble and encoder hiding, then per stage busy / idle / in-flight and the
    AttnRes hand-off saving (or all of it as JSON)."""
    from k3sim.output import human_bytes, human_seconds, print_json, print_kv, print_table

    out = res.to_json()
    out["files"] = files
    if as_json:
        print_json(out)
        return
    share = res.encoder_hidden_share
    print_kv(f"{schedule}: p={stages}, v={virtual}, m={microbatches}, encoder {res.encoder_policy}", [
        ("step time", human_seconds(res.step_time_s)),
        ("text-only step time", human_seconds(res.text_step_time_s)),
        ("bubble ratio (bubble / ideal)", f"{res.bubble_ratio:.4f} (text only {res.text_bubble_ratio:.4f})"),
        ("encoder hidden share", "-" if share is None else f"{share:.1%}"),
        ("costs", res.costs_source),
    ] + [(k, v) for k, v in files.items()])
    print_table("per stage", ["stage", "busy", "idle", "encoder", "peak in-flight", "planner in-flight",
                              "activations"],
                [(s.device, human_seconds(s.busy_s), human_seconds(s.idle_s), human_seconds(s.encoder_busy_s),
                  f"{s.peak_in_flight:g}", f"{s.planner_in_flight:g}",
                  "-" if s.peak_activation_bytes is None else human_bytes(s.peak_activation_bytes))
                 for s in res.stage])
    a = res.extra.get("attn_res")
    if a:
        print_kv("AttnRes hand-off per micro-batch (forward; backward the same)", [
            ("resend all blocks", human_bytes(a["resend_all_bytes_per_microbatch"])),
            ("cache-based", human_bytes(a["cached_bytes_per_microbatch"])),
            ("saved", human_bytes(a["saved_bytes_per_microbatch"]))])
