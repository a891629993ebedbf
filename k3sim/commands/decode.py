"""`k3sim decode`: TPOT, tokens/s per GPU and per node and what bounds a decode step of K3 (or any shipped
model), at the layouts of serving at scale (attention DP, wide EP, DeepEP-class all-to-all, two-batch
overlap, redundant experts, MTP); `--sweep-batch` writes its table and roofline plot to `--out` (default
`./k3sim-out/decode/`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from k3sim.configs.bounds import option_range

from k3sim.commands.scale import (EP_KERNEL_NAMES, EP_PARAM_OPTIONS, GPUS_PER_NODE, LAYOUT_OPTIONS,  # noqa: F401
                                  MLA_KERNEL_HELP, TBO_VARIANT_NAMES, ZIPF, ep_errors_named as _ep_errors_named)


def _result_json(r, hw) -> dict:
    rows = [{"component": x.component, "stage": x.stage, "op": x.op, "bytes": x.bytes, "flops": x.flop,
             "seconds": x.seconds, "source": x.source, "hidden": x.hidden} for x in r.rows]
    lay = r.layout
    return {
        "model_batch": r.batch, "batch_per_dp_rank": r.batch, "context_tokens": r.context,
        "layout": {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "attention_dp": lay.attention_dp,
                   "gpus": lay.gpus, "gpus_per_node": lay.gpus_per_node, "convention": lay.convention,
                   "ep_kernel": lay.ep_kernel.replace("_", "-"), "dispatch_dtype": lay.dispatch_dtype,
                   "redundant_experts": lay.redundant_experts, "max_nodes_per_token": lay.max_nodes_per_token,
                   "tbo": lay.tbo, "tbo_variant": lay.tbo_variant, "routing_zipf": lay.routing_zipf,
                   "mla_decode_kernel": lay.mla_decode_kernel},
        "expected_distinct_experts_per_layer": r.expected_distinct_experts_per_layer,
        "expected_distinct_experts_per_rank": r.expected_distinct_experts_per_rank,
        "bytes_per_step_per_gpu": r.bytes_per_step_per_gpu, "flops_per_step_per_gpu": r.flop_per_step_per_gpu,
        "tpot_s": r.tpot_s, "step_s": r.step_s, "stage_seconds": r.stage_seconds,
        "tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
        "tokens_per_s_per_node": r.tokens_per_s_per_node,
        # the step (all stages, one token's path) split: compute + exposed communication = step_s
        "compute_s": r.compute_s, "comm_exposed_s": r.comm_exposed_s, "comm_hidden_s": r.comm_hidden_s,
        "comm_split_source": r.comm_split_source, "expert_load_max_over_mean": r.expert_load_max_over_mean,
        "limiter": r.limiter, "expert_kernel": r.expert_kernel,
        "ep_kernel_used": None if r.ep_kernel_used is None else r.ep_kernel_used.replace("_", "-"),
        "expert_kernels_seconds_per_step": r.expert_kernels, "router_fusion_seconds_per_step": r.router_fusion,
        "max_batch_by_memory": r.max_batch_by_memory, "speculative": r.spec, "breakdown": rows,
        # share of the step's seconds standing on an uncalibrated datasheet roofline (a lower bound: no
        # launch or latency term); 0 on a calibrated profile
        "datasheet_share_of_step": _datasheet_share(r),
    }


def _datasheet_share(r) -> float:
    total = sum(x.seconds for x in r.rows) or 1.0
    return sum(x.seconds for x in r.rows if "datasheet" in x.source) / total


def _redundant(value):
    """--redundant-experts: 0 (none) or a count inside the experts bound."""
    from k3sim.configs.bounds import check_range
    from k3sim.errors import InputError

    if value is None or (isinstance(value, int) and value == 0):
        return value
    if isinstance(value, int) and value < 0:
        raise InputError(f"must be 0 or more redundant expert slots, got {value}", source="--redundant-experts")
    return check_range(value, "experts", "--redundant-experts", integer=True)


def register(app: typer.Typer) -> None:
    from k3sim.commands.options import MODEL_SET

    @app.command("decode")
    def decode(
        model: str = typer.Option("models/kimi-k3.yaml", "--model", help="model file (YAML or HF config.json)"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        hardware: str = typer.Option("h200", "--hardware", help="hardware profile name or path"),
        batch: int = typer.Option(64, "--batch", callback=option_range("batch", "--batch"),
                                  help="sequences per micro-batch (per attention-DP rank)"),
        context: Optional[int] = typer.Option(
            None, "--context", callback=option_range("tokens", "--context"),
            help="tokens already in each sequence's context [default: 32768, or the model's max_context_tokens "
                 "when shorter, with a note]"),
        tp: int = typer.Option(8, "--tp", callback=option_range("parallel", "--tp"),
                               help="tensor-parallel ranks of one attention-DP rank"),
        pp: int = typer.Option(2, "--pp", callback=option_range("parallel", "--pp")),
        ep: Optional[int] = typer.Option(None, "--ep", callback=option_range("parallel", "--ep"),
                                         help="expert-parallel ranks (routed experts spread over them) [default: "
                                              "tp x attention-dp, 1 for a model without MoE]"),
        attention_dp: int = typer.Option(1, "--attention-dp", callback=option_range("parallel", "--attention-dp"),
                                         help="attention data-parallel ranks per stage, each with its own batch "
                                              "(GPUs = tp x attention-dp x pp)"),
        ep_kernel: str = typer.Option("auto", "--ep-kernel", help="EP all-to-all kernel: normal, low-latency, nccl "
                                      "or auto (low-latency in decode)"),
        dispatch_dtype: str = typer.Option("auto", "--dispatch-dtype", help="dispatch dtype: fp8, bf16 or auto (fp8 "
                                           "where the profile has FP8); combine is bf16"),
        redundant_experts: int = typer.Option(0, "--redundant-experts", callback=_redundant,
                                              help="extra expert slots over the EP ranks (EPLB)"),
        max_nodes_per_token: Optional[int] = typer.Option(
            None, "--max-nodes-per-token", callback=option_range("parallel", "--max-nodes-per-token"),
            help="node-limited routing: nodes a token's experts may lie on [default: unlimited]"),
        tbo: bool = typer.Option(False, "--tbo/--no-tbo", help="two-batch overlap: two micro-batches, one's "
                                 "compute against the other's all-to-all"),
        mla_kernel: str = typer.Option("measured", "--mla-kernel", help=MLA_KERNEL_HELP),
        tbo_variant: str = typer.Option("auto", "--tbo-variant", help="with --tbo: overlap (SGLang), five-stage "
                                        "(DeepSeek's decode pipeline) or auto (five-stage in decode)"),
        zipf: float = typer.Option(0.0, "--zipf", "--routing-zipf", help="router skew: Zipf exponent of expert "
                                   "popularity (0 uniform)"),
        mtp: int = typer.Option(0, "--mtp", help="MTP draft tokens per step (0: no speculative decoding)"),
        acceptance: Optional[float] = typer.Option(None, "--acceptance", help="per-draft acceptance rate in [0, 1]"),
        rollback: Optional[str] = typer.Option(None, "--rollback", help="recurrent-state rollback (KDA, GDN, Mamba2, "
                                               "Mamba, lightning layers): snapshot or replay [default: replay]"),
        expert_kernel: str = typer.Option("auto", "--expert-kernel",
                                          help="auto, mxfp4_token, grouped_bf16, grouped_fp8 or deepgemm_fp8"),
        convention: str = typer.Option("graph", "--convention", help="graph (one CUDA graph per step) or eager"),
        sweep_batch: bool = typer.Option(False, "--sweep-batch", help="sweep the batch: table + roofline plot"),
        out: Optional[str] = typer.Option(None, "--out", help="directory for --sweep-batch (CSV, PNG): new, empty "
                                          "or a previous decode sweep output [default: ./k3sim-out/decode/]"),
        json_out: bool = typer.Option(False, "--json", help="print JSON (SI units)"),
    ) -> None:
        """Decode step: TPOT, tokens/s per GPU, bytes per step and what limits it (optionally with MTP).

        At serving-at-scale layouts too (attention DP, wide EP, DeepEP-class all-to-all, two-batch overlap,
        redundant experts): tokens/s per node and the step split into compute, exposed and hidden communication.
        """
        from k3sim.configs import load_model
        from k3sim.commands.options import DECODE, check

        model_cfg = load_model(model)
        ep = default_ep(model_cfg, tp, attention_dp) if ep is None else ep
        # every option given changes the result (k3sim.commands.options)
        check(DECODE, decode_facts(model_cfg, tp=tp, ep=ep, attention_dp=attention_dp))
        run_decode(model=model, hardware=hardware, batch=batch, context=context, tp=tp, pp=pp, ep=ep,
                   attention_dp=attention_dp, mtp=mtp, acceptance=acceptance, rollback=rollback,
                   expert_kernel=expert_kernel, zipf=zipf, convention=convention, sweep_batch=sweep_batch,
                   out=out, json_out=json_out, ep_kernel=ep_kernel, dispatch_dtype=dispatch_dtype,
                   redundant_experts=redundant_experts, max_nodes_per_token=max_nodes_per_token, tbo=tbo,
                   model_cfg=model_cfg, mla_kernel=mla_kernel, tbo_variant=tbo_variant)


DEFAULT_CONTEXT = 32768  # --context when not given (capped to the model's max_context_tokens)


def default_ep(model_cfg, tp: int, attention_dp: int) -> int:
    """--ep when not given: the routed experts spread over every GPU of a stage (tp x attention-dp, the layout
    the earlier default 8 at tp 8 spelled), 1 for a model without MoE (a dense model refuses ep > 1)."""
    return tp * attention_dp if model_cfg.moe is not None else 1


def default_context(model_cfg, context: int | None) -> tuple[int, str | None]:
    """(--context, note): a given context is kept (over the model's maximum it is refused later, by
    `check_context`); the default 32,768 is capped to the model's max_context_tokens (Nemotron-H-56B: 8,192)
    with a note saying so, so `k3sim decode --model M` works for every model."""
    if context is not None:
        return context, None
    lim = model_cfg.max_context_tokens
    if lim is not None and lim < DEFAULT_CONTEXT:
        return lim, (f"--context not given: the default {DEFAULT_CONTEXT:,} tokens exceeds the {lim:,} "
                     f"{model_cfg.name} supports (max_context_tokens), so the context is {lim:,}")
    return DEFAULT_CONTEXT, None


def decode_facts(model_cfg, *, tp: int, ep: int, attention_dp: int, gpus_per_node: int = GPUS_PER_NODE) -> dict:
    """What the DECODE option rules read: recurrent layers (the ones MTP rolls back), whether the layout
    runs an EP all-to-all (attention DP ranks meet in experts spread over more than one rank), and the nodes
    an EP group spans."""
    import math

    from k3sim.configs.kinds import MIXERS
    from k3sim.step import StepLayout
    from k3sim.step.layers import dispatches

    recurrent = sum(model_cfg.num_layers_with(k) for k in model_cfg.mixer_kinds if MIXERS[k].recurrent)
    return {"recurrent_layers": recurrent,
            "model": model_cfg.name, "moe": model_cfg.moe is not None, "mla_layers": model_cfg.num_mla_layers,
            "ep_all_to_all": dispatches(StepLayout(tp=tp, ep=ep, attention_dp=attention_dp)), "ep": ep,
            "gpus_per_node": gpus_per_node, "ep_nodes": math.ceil(ep / gpus_per_node)}


def _max_depth(model_cfg, layout, expert_kernel: str = "grouped_bf16") -> tuple[int, str]:
    """The most MTP drafts the kernel registry prices: n + 1 stays within the tokens one sequence feeds a
    decode step (the bounds table's `decode_tokens`: beyond, it is a prefill); a recurrent kind whose decode
    op has a token axis (KDA) walks up to 2n + 1 tokens per sequence in a replay verify (n + 1 new plus up
    to n accepted), within the op's T range; an attention kind's decode call at n + 1 query tokens (MLA
    folds them into its head axis) stays within its op's ranges. A one-token recurrent op walks its tokens
    as sequential calls (`k3sim.decode.rollback`) and sets no limit."""
    from k3sim.configs.bounds import BOUNDS
    from k3sim.configs.kinds import MIXERS
    from k3sim.decode.rollback import recurrent_call
    from k3sim.kernels.ops import OPS

    per_seq = int(BOUNDS["decode_tokens"].hi)
    limits = [(per_seq - 1, f"a verify feeds n+1 tokens per sequence, at most {per_seq} in a decode step")]
    for kind in model_cfg.mixer_kinds:
        title = MIXERS[kind].title
        if MIXERS[kind].recurrent:
            op = recurrent_call(model_cfg, kind, layout, 1, 1, expert_kernel).op
            if op in OPS and "T" in OPS[op].params:
                t_max = OPS[op].ranges["T"][1]
                limits.append(((t_max - 1) // 2, f"a verify step walks up to 2n+1 tokens; the {title} decode "
                                                 f"kernel is modelled up to {t_max} ({op})"))
        else:
            limits.append(_attention_depth(model_cfg, kind, layout, expert_kernel, per_seq))
    return min(limits)


def _out_of_range(model_cfg, kind: str, layout, expert_kernel: str, tokens: int) -> tuple[str, str, int] | None:
    """(op, parameter, its upper end) of the first decode-attention parameter of a `kind` layer out of its
    op's range at `tokens` query tokens per sequence; None if all are in range."""
    from k3sim.kernels.ops import OPS
    from k3sim.step import Batch
    from k3sim.step.layers import layer_calls

    layer = next(ly.index for ly in model_cfg.layers if kind in ly.mixers)
    for c in layer_calls(model_cfg, layer, layout, Batch.decode(1, 1, tokens), expert_kernel):
        if c.component.endswith("_decode_attention") and c.op in OPS:
            for name, value in c.params.items():
                lo, hi = OPS[c.op].ranges.get(name, (value, value))
                if not lo <= value <= hi:
                    return c.op, name, hi
    return None


def _attention_depth(model_cfg, kind: str, layout, expert_kernel: str, per_seq: int) -> tuple[int, str]:
    """The most drafts whose n + 1 query tokens keep a `kind` layer's decode attention in its op's ranges
    (found by bisection: the folded shape grows with n)."""
    from k3sim.configs.kinds import MIXERS

    if _out_of_range(model_cfg, kind, layout, expert_kernel, per_seq) is None:
        return per_seq - 1, ""
    lo, hi = 0, per_seq - 1  # n = lo is in range (one token), n = hi is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _out_of_range(model_cfg, kind, layout, expert_kernel, mid + 1) is None else (lo, mid)
    op, name, top = _out_of_range(model_cfg, kind, layout, expert_kernel, hi + 1)
    return lo, (f"{MIXERS[kind].title} verification folds n+1 query tokens into the decode kernel's {name}; "
                f"{op} is modelled up to {name}={top}")


def _check_mtp(model_cfg, layout, mtp: int) -> None:
    """--mtp within what the kernel registry prices for this model and layout (`_max_depth`)."""
    from k3sim.errors import InputError

    if mtp <= 0:  # a negative count is refused by _check_options
        return
    max_depth, why = _max_depth(model_cfg, layout, layout.expert_kernel if layout.expert_kernel != "auto"
                                else "grouped_bf16")
    if mtp > max_depth:
        raise InputError(f"must be in [0, {max_depth}] draft tokens ({why}), got {mtp}", source="--mtp")


def _check_options(model_cfg, batch, context, mtp, acceptance, rollback, expert_kernel, convention, zipf,
                   sweep_batch, out, ep_kernel="auto", dispatch_dtype="auto") -> None:
    from k3sim.configs.bounds import check_range
    from k3sim.errors import InputError
    from k3sim.step.layout import CONVENTIONS, DISPATCH_DTYPES, EXPERT_KERNELS

    model_cfg.check_context(context, source="--context")
    if mtp < 0:
        raise InputError(f"must be 0 or more draft tokens, got {mtp}", source="--mtp")
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
    if ep_kernel not in EP_KERNEL_NAMES:
        raise InputError(f"must be normal, low-latency, nccl or auto, got {ep_kernel!r}", source="--ep-kernel")
    if dispatch_dtype not in DISPATCH_DTYPES:
        raise InputError(f"must be fp8, bf16 or auto, got {dispatch_dtype!r}", source="--dispatch-dtype")
    check_range(zipf, "zipf_exponent", ZIPF)
    if out is not None and not sweep_batch:
        raise InputError("--out is only written by --sweep-batch; add --sweep-batch or drop --out", source="--out")


def _layout(model_cfg, tp, pp, ep, attention_dp, expert_kernel, convention, hw=None, **scale):
    """The StepLayout of the options: the scenario schema's `Parallelism` they spell (serving-at-scale fields
    given only where they differ from the default), checked by the one layout check (`check_layout`, on a
    cluster of this replica's GPUs in nodes of 8) and turned into the step's layout
    (`StepLayout.from_parallelism`); every refusal names the option that set the field."""
    from k3sim.commands.scale import checked_layout

    unset = {"redundant_experts": 0, "ep_kernel": "auto", "dispatch_dtype": "auto", "max_nodes_per_token": None,
             "tbo": False, "routing_zipf": 0.0, "mla_decode_kernel": "measured", "tbo_variant": "auto"}
    given = {k: v for k, v in scale.items() if v != unset[k]}
    return checked_layout(model_cfg, hw, given, tp=tp, pp=pp, ep=ep, attention_dp=attention_dp,
                          expert_kernel=expert_kernel, convention=convention)[1]


def run_decode(*, model, hardware, batch, context, tp, pp, ep, attention_dp, mtp, acceptance, rollback,
               expert_kernel, zipf, convention, sweep_batch, out, json_out, ep_kernel="auto", dispatch_dtype="auto",
               redundant_experts=0, max_nodes_per_token=None, tbo=False, model_cfg=None, given=None,
               mla_kernel="measured", tbo_variant="auto") -> None:
    from k3sim.configs import load_hardware, load_model
    from k3sim.decode import SpecConfig, decode_step
    from k3sim.output import print_json

    model_cfg = model_cfg or load_model(model)
    hw = load_hardware(hardware)
    ep = default_ep(model_cfg, tp, attention_dp) if ep is None else ep
    context, context_note = default_context(model_cfg, context)
    _check_options(model_cfg, batch, context, mtp, acceptance, rollback, expert_kernel, convention, zipf,
                   sweep_batch, out, ep_kernel=ep_kernel, dispatch_dtype=dispatch_dtype)
    layout = _layout(model_cfg, tp, pp, ep, attention_dp, expert_kernel, convention, hw,
                     ep_kernel=EP_KERNEL_NAMES[ep_kernel], dispatch_dtype=dispatch_dtype,
                     redundant_experts=redundant_experts, max_nodes_per_token=max_nodes_per_token, tbo=tbo,
                     routing_zipf=float(zipf), mla_decode_kernel=mla_kernel,
                     tbo_variant=TBO_VARIANT_NAMES.get(tbo_variant, tbo_variant))
    _check_mtp(model_cfg, layout, mtp)
    spec = SpecConfig(mtp, acceptance, rollback or "replay") if mtp else None
    if sweep_batch:
        from k3sim.files import check_output_dir, default_out

        from k3sim.decode.sweep import KIND

        out = default_out("decode") if out is None else out
        check_output_dir(out, kind=KIND)  # refused before the sweep runs
        with _ep_errors_named(_given() if given is None else given):
            _sweep(model_cfg, hw, layout, context, spec, zipf, out, json_out, source=str(model),
                   context_note=context_note)
        return
    with _ep_errors_named(_given() if given is None else given):
        r = decode_step(model_cfg, hw, layout, batch, context, spec=spec, zipf=zipf)
    from k3sim.planner.bands import decode_band

    band = decode_band(hw, model_cfg, r)  # the step model's measured whole-step errors (issue 24 item 4)
    if json_out:
        print_json({**_result_json(r, hw), **band, "context_note": context_note})
        return
    _print_result(r, model_cfg, context_note, band)


def _given() -> dict[str, str]:
    """The options the user wrote (primary name -> form), or none outside a running command."""
    from k3sim.commands.options import given_options

    try:
        return given_options()[0]
    except RuntimeError:
        return {}


def _print_result(r, model_cfg, context_note: str | None = None, band: dict | None = None) -> None:
    from k3sim.output import human_bytes, print_kv, print_table

    lay = r.layout
    used = "none" if r.ep_kernel_used is None else r.ep_kernel_used.replace("_", "-")
    scale = [f"all-to-all={used}", f"dispatch={lay.dispatch_dtype}"]
    scale += [f"redundant={lay.redundant_experts}"] if lay.redundant_experts else []
    scale += [f"max_nodes={lay.max_nodes_per_token}"] if lay.max_nodes_per_token else []
    scale += ["tbo"] if lay.tbo else []
    hidden = "not split by the step model" if r.comm_hidden_s is None else f"{r.comm_hidden_s * 1e3:.3f} ms"
    load = "-" if r.expert_load_max_over_mean is None else f"{r.expert_load_max_over_mean:.3f}"
    pairs = [("model", model_cfg.name),
             ("layout", f"tp={lay.tp} pp={lay.pp} ep={lay.ep} attention_dp={lay.attention_dp} ({lay.gpus} GPUs), "
                        f"{' '.join(scale)}, {lay.convention} convention"),
             ("batch per DP rank x context", f"{r.batch} x {r.context:,} tokens"),
             *([("context note", context_note)] if context_note else []),
             ("TPOT", f"{r.tpot_s * 1e3:.3f} ms" + _band_words(band, "tpot_s", 1e3, " ms", ".3f", True)),
             ("tokens/s per GPU", f"{r.tokens_per_s_per_gpu:,.1f}" + _band_words(band, "tokens_per_s_per_gpu")),
             (f"tokens/s per node ({lay.gpus_per_node} GPUs)", f"{r.tokens_per_s_per_node:,.1f}"),
             ("step: compute / exposed comm / hidden comm",
              f"{r.compute_s * 1e3:.3f} ms / {r.comm_exposed_s * 1e3:.3f} ms / {hidden}"),
             ("expert load max/mean", load),
             ("bytes per step per GPU", human_bytes(r.bytes_per_step_per_gpu)),
             ("distinct experts per layer", f"{r.expected_distinct_experts_per_layer:.1f}"),
             ("expert kernel", r.expert_kernel), ("limiter", r.limiter),
             ("max batch by memory", "weights do not fit" if r.max_batch_by_memory is None
              else f"{r.max_batch_by_memory} per micro-batch ({lay.pp} in flight), every sequence at full context")]
    share = _datasheet_share(r)
    if share > 0:
        pairs.append(("calibration", f"{share:.0%} of the step from the datasheet roofline of an uncalibrated "
                                     f"profile: a lower bound (run k3sim calibrate on this GPU)"))
    if r.spec:
        pairs.append(("speculative", f"MTP {r.spec['depth']} drafts ({r.spec['draft_s'] * 1e3:.3f} ms), acceptance "
                                     f"{r.spec['acceptance']}, {r.spec['rollback']}: "
                                     f"{r.spec['tokens_per_step']:.2f} tokens/step"))
    print_kv("decode step", pairs)
    if r.spec:
        _print_rollback(r.spec)
    agg: dict[str, list] = {}
    for x in r.rows:
        a = agg.setdefault(x.component, [0.0, 0.0, 0.0, x.source])
        a[0] += x.bytes
        a[1] += x.flop
        a[2] += x.seconds
    rows = sorted(agg.items(), key=lambda kv: -kv[1][2])
    print_table("per-step breakdown (all stages, per GPU)", ["component", "bytes", "GFLOP", "ms", "source"],
                [(k, human_bytes(v[0]), f"{v[1] / 1e9:.2f}", f"{v[2] * 1e3:.3f}", v[3]) for k, v in rows])


def _band_words(band: dict | None, key: str, scale: float = 1.0, unit: str = "", fmt: str = ",.1f",
                source: bool = False) -> str:
    """` (band LOW-HIGH UNIT[ from CHECKS])` of a figure, from `planner.bands.decode_band`'s fields."""
    if not band or band.get(f"{key}_low") is None:
        return " (no band: no whole-step decode check)" if source else ""
    lo, hi = band[f"{key}_low"] * scale, band[f"{key}_high"] * scale
    return f" (band {lo:{fmt}}-{hi:{fmt}}{unit}" + (f" from {band['band']['source']})" if source else ")")


def _print_rollback(spec: dict) -> None:
    """The MTP rollback of each mixer kind: scheme, bytes per step (per GPU, every layer of the kind), seconds."""
    from k3sim.output import human_bytes, print_table

    rows = [(k["kind"], k["layers"], k["scheme"], human_bytes(k["state_bytes_per_sequence"]),
             human_bytes(k["snapshot_bytes_per_step"]), human_bytes(k["projection_cache_bytes_per_step"]),
             "-" if k["recurrent_tokens_per_sequence"] is None else k["recurrent_tokens_per_sequence"],
             f"{k['seconds_per_step'] * 1e3:.3f}") for k in spec["rollback_by_kind"]]
    print_table("MTP rollback per layer kind (per GPU and step, every layer of the kind; state: one sequence "
                "and layer)", ["kind", "layers", "scheme", "state", "snapshots", "inputs", "walked", "ms"], rows)


def _sweep(model_cfg, hw, layout, context, spec, zipf, out, json_out, source="--model",
           context_note: str | None = None) -> None:
    from k3sim.decode.sweep import DEFAULT_BATCHES, KIND, roofline_plot, sweep_batches, sweep_table
    from k3sim.files import atomic_write_text, output_dir, safe_name
    from k3sim.output import print_json, print_table, progress

    name = safe_name(model_cfg.name, source=source, field="name")  # it names the files
    dp = f"_dp{layout.attention_dp}" if layout.attention_dp > 1 else ""
    stem = f"decode_{name}_tp{layout.tp}_pp{layout.pp}_ep{layout.ep}{dp}_ctx{context}"
    results = []
    with progress(f"decode sweep ({len(DEFAULT_BATCHES)} batches)", len(DEFAULT_BATCHES), enabled=not json_out) as tick:
        for i, b in enumerate(DEFAULT_BATCHES):  # one batch at a time: the bar moves as each is priced
            results += sweep_batches(model_cfg, hw, layout, context, batches=[b], spec=spec, zipf=zipf)
            tick(i + 1)
    df = sweep_table(results, hw)
    # one part per stem: a directory holds the sweeps of several layouts (reports/decode)
    with output_dir(out, kind=KIND, part=stem) as d:
        atomic_write_text(d / f"{stem}.csv", df.to_csv(index=False))
        roofline_plot(df, hw, d / f"{stem}.png", f"{model_cfg.name} decode, tp={layout.tp} pp={layout.pp} "
                                                 f"ep={layout.ep}, context {context:,}")
    if json_out:
        print_json({"csv": str(d / f"{stem}.csv"), "plot": str(d / f"{stem}.png"),
                    "rows": df.to_dict(orient="records"), "context_note": context_note})
        return
    title = f"decode sweep ({stem})" + (f"; {context_note}" if context_note else "")
    print_table(title, ["batch", "TPOT ms", "tok/s/GPU", "roofline", "fits", "expert kernel"],
                [(int(r.batch), f"{r.tpot_s * 1e3:.2f}", f"{r.tokens_per_s_per_gpu:,.1f}", r.roofline,
                  r.fits_memory, r.expert_kernel) for r in df.itertuples()])
