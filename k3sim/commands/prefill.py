"""`k3sim prefill`: time to first token of one prompt of N tokens, with a cached prefix of P tokens, prefilled in
chunks of C tokens on one replica of a serving layout, and where that time goes.

The same step model serving uses (`k3sim.step.forward_step`; the serving fast path `serving.stepcost` is fitted to
it): each chunk is one engine step whose batch is that chunk alone (`Batch(prefill=((c, p),))`), attending to the
cached prefix and the earlier chunks (p = P + the chunks before it), with the model's expert kernel, the layout's
sharding and its communication. The chunks run back to back, so TTFT is the sum of their steps (each step one
token's path through every pipeline stage); chunks of one request are not overlapped across stages, as a serving
replica without pipeline micro-batches runs them (`serving.engine`, `pp_microbatches` off). A request alone on the
replica: no queueing, no decodes sharing its steps (`k3sim serve` adds both). With `--attention-dp N` every DP
rank prefills a prompt like this one at the same time (the step model's uniform load over DP ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import typer

from k3sim.configs.bounds import option_range

# Chunks timed one by one (~7 ms of Python each once the kernels are predicted: 4096 chunks ~30 s); a modelling
# choice of this command, so a 1-token chunk over a 1M prompt is refused in one line instead of running for hours.
MAX_CHUNKS = 4096


def chunk_plan(prompt: int, cached: int, chunk: int) -> list[tuple[int, int]]:
    """(chunk tokens, cached prefix tokens) of each step: the prompt's uncached tokens in chunks of `chunk`, each
    after the prefix and every earlier chunk (the last chunk takes what is left)."""
    out, done = [], cached
    while done < prompt:
        c = min(chunk, prompt - done)
        out.append((c, done))
        done += c
    return out


def check_request(model: Any, prompt: int, cached: int, chunk: int) -> None:
    """The prompt fits the model's context, and `check_chunks`."""
    model.check_context(prompt, source="--prompt")
    check_chunks(prompt, cached, chunk)


def check_chunks(prompt: int, cached: int, chunk: int) -> None:
    """The prefix leaves at least one token to prefill (the first output token needs a forward of the prompt's
    last token); the chunk is at least one token and the chunk count stays under MAX_CHUNKS."""
    from k3sim.errors import InputError

    if chunk < 1:
        raise InputError(f"must be at least 1 token, got {chunk}", source="--chunk")
    if cached < 0:
        raise InputError(f"must be 0 or more tokens, got {cached}", source="--cached")
    if cached >= prompt:
        raise InputError(f"{cached:,} cached tokens of a {prompt:,}-token prompt leave nothing to prefill (the first "
                         "token needs a forward of at least the last prompt token): give --cached below --prompt",
                         source="--cached")
    chunks = -(-(prompt - cached) // chunk)
    if chunks > MAX_CHUNKS:
        raise InputError(f"{prompt - cached:,} tokens in chunks of {chunk:,} are {chunks:,} steps; at most "
                         f"{MAX_CHUNKS:,} are timed: raise --chunk to at least {-(-(prompt - cached) // MAX_CHUNKS):,}",
                         source="--chunk")


@dataclass
class PrefillResult:
    """TTFT and its parts: `steps` (chunk tokens, prefix tokens, seconds, limiter) in order; `rows` per step
    component summed over chunks and stages ({component, category, op, seconds, bytes, flops, source})."""

    ttft_s: float
    steps: list[dict]
    rows: list[dict]
    comm_exposed_s: float
    comm_hidden_s: float
    expert_kernel: str
    layout: Any
    extras: dict = field(default_factory=dict)

    def by_category(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.rows:
            out[r["category"]] = out.get(r["category"], 0.0) + r["seconds"]
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def prefill_ttft(model: Any, hw: Any, layout: Any, prompt: int, cached: int = 0, chunk: int = 8192, *,
                 kernel_time: Any = None) -> PrefillResult:
    """TTFT of one prompt on `layout` (a `StepLayout`): one `forward_step` per chunk of `chunk_plan`, one
    `Timer` shared by all of them (each kernel shape predicted once)."""
    from k3sim.step import Batch, Timer, forward_step
    from k3sim.step.forward import category

    check_request(model, prompt, cached, chunk)
    timer = Timer(hw, kernel_time, layout.convention)
    steps, agg, exposed, hidden, kernel, layout_used = [], {}, 0.0, 0.0, "none", layout
    for c, p in chunk_plan(prompt, cached, chunk):
        res = forward_step(model, hw, layout, Batch(prefill=((c, p),)), timer=timer)
        steps.append({"chunk_tokens": c, "prefix_tokens": p, "seconds": res.seconds, "limiter": res.limiter})
        exposed += res.extras.get("comm_exposed_s", 0.0)
        hidden += res.extras.get("comm_hidden_s", 0.0)
        kernel, layout_used = res.expert_kernel, res.layout
        for r in res.rows:
            a = agg.setdefault(r.component, {"component": r.component, "category": category(r.component, r.op),
                                             "op": r.op, "seconds": 0.0, "bytes": 0.0, "flops": 0.0,
                                             "source": r.source})
            a["seconds"] += r.seconds
            a["bytes"] += r.bytes
            a["flops"] += r.flop
    rows = sorted(agg.values(), key=lambda r: -r["seconds"])
    return PrefillResult(sum(s["seconds"] for s in steps), steps, rows, exposed, hidden, kernel, layout_used)


def serving_layout(model: Any, hw: Any, *, tp: int, pp: int, ep: int, attention_dp: int = 1,
                   expert_kernel: str = "auto", convention: str = "graph", **scale: Any):
    """(Parallelism, StepLayout) of the layout options, through the one layout check (`check_layout`, mode serve,
    on a cluster of this replica's GPUs in nodes of 8); a refusal names the option that set the field
    (`commands.scale.LAYOUT_OPTIONS`). `scale`: serving-at-scale `Parallelism` fields (ep_kernel, ...)."""
    from k3sim.commands.scale import checked_layout, layout_overrides
    from k3sim.errors import InputError
    from k3sim.step.layout import CONVENTIONS, EXPERT_KERNELS

    if expert_kernel not in EXPERT_KERNELS:
        raise InputError(f"must be one of {', '.join(EXPERT_KERNELS)}, got {expert_kernel!r}", source="--expert-kernel")
    if convention not in CONVENTIONS:
        raise InputError(f"must be graph or eager, got {convention!r}", source="--convention")
    given = {k: v for k, v in layout_overrides(**scale).items() if v != "auto"}
    return checked_layout(model, hw, given, tp=tp, pp=pp, ep=ep, attention_dp=attention_dp,
                          expert_kernel=expert_kernel, convention=convention)


def memory_at(model: Any, hw: Any, par: Any, context: int, chunk: int) -> dict:
    """Whether the layout holds the weights and one request of `context` tokens (`memory.plan.serve_plan`): the
    most concurrent requests of that length, or the refusal's reason."""
    from k3sim.errors import DoesNotFit
    from k3sim.memory.plan import serve_plan

    try:
        plan = serve_plan(model, hw, par, context, prefill_chunk_tokens=chunk)
    except DoesNotFit as err:
        return {"fits": False, "max_concurrent_requests": 0, "detail": err.reason}
    return {"fits": plan.max_concurrent_requests >= 1, "max_concurrent_requests": plan.max_concurrent_requests,
            "detail": f"{plan.max_concurrent_requests} requests of {context:,} tokens fit per replica"}


def default_chunk() -> int:
    """The serving default (`Workload.prefill_chunk_tokens`): the one place it is written is the schema."""
    from k3sim.configs.parallel import Workload

    return int(Workload.model_fields["prefill_chunk_tokens"].default)


def result_json(model: Any, hw: Any, res: PrefillResult, prompt: int, cached: int, chunk: int, memory: dict) -> dict:
    lay = res.layout
    total = res.ttft_s or 1.0
    return {
        "model": model.name, "hardware": hw.name,
        "layout": {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "attention_dp": lay.attention_dp, "gpus": lay.gpus,
                   "convention": lay.convention, "ep_kernel": lay.ep_kernel.replace("_", "-"),
                   "dispatch_dtype": lay.dispatch_dtype},
        "prompt_tokens": prompt, "cached_tokens": cached, "chunk_tokens": chunk,
        "prefilled_tokens": prompt - cached, "num_chunks": len(res.steps),
        "ttft_s": res.ttft_s, "prefill_tokens_per_s": (prompt - cached) / res.ttft_s if res.ttft_s else None,
        "comm_exposed_s": res.comm_exposed_s, "comm_hidden_s": res.comm_hidden_s, "expert_kernel": res.expert_kernel,
        "by_category": [{"category": k, "seconds": v, "share": v / total} for k, v in res.by_category().items()],
        "memory": memory, "chunks": res.steps, "breakdown": res.rows,
    }


SHOWN_CHUNKS = 12  # chunks listed in the table view (first and last halves); --json lists every one


def print_result(data: dict) -> None:
    from k3sim.output import human_bytes, print_kv, print_table

    lay = data["layout"]
    pairs = [("model", data["model"]), ("hardware", data["hardware"]),
             ("layout", f"tp={lay['tp']} pp={lay['pp']} ep={lay['ep']} attention_dp={lay['attention_dp']} "
                        f"({lay['gpus']} GPUs), {lay['convention']} convention"),
             ("prompt / cached / prefilled", f"{data['prompt_tokens']:,} / {data['cached_tokens']:,} / "
                                             f"{data['prefilled_tokens']:,} tokens"),
             ("chunks", f"{data['num_chunks']} of up to {data['chunk_tokens']:,} tokens, back to back"),
             ("TTFT", f"{data['ttft_s'] * 1e3:,.2f} ms"),
             ("prefill tokens/s (per replica)", f"{data['prefill_tokens_per_s']:,.0f}"),
             ("communication exposed / hidden", f"{data['comm_exposed_s'] * 1e3:,.2f} ms / "
                                                f"{data['comm_hidden_s'] * 1e3:,.2f} ms"),
             ("expert kernel", data["expert_kernel"]), ("memory", data["memory"]["detail"])]
    print_kv("prefill (one request alone on the replica)", pairs)
    print_table("TTFT by category (all chunks and stages, per GPU)", ["category", "ms", "share"],
                [(c["category"], f"{c['seconds'] * 1e3:,.2f}", f"{c['share']:.1%}") for c in data["by_category"]])
    print_table("largest components", ["component", "category", "ms", "bytes", "source"],
                [(r["component"], r["category"], f"{r['seconds'] * 1e3:,.2f}", human_bytes(r["bytes"]), r["source"])
                 for r in data["breakdown"][:12]])
    chunks = data["chunks"]
    half = SHOWN_CHUNKS // 2
    shown = chunks if len(chunks) <= SHOWN_CHUNKS else chunks[:half] + chunks[-half:]
    title = "chunks" if shown is chunks else f"chunks (first and last {half} of {len(chunks)}; --json lists all)"
    print_table(title, ["chunk", "prefix", "ms", "limiter"],
                [(f"{s['chunk_tokens']:,}", f"{s['prefix_tokens']:,}", f"{s['seconds'] * 1e3:,.2f}", s["limiter"])
                 for s in shown])


def register(app: typer.Typer) -> None:
    from k3sim.commands.options import MODEL_SET

    @app.command("prefill")
    def prefill(
        model: str = typer.Option("models/kimi-k3.yaml", "--model", help="model file (YAML or HF config.json)"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        hardware: str = typer.Option("h200", "--hardware", help="hardware profile name or path"),
        prompt: int = typer.Option(..., "--prompt", callback=option_range("tokens", "--prompt"),
                                   help="prompt tokens N (cached prefix included)"),
        cached: int = typer.Option(0, "--cached", help="tokens of the prompt already in the prefix cache P (< N)"),
        chunk: Optional[int] = typer.Option(None, "--chunk", callback=option_range("tokens", "--chunk"),
                                            help="tokens per chunked-prefill step C [default: the serving default, "
                                                 "8192]"),
        tp: int = typer.Option(8, "--tp", callback=option_range("parallel", "--tp"),
                               help="tensor-parallel ranks of one attention-DP rank"),
        pp: int = typer.Option(2, "--pp", callback=option_range("parallel", "--pp")),
        ep: Optional[int] = typer.Option(None, "--ep", callback=option_range("parallel", "--ep"),
                                         help="expert-parallel ranks [default: tp x attention-dp for an MoE model, "
                                              "1 otherwise, as decode]"),
        attention_dp: int = typer.Option(1, "--attention-dp", callback=option_range("parallel", "--attention-dp"),
                                         help="attention data-parallel ranks per stage, each prefilling a prompt "
                                              "like this one"),
        ep_kernel: str = typer.Option("auto", "--ep-kernel", help="EP all-to-all kernel: normal, low-latency, nccl "
                                      "or auto (normal with prefill)"),
        dispatch_dtype: str = typer.Option("auto", "--dispatch-dtype", help="dispatch dtype: fp8, bf16 or auto"),
        expert_kernel: str = typer.Option("auto", "--expert-kernel",
                                          help="auto, mxfp4_token, grouped_bf16, grouped_fp8 or deepgemm_fp8"),
        convention: str = typer.Option("graph", "--convention", help="graph (one CUDA graph per step) or eager"),
        json_out: bool = typer.Option(False, "--json", help="print JSON (SI units)"),
    ) -> None:
        """Prefill: TTFT of an N-token prompt (cached prefix P, chunks of C) on a layout, by component.

        The step model serving uses, one step per chunk, the chunks back to back on one replica; each chunk
        attends to the cached prefix and the chunks before it.
        """
        from k3sim.commands.decode import default_ep
        from k3sim.commands.options import PREFILL, check, given_options
        from k3sim.commands.scale import EP_KERNEL_NAMES, ep_errors_named
        from k3sim.configs import load_hardware, load_model
        from k3sim.output import print_json
        from k3sim.step.layers import dispatches

        model_cfg = load_model(model)
        hw = load_hardware(hardware)
        chunk = default_chunk() if chunk is None else chunk
        check_request(model_cfg, prompt, cached, chunk)
        ep = default_ep(model_cfg, tp, attention_dp) if ep is None else ep
        par, layout = serving_layout(model_cfg, hw, tp=tp, pp=pp, ep=ep, attention_dp=attention_dp,
                                     expert_kernel=expert_kernel, convention=convention,
                                     ep_kernel=EP_KERNEL_NAMES.get(ep_kernel, ep_kernel), dispatch_dtype=dispatch_dtype)
        check(PREFILL, {"ep_all_to_all": dispatches(layout)})  # every option given changes the result
        with ep_errors_named(given_options()[0], batch_option="--chunk"):
            res = prefill_ttft(model_cfg, hw, layout, prompt, cached, chunk)
        data = result_json(model_cfg, hw, res, prompt, cached, chunk, memory_at(model_cfg, hw, par, prompt, chunk))
        if json_out:
            print_json(data)
            return
        print_result(data)
