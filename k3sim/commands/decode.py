"""`k3sim decode`: TPOT, tokens/s per GPU and what bounds a decode step of K3 (or any shipped model);
`--sweep-batch` writes its table and roofline plot to `--out` (default `./k3sim-out/decode/`)."""

from __future__ import annotations

from typing import Optional

import typer

from k3sim.configs.bounds import option_range


def _result_json(r, hw) -> dict:
    rows = [{"component": x.component, "stage": x.stage, "op": x.op, "bytes": x.bytes, "flops": x.flop,
             "seconds": x.seconds, "source": x.source, "hidden": x.hidden} for x in r.rows]
    return {
        "model_batch": r.batch, "context_tokens": r.context,
        "layout": {"tp": r.layout.tp, "pp": r.layout.pp, "ep": r.layout.ep, "attention_dp": r.layout.attention_dp,
                   "gpus": r.layout.gpus, "convention": r.layout.convention},
        "expected_distinct_experts_per_layer": r.expected_distinct_experts_per_layer,
        "expected_distinct_experts_per_rank": r.expected_distinct_experts_per_rank,
        "bytes_per_step_per_gpu": r.bytes_per_step_per_gpu, "flops_per_step_per_gpu": r.flop_per_step_per_gpu,
        "tpot_s": r.tpot_s, "step_s": r.step_s, "stage_seconds": r.stage_seconds,
        "tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
        "limiter": r.limiter, "expert_kernel": r.expert_kernel,
        "expert_kernels_seconds_per_step": r.expert_kernels, "router_fusion_seconds_per_step": r.router_fusion,
        "max_batch_by_memory": r.max_batch_by_memory, "speculative": r.spec, "breakdown": rows,
        # share of the step's seconds standing on an uncalibrated datasheet roofline (a lower bound: no
        # launch or latency term); 0 on a calibrated profile
        "datasheet_share_of_step": _datasheet_share(r),
    }


def _datasheet_share(r) -> float:
    total = sum(x.seconds for x in r.rows) or 1.0
    return sum(x.seconds for x in r.rows if "datasheet" in x.source) / total


def register(app: typer.Typer) -> None:
    @app.command("decode")
    def decode(
        model: str = typer.Option("models/kimi-k3.yaml", "--model", help="model file (YAML or HF config.json)"),
        hardware: str = typer.Option("h200", "--hardware", help="hardware profile name or path"),
        batch: int = typer.Option(64, "--batch", callback=option_range("batch", "--batch"),
                                  help="sequences per micro-batch (per attention-DP rank)"),
        context: int = typer.Option(32768, "--context", callback=option_range("tokens", "--context"),
                                    help="tokens already in each sequence's context"),
        tp: int = typer.Option(8, "--tp", callback=option_range("parallel", "--tp")),
        pp: int = typer.Option(2, "--pp", callback=option_range("parallel", "--pp")),
        ep: int = typer.Option(8, "--ep", callback=option_range("parallel", "--ep")),
        attention_dp: int = typer.Option(1, "--attention-dp", callback=option_range("parallel", "--attention-dp"),
                                         help="attention data-parallel replicas inside a stage"),
        mtp: int = typer.Option(0, "--mtp", help="MTP draft tokens per step (0: no speculative decoding)"),
        acceptance: Optional[float] = typer.Option(None, "--acceptance", help="per-draft acceptance rate in [0, 1]"),
        rollback: Optional[str] = typer.Option(None, "--rollback", help="KDA state rollback: snapshot or replay"),
        expert_kernel: str = typer.Option("auto", "--expert-kernel",
                                          help="auto, mxfp4_token, grouped_bf16 or grouped_fp8"),
        zipf: float = typer.Option(0.0, "--zipf", help="router skew: Zipf exponent of expert popularity (0 uniform)"),
        convention: str = typer.Option("graph", "--convention", help="graph (one CUDA graph per step) or eager"),
        sweep_batch: bool = typer.Option(False, "--sweep-batch", help="sweep the batch: table + roofline plot"),
        out: Optional[str] = typer.Option(None, "--out", help="directory for --sweep-batch (CSV, PNG): new, empty "
                                          "or a previous decode sweep output [default: ./k3sim-out/decode/]"),
        json_out: bool = typer.Option(False, "--json", help="print JSON (SI units)"),
    ) -> None:
        """Decode step: TPOT, tokens/s per GPU, bytes per step and what limits it (optionally with MTP)."""
        from k3sim.commands.options import DECODE, check

        check(DECODE)  # every option given changes the result (k3sim.commands.options)
        run_decode(model=model, hardware=hardware, batch=batch, context=context, tp=tp, pp=pp, ep=ep,
                   attention_dp=attention_dp, mtp=mtp, acceptance=acceptance, rollback=rollback,
                   expert_kernel=expert_kernel, zipf=zipf, convention=convention, sweep_batch=sweep_batch,
                   out=out, json_out=json_out)


def _check_options(model_cfg, batch, context, mtp, acceptance, rollback, expert_kernel, convention, zipf,
                   sweep_batch, out) -> None:
    from k3sim.errors import InputError
    from k3sim.step.layout import CONVENTIONS, EXPERT_KERNELS

    model_cfg.check_context(context, source="--context")
    from k3sim.kernels.ops import OPS

    # a verify step walks up to 2n + 1 tokens per sequence through the measured multi-token KDA kernel
    # (replay: n + 1 new plus up to n accepted ones); the kernel registry bounds its T
    t_max = OPS["recurrent_kda_decode"].ranges["T"][1]
    max_depth = (t_max - 1) // 2
    if mtp < 0 or mtp > max_depth:
        raise InputError(f"must be in [0, {max_depth}] draft tokens (a verify step walks up to 2n+1 tokens; the "
                         f"KDA decode kernel is modelled up to {t_max}), got {mtp}", source="--mtp")
    if mtp == 0 and (rollback is not None or acceptance is not None):
        which = "--rollback" if rollback is not None else "--acceptance"
        raise InputError("needs --mtp N >= 1 (no draft tokens to verify or roll back)", source=which)
    if mtp > 0 and acceptance is None:
        raise InputError("--mtp needs --acceptance A (per-draft acceptance rate in [0, 1])", source="--acceptance")
    if acceptance is not None and not (0.0 <= acceptance <= 1.0):
        raise InputError(f"must be in [0, 1], got {acceptance}", source="--acceptance")
    if rollback is not None and rollback not in ("snapshot", "replay"):
        raise InputError(f"must be snapshot or replay, got {rollback!r}", source="--rollback")
    if expert_kernel not in EXPERT_KERNELS:
        raise InputError(f"must be one of {', '.join(EXPERT_KERNELS)}, got {expert_kernel!r}", source="--expert-kernel")
    if convention not in CONVENTIONS:
        raise InputError(f"must be graph or eager, got {convention!r}", source="--convention")
    if not (0.0 <= zipf <= 8.0):  # modelling choice: s = 8 already puts ~all picks on the top-k experts
        raise InputError(f"must be in [0, 8] (0 uniform routing), got {zipf}", source="--zipf")
    if out is not None and not sweep_batch:
        raise InputError("--out is only written by --sweep-batch; add --sweep-batch or drop --out", source="--out")


def _layout(model_cfg, tp, pp, ep, attention_dp, expert_kernel, convention, hw=None):
    from k3sim.configs.parallel import Parallelism, check_layout
    from k3sim.errors import InputError
    from k3sim.step import StepLayout

    names = {"tp": "--tp", "pp": "--pp", "ep": "--ep", "dp": "--attention-dp"}
    try:
        par = Parallelism(tp=tp, pp=pp, ep=ep, dp=attention_dp)
        check_layout(model_cfg, par, mode="serve", hardware=hw)
    except InputError as err:
        f = (err.field or "").split(".")[-1]
        raise InputError(err.reason, source=names.get(f, err.source), field=None) from None
    return StepLayout(tp=tp, pp=pp, ep=ep, attention_dp=attention_dp, expert_kernel=expert_kernel,
                      convention=convention)


def run_decode(*, model, hardware, batch, context, tp, pp, ep, attention_dp, mtp, acceptance, rollback,
               expert_kernel, zipf, convention, sweep_batch, out, json_out) -> None:
    from k3sim.configs import load_hardware, load_model
    from k3sim.decode import SpecConfig, decode_step
    from k3sim.output import human_bytes, print_json, print_kv, print_table

    model_cfg = load_model(model)
    hw = load_hardware(hardware)
    _check_options(model_cfg, batch, context, mtp, acceptance, rollback, expert_kernel, convention, zipf,
                   sweep_batch, out)
    layout = _layout(model_cfg, tp, pp, ep, attention_dp, expert_kernel, convention, hw)
    spec = SpecConfig(mtp, acceptance, rollback or "replay") if mtp else None
    if sweep_batch:
        from k3sim.decode.sweep import KIND
        from k3sim.files import check_output_dir, default_out

        out = default_out("decode") if out is None else out
        check_output_dir(out, kind=KIND)  # refused before the sweep runs
        _sweep(model_cfg, hw, layout, context, spec, zipf, out, json_out, source=str(model))
        return
    r = decode_step(model_cfg, hw, layout, batch, context, spec=spec, zipf=zipf)
    data = _result_json(r, hw)
    if json_out:
        print_json(data)
        return
    pairs = [("model", model_cfg.name), ("layout", f"tp={tp} pp={pp} ep={ep} attention_dp={attention_dp} "
                                                    f"({layout.gpus} GPUs), {convention} convention"),
             ("batch x context", f"{batch} x {context:,} tokens"),
             ("TPOT", f"{r.tpot_s * 1e3:.3f} ms"), ("tokens/s per GPU", f"{r.tokens_per_s_per_gpu:,.1f}"),
             ("bytes per step per GPU", human_bytes(r.bytes_per_step_per_gpu)),
             ("distinct experts per layer", f"{r.expected_distinct_experts_per_layer:.1f}"),
             ("expert kernel", r.expert_kernel), ("limiter", r.limiter),
             ("max batch by memory", "weights do not fit" if r.max_batch_by_memory is None
              else f"{r.max_batch_by_memory} per micro-batch ({pp} in flight), every sequence at full context")]
    share = _datasheet_share(r)
    if share > 0:
        pairs.append(("calibration", f"{share:.0%} of the step from the datasheet roofline of an uncalibrated "
                                     f"profile: a lower bound (run k3sim calibrate on this GPU)"))
    if r.spec:
        pairs.append(("speculative", f"MTP {r.spec['depth']} drafts, acceptance {r.spec['acceptance']}, "
                                     f"{r.spec['rollback']}: {r.spec['tokens_per_step']:.2f} tokens/step"))
    print_kv("decode step", pairs)
    agg: dict[str, list] = {}
    for x in r.rows:
        a = agg.setdefault(x.component, [0.0, 0.0, 0.0, x.source])
        a[0] += x.bytes
        a[1] += x.flop
        a[2] += x.seconds
    rows = sorted(agg.items(), key=lambda kv: -kv[1][2])
    print_table("per-step breakdown (all stages, per GPU)", ["component", "bytes", "GFLOP", "ms", "source"],
                [(k, human_bytes(v[0]), f"{v[1] / 1e9:.2f}", f"{v[2] * 1e3:.3f}", v[3]) for k, v in rows])


def _sweep(model_cfg, hw, layout, context, spec, zipf, out, json_out, source="--model") -> None:
    from k3sim.decode.sweep import KIND, roofline_plot, sweep_batches, sweep_table
    from k3sim.files import atomic_write_text, output_dir, safe_name
    from k3sim.output import print_json, print_table

    name = safe_name(model_cfg.name, source=source, field="name")  # it names the files
    stem = f"decode_{name}_tp{layout.tp}_pp{layout.pp}_ep{layout.ep}_ctx{context}"
    results = sweep_batches(model_cfg, hw, layout, context, spec=spec, zipf=zipf)
    df = sweep_table(results, hw)
    # one part per stem: a directory holds the sweeps of several layouts (reports/decode)
    with output_dir(out, kind=KIND, part=stem) as d:
        atomic_write_text(d / f"{stem}.csv", df.to_csv(index=False))
        roofline_plot(df, hw, d / f"{stem}.png", f"{model_cfg.name} decode, tp={layout.tp} pp={layout.pp} "
                                                 f"ep={layout.ep}, context {context:,}")
    if json_out:
        print_json({"csv": str(d / f"{stem}.csv"), "plot": str(d / f"{stem}.png"),
                    "rows": df.to_dict(orient="records")})
        return
    print_table(f"decode sweep ({stem})", ["batch", "TPOT ms", "tok/s/GPU", "roofline", "fits", "expert kernel"],
                [(int(r.batch), f"{r.tpot_s * 1e3:.2f}", f"{r.tokens_per_s_per_gpu:,.1f}", r.roofline,
                  r.fits_memory, r.expert_kernel) for r in df.itertuples()])
