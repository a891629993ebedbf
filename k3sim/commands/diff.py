"""`k3sim diff BASE [VARIANT]`: two models side by side (two files, or one file and a what-if of it through
`--variant-set KEY=VALUE`) on the figures the other commands give one at a time: parameters (total, active per
token), serving memory per GPU, decode TPOT and tokens/s per GPU, prefill TTFT, and the training step time, MFU
and tokens/s per GPU, with the ratio variant / base.

Each figure comes from the command that owns it, on the same inputs for both sides: `memory.params.count_params`
(model-info), `memory.plan.serve_plan` at `--context` (memory --mode serve), `decode.decode_step` (decode),
`commands.prefill.prefill_ttft` (prefill), `training.train_step` (the training step model). A figure one side
cannot have (a mixer kind a model does not price yet, a layout one model refuses, weights that do not fit) is
"n/a" with the reason that side's model gave; the diff itself is refused (exit 2, one line) when it means
nothing: the two sides are the same model, or a layout the options give is refused by both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import typer

from k3sim.configs.bounds import option_range

# The training layout's options -> the Parallelism fields they set (refusals are renamed to the option).
TRAIN_OPTIONS = {"tp": "--train-tp", "pp": "--train-pp", "ep": "--train-ep", "dp": "--train-dp",
                 "num_micro_batches": "--micro-batches"}
TRAIN_LAYOUT = "--train-tp/--train-pp/--train-ep/--train-dp"  # a refusal of the layout as a whole


@dataclass(frozen=True)
class Figure:
    """One row: its JSON key, what the table calls it, its unit, and how the table prints a value."""

    key: str
    label: str
    unit: str
    fmt: Callable[[float], str]


def _g(x: float) -> str:
    return f"{x:,.4g}"


FIGURES = [
    Figure("total_params", "total params", "params", lambda x: f"{x / 1e9:,.2f} B"),
    Figure("active_params", "active params per token", "params", lambda x: f"{x / 1e9:,.2f} B"),
    Figure("weights_bytes_per_gpu", "serve: weights per GPU", "bytes", lambda x: f"{x / 2 ** 30:,.2f} GiB"),
    Figure("request_bytes_per_gpu", "serve: one request at --context per GPU", "bytes",
           lambda x: f"{x / 2 ** 30:,.3f} GiB"),
    Figure("max_concurrent_requests", "serve: concurrent requests at --context", "requests", lambda x: f"{x:,.0f}"),
    Figure("decode_tpot_s", "decode: TPOT", "s", lambda x: f"{x * 1e3:,.3f} ms"),
    Figure("decode_tokens_per_s_per_gpu", "decode: tokens/s per GPU", "tokens/s", lambda x: f"{x:,.1f}"),
    Figure("prefill_ttft_s", "prefill: TTFT of --prompt", "s", lambda x: f"{x * 1e3:,.2f} ms"),
    Figure("train_step_time_s", "train: step time", "s", lambda x: f"{x:,.3f} s"),
    Figure("train_mfu", "train: MFU", "fraction", lambda x: f"{x:.1%}"),
    Figure("train_tokens_per_s_per_gpu", "train: tokens/s per GPU", "tokens/s", lambda x: f"{x:,.1f}"),
]


@dataclass
class Side:
    """One model's figures (key -> value) and, for each figure it cannot have, the reason (key -> text)."""

    values: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def undefined(self, keys: list[str], reason: str) -> None:
        for k in keys:
            self.missing[k] = reason


class SharedKernelTime:
    """`predict_kernel_time` memoised across both sides' decode and prefill steps: a what-if changes some layers'
    shapes and leaves the rest (the experts under a KDA-heads change), whose kernels are then predicted once. The
    answers are the predictor's own (a pure function of op, shape, profile and convention)."""

    def __init__(self) -> None:
        from k3sim.predict import predict_kernel_time

        self.predict = predict_kernel_time
        self.memo: dict[tuple, Any] = {}

    def __call__(self, op: str, params: Any, hardware: Any = "h200", convention: str = "graph") -> Any:
        key = (op, tuple(sorted(dict(params).items())), id(hardware), convention)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self.predict(op, params, hardware=hardware, convention=convention)
        return hit


@dataclass(frozen=True)
class Inputs:
    """What both sides are computed on (the options); `kernel_time` is shared by their step-model figures."""

    hw: Any
    tp: int
    pp: int
    ep: int | None
    context: int
    batch: int
    prompt: int
    cached: int
    chunk: int
    train_tp: int
    train_pp: int
    train_ep: int
    train_dp: int
    seq_len: int
    micro_batches: int
    kernel_time: Any = None


SERVE_KEYS = ["weights_bytes_per_gpu", "request_bytes_per_gpu", "max_concurrent_requests"]
DECODE_KEYS = ["decode_tpot_s", "decode_tokens_per_s_per_gpu"]
TRAIN_KEYS = ["train_step_time_s", "train_mfu", "train_tokens_per_s_per_gpu"]


def _params(model: Any, side: Side) -> None:
    from k3sim.memory.params import count_params

    report = count_params(model)
    side.values["total_params"] = float(report.total_params)
    side.values["active_params"] = float(report.active_params)


def _serving(model: Any, inp: Inputs, side: Side) -> Any:
    """Memory, decode and prefill at the serving layout; the layout's refusal is returned (not raised): the
    caller raises it when both sides refuse."""
    from k3sim.commands.decode import default_ep
    from k3sim.commands.prefill import prefill_ttft, serving_layout
    from k3sim.errors import DoesNotFit, InputError
    from k3sim.memory.plan import serve_plan

    ep = default_ep(model, inp.tp, 1) if inp.ep is None else inp.ep  # decode's --ep default
    try:
        par, layout = serving_layout(model, inp.hw, tp=inp.tp, pp=inp.pp, ep=ep)
    except InputError as err:
        side.undefined(SERVE_KEYS + DECODE_KEYS + ["prefill_ttft_s"], str(err))
        return err
    try:
        model.check_context(inp.context, source="--context")  # as `memory --mode serve` refuses it
        plan = serve_plan(model, inp.hw, par, inp.context)
        side.values["weights_bytes_per_gpu"] = float(sum(v for k, v in plan.per_gpu_bytes.items()
                                                         if k.startswith("weights_")))
        side.values["request_bytes_per_gpu"] = float(plan.per_request_bytes_per_gpu)
        side.values["max_concurrent_requests"] = float(plan.max_concurrent_requests)
    except DoesNotFit as err:
        side.undefined(SERVE_KEYS, err.reason)
    except InputError as err:
        side.undefined(SERVE_KEYS, str(err))
    _figure(side, DECODE_KEYS, lambda: _decode(model, inp, layout))
    _figure(side, ["prefill_ttft_s"],
            lambda: [prefill_ttft(model, inp.hw, layout, inp.prompt, inp.cached, inp.chunk,
                                  kernel_time=inp.kernel_time).ttft_s])
    return None


def _decode(model: Any, inp: Inputs, layout: Any) -> list[float]:
    from k3sim.decode import decode_step

    model.check_context(inp.context, source="--context")
    r = decode_step(model, inp.hw, layout, inp.batch, inp.context, kernel_time=inp.kernel_time)
    return [r.tpot_s, r.tokens_per_s_per_gpu]


def _figure(side: Side, keys: list[str], compute: Callable[[], list[float]]) -> None:
    """Values of `keys` from `compute`, or each one n/a with the model's refusal (an InputError)."""
    from k3sim.errors import InputError

    try:
        values = compute()
    except InputError as err:
        side.undefined(keys, str(err))
        return
    side.values.update(zip(keys, map(float, values)))


def _training(model: Any, inp: Inputs, side: Side) -> Any:
    """Training step time, MFU and tokens/s per GPU at the training layout; a refusal of the layout itself is
    returned (the caller raises it when both sides refuse), any other refusal makes the figures n/a."""
    from k3sim.configs.parallel import Parallelism, check_layout
    from k3sim.errors import InputError
    from k3sim.training import train_step

    try:
        par = Parallelism(tp=inp.train_tp, pp=inp.train_pp, ep=inp.train_ep, dp=inp.train_dp)
        check_layout(model, par, mode="train", hardware=inp.hw)
    except InputError as err:
        f = (err.field or "").split(".")[-1]
        named = InputError(err.reason, source=TRAIN_OPTIONS.get(f, TRAIN_LAYOUT))
        side.undefined(TRAIN_KEYS, str(named))
        return named

    def run() -> list[float]:
        r = train_step(model, inp.hw, par, seq_len=inp.seq_len, num_micro_batches=inp.micro_batches)
        if not r.fits:
            side.notes.append(f"training layout: {r.verdict}")
        return [r.step_time_s, r.mfu, r.tokens_per_s_per_gpu]

    _figure(side, TRAIN_KEYS, run)
    return None


def figures(model: Any, inp: Inputs) -> tuple[Side, list]:
    """One side's figures and the layout refusals (serving, training) its model gave."""
    side = Side()
    _params(model, side)
    return side, [_serving(model, inp, side), _training(model, inp, side)]


def same_model(a: Any, b: Any) -> bool:
    """Both sides describe the same model (name and provenance aside): nothing would differ."""
    skip = {"name", "source"}
    return a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def rows(base: Side, variant: Side) -> list[dict]:
    out = []
    for f in FIGURES:
        b, v = base.values.get(f.key), variant.values.get(f.key)
        ratio = v / b if b is not None and v is not None and b != 0 else None
        out.append({"figure": f.key, "unit": f.unit, "base": b, "variant": v, "ratio": ratio,
                    "base_na": base.missing.get(f.key), "variant_na": variant.missing.get(f.key)})
    return out


def run_diff(base_path: str, variant_path: str, base_set: list[str], variant_set: list[str], inp: Inputs) -> dict:
    """The diff as data (the command's JSON)."""
    from k3sim.configs import load_model, overrides
    from k3sim.errors import InputError

    base = load_model(base_path, overrides=overrides.parse(base_set, option="--base-set"))
    variant = load_model(variant_path, overrides=overrides.parse(variant_set, option="--variant-set"))
    if same_model(base, variant):
        how = "the same file and overrides" if base_path == variant_path else "two files of one model"
        raise InputError(f"BASE and VARIANT are the same model ({base.name}: {how}), so nothing differs: give a "
                         "VARIANT file of another model or --variant-set KEY=VALUE", source="diff")
    (bs, b_err), (vs, v_err) = figures(base, inp), figures(variant, inp)
    for a, b in zip(b_err, v_err):
        if a is not None and b is not None:  # a layout neither model accepts: the options are wrong
            raise a
    def side(path: str, model: Any, sets: list[str] | None, s: Side) -> dict:
        return {"path": str(path), "model": model.name, "overrides": list(sets or ()), "notes": s.notes}

    return {"base": side(base_path, base, base_set, bs), "variant": side(variant_path, variant, variant_set, vs),
            "hardware": inp.hw.name,
            "serving_layout": {"tp": inp.tp, "pp": inp.pp, "ep": inp.ep},
            "training_layout": {"tp": inp.train_tp, "pp": inp.train_pp, "ep": inp.train_ep, "dp": inp.train_dp},
            "workload": {"context_tokens": inp.context, "batch": inp.batch, "prompt_tokens": inp.prompt,
                         "cached_tokens": inp.cached, "chunk_tokens": inp.chunk, "seq_len_tokens": inp.seq_len,
                         "micro_batches": inp.micro_batches},
            "figures": rows(bs, vs)}


def print_diff(data: dict) -> None:
    """The side-by-side table; an n/a cell points at its reason, listed under the table."""
    from k3sim.output import print_kv, print_table

    fmt = {f.key: f for f in FIGURES}
    reasons: list[str] = []

    def cell(row: dict, which: str) -> str:
        why = row[f"{which}_na"]
        if why is None:
            return fmt[row["figure"]].fmt(row[which])
        if why not in reasons:
            reasons.append(why)
        return f"n/a [{reasons.index(why) + 1}]"

    b, v = data["base"], data["variant"]
    sv, tr, w = data["serving_layout"], data["training_layout"], data["workload"]
    ep = "tp" if sv["ep"] is None else sv["ep"]
    def named(s: dict) -> str:
        return f"{s['model']} ({s['path']}{'; ' + ' '.join(s['overrides']) if s['overrides'] else ''})"

    print_kv("diff", [("base", named(b)), ("variant", named(v)),
                      ("hardware", data["hardware"]),
                      ("serving", f"tp={sv['tp']} pp={sv['pp']} ep={ep}; context {w['context_tokens']:,}, decode batch "
                                  f"{w['batch']}, prompt {w['prompt_tokens']:,} (cached {w['cached_tokens']:,}, chunks "
                                  f"of {w['chunk_tokens']:,})"),
                      ("training", f"tp={tr['tp']} pp={tr['pp']} ep={tr['ep']} dp={tr['dp']}; {w['seq_len_tokens']:,}"
                                   f"-token sequences, {w['micro_batches']} micro-batches")])
    table = [(fmt[r["figure"]].label, cell(r, "base"), cell(r, "variant"),
              "n/a" if r["ratio"] is None else f"{r['ratio']:.3f}x") for r in data["figures"]]
    print_table("base vs variant", ["figure", "base", "variant", "variant / base"], table)
    notes = [(f"[{i + 1}]", why) for i, why in enumerate(reasons)]
    notes += [(side, n) for side in ("base", "variant") for n in data[side]["notes"]]
    if notes:
        print_table("n/a and notes", ["", "reason"], notes)


def register(app: typer.Typer) -> None:
    set_help = "what-if KEY=VALUE on the {} model, repeatable, as every command's --set (docs/commands/diff.md)"

    @app.command("diff")
    def diff(
        base: str = typer.Argument(..., help="base model file (YAML or HF config.json)", show_default=False),
        variant: Optional[str] = typer.Argument(None, help="variant model file [default: BASE, with --variant-set]",
                                                show_default=False),
        base_set: list[str] = typer.Option(None, "--base-set", metavar="KEY=VALUE", help=set_help.format("base")),
        variant_set: list[str] = typer.Option(None, "--variant-set", metavar="KEY=VALUE",
                                              help=set_help.format("variant")),
        hardware: str = typer.Option("h200", "--hardware", help="hardware profile name or path"),
        tp: int = typer.Option(8, "--tp", callback=option_range("parallel", "--tp"),
                               help="serving: tensor-parallel ranks"),
        pp: int = typer.Option(2, "--pp", callback=option_range("parallel", "--pp"), help="serving: pipeline stages"),
        ep: Optional[int] = typer.Option(None, "--ep", callback=option_range("parallel", "--ep"),
                                         help="serving: expert-parallel ranks [default: --tp for an MoE model, as "
                                              "decode]"),
        context: int = typer.Option(32768, "--context", callback=option_range("tokens", "--context"),
                                    help="serving: tokens of each request (memory, decode)"),
        batch: int = typer.Option(64, "--batch", callback=option_range("batch", "--batch"),
                                  help="decode: sequences per step"),
        prompt: int = typer.Option(32768, "--prompt", callback=option_range("tokens", "--prompt"),
                                   help="prefill: prompt tokens"),
        cached: int = typer.Option(0, "--cached", help="prefill: cached prefix tokens (< --prompt)"),
        chunk: Optional[int] = typer.Option(None, "--chunk", callback=option_range("tokens", "--chunk"),
                                            help="prefill: tokens per chunk [default: the serving default, 8192]"),
        train_tp: int = typer.Option(8, "--train-tp", callback=option_range("parallel", "--train-tp")),
        train_pp: int = typer.Option(16, "--train-pp", callback=option_range("parallel", "--train-pp")),
        train_ep: int = typer.Option(64, "--train-ep", callback=option_range("parallel", "--train-ep")),
        train_dp: int = typer.Option(8, "--train-dp", callback=option_range("parallel", "--train-dp")),
        seq_len: int = typer.Option(8192, "--seq-len", callback=option_range("tokens", "--seq-len"),
                                    help="training: tokens per sequence"),
        micro_batches: int = typer.Option(32, "--micro-batches", callback=option_range("batch", "--micro-batches"),
                                          help="training: micro-batches per step (one sequence each)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON (SI units)"),
    ) -> None:
        """Diff two models (or one and a what-if of it): params, memory, decode, prefill, training, side by side.

        Each figure as the command that owns it computes it, for both sides on the same layouts; "n/a" with the
        reason where one side cannot have it. Example: k3sim diff models/kimi-k3.yaml --variant-set
        kda.num_heads=48.
        """
        from k3sim.commands.prefill import check_chunks, default_chunk
        from k3sim.configs import load_hardware
        from k3sim.output import print_json

        chunk = default_chunk() if chunk is None else chunk
        check_chunks(prompt, cached, chunk)  # the same for both sides: an option error, not an n/a
        inp = Inputs(load_hardware(hardware), tp, pp, ep, context, batch, prompt, cached, chunk, train_tp, train_pp,
                     train_ep, train_dp, seq_len, micro_batches, SharedKernelTime())
        data = run_diff(base, variant if variant is not None else base, base_set, variant_set, inp)
        if json_out:
            print_json(data)
            return
        print_diff(data)
