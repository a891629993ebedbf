"""`k3sim compare --hardware h200,b200,gb200-nvl72`: one question (a decode step, a prefill, a training step) asked
of several hardware profiles on one footing, each profile's figures with its ratio to the first profile's.

Each profile's own answers stand on what it has (the H200's measured kernels, a derived profile's rescaled H200
rows, the datasheet roofline for a profile with neither), so side by side they compare a measured kernel with an
ideal bound. The footing (`k3sim.kernels.footing`) prices every profile the same way: `measured` (only when every
profile has its own rows), `derived` (every profile from one measured profile's kernels, rescaled per call by its
roofline regime to the profile's datasheet compute and HBM, collectives by link bandwidth) or `datasheet` (every
profile, the measured ones too, by the datasheet roofline). The default is the most measured footing every profile
has; the output says which it used and why.

Each figure is the owning command's: `decode.decode_step` (decode), `commands.prefill.prefill_ttft` (prefill),
`training.train_step` (train), on the same options for every profile, with the footing as their `kernel_time`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import typer

from k3sim.configs.bounds import option_range

WHATS = ("decode", "prefill", "train")
# Profiles one comparison prices (one step model run each per question): a table a person reads, not a sweep; a
# modelling choice of this command, so a pasted list of hundreds is refused in one line.
MAX_PROFILES = 16


@dataclass(frozen=True)
class Figure:
    """One column: its JSON key, the table's label, its unit, how a value prints."""

    key: str
    label: str
    unit: str
    fmt: Callable[[float], str]


def _ms(x: float) -> str:
    return f"{x * 1e3:,.3f}"


FIGURES = {
    "decode": [Figure("tpot_s", "TPOT ms", "s", _ms),
               Figure("tokens_per_s_per_gpu", "tokens/s/GPU", "tokens/s", lambda x: f"{x:,.1f}"),
               Figure("max_batch_by_memory", "max batch", "sequences", lambda x: f"{x:,.0f}")],
    "prefill": [Figure("ttft_s", "TTFT ms", "s", _ms),
                Figure("prefill_tokens_per_s_per_gpu", "prefill tokens/s per GPU", "tokens/s", lambda x: f"{x:,.0f}")],
    "train": [Figure("step_time_s", "step s", "s", lambda x: f"{x:,.3f}"),
              Figure("mfu", "MFU", "fraction", lambda x: f"{x:.1%}"),
              Figure("tokens_per_s_per_gpu", "tokens/s per GPU", "tokens/s", lambda x: f"{x:,.1f}")],
}
HEADLINE = {"decode": "tpot_s", "prefill": "ttft_s", "train": "step_time_s"}  # the time the speed-up inverts
HEADLINE_LABEL = {"decode": "TPOT", "prefill": "TTFT", "train": "step time"}


@dataclass(frozen=True)
class Question:
    """What every profile is asked (the options)."""

    what: str
    tp: int
    pp: int
    ep: int | None
    expert_kernel: str
    convention: str
    batch: int
    context: int | None
    prompt: int
    cached: int
    chunk: int | None
    train_tp: int
    train_pp: int
    train_ep: int
    train_dp: int
    seq_len: int
    micro_batches: int


def parse_hardware(text: str) -> list[Any]:
    """The profiles of `--hardware A,B,...` (names in hardware_profiles/ or paths), loaded; every refusal names
    --hardware: an empty or repeated entry, fewer than two profiles, more than MAX_PROFILES, an unknown one."""
    from k3sim.configs import load_hardware
    from k3sim.errors import InputError, shorten

    names = [n.strip() for n in str(text).split(",")]
    if any(not n for n in names):
        raise InputError(f"an empty profile name in {shorten(repr(text), 80)}: give names separated by commas, e.g. "
                         "h200,b200", source="--hardware")
    if len(names) > MAX_PROFILES:
        raise InputError(f"{len(names)} profiles; at most {MAX_PROFILES} are compared at once", source="--hardware")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"{', '.join(map(shorten_name, repeated))} given twice: name each profile once",
                         source="--hardware")
    if len(names) < 2:
        raise InputError(f"one profile ({shorten_name(names[0])}): a comparison needs two or more, e.g. "
                         f"{shorten_name(names[0])},b200 (one profile alone: k3sim decode / prefill)",
                         source="--hardware")
    out = []
    for n in names:
        try:
            out.append(load_hardware(n))
        except InputError as err:  # the loader's line names the profile where its source is the name given
            said = str(err) if err.source == n else f"profile {shorten_name(n)}: {err}"
            raise InputError(said, source="--hardware") from None
    return out


def shorten_name(name: str) -> str:
    from k3sim.errors import shorten

    return shorten(name, 60)


def source_profile(ref: str) -> Any:
    """The derived footing's source (`--derived-from`), loaded; a refusal names the option."""
    from k3sim.configs import load_hardware
    from k3sim.errors import InputError

    try:
        return load_hardware(ref)
    except InputError as err:
        said = str(err) if err.source == ref else f"profile {shorten_name(ref)}: {err}"
        raise InputError(said, source="--derived-from") from None


def choose_footing(requested: str | None, profiles: list[Any], source_ref: str,
                   source_given: bool = False) -> tuple[str, str]:
    """(footing, "given" | "default"): the requested one, refused in one line naming --footing where a profile
    cannot stand on it; by default the first of `footing.FOOTINGS` every profile has: measured when all have
    their own rows, else derived when the source (`--derived-from`) has measured rows (a source the user named
    is then held to it: `run_compare` refuses one without rows), else datasheet."""
    from k3sim.errors import InputError
    from k3sim.kernels.footing import FOOTINGS, native_footing

    if requested is not None and requested not in FOOTINGS:
        raise InputError(f"must be one of {', '.join(FOOTINGS)} (or leave it out for the most measured footing "
                         f"every profile has), got {shorten_name(requested)!r}", source="--footing")
    lacking = [f"{hw.name} ({native_footing(hw)})" for hw in profiles if native_footing(hw) != "measured"]
    if requested == "measured" and lacking:
        raise InputError(f"measured needs every profile's own measured kernel rows and {', '.join(lacking)} "
                         f"{'has' if len(lacking) == 1 else 'have'} none: give --footing derived (every profile from "
                         f"{shorten_name(source_ref)}'s rows) or --footing datasheet", source="--footing")
    if requested is not None:
        return requested, "given"
    if not lacking:
        return "measured", "default"
    if source_given or native_footing(source_profile(source_ref)) == "measured":
        return "derived", "default"
    return "datasheet", "default"


def _layout_on(model: Any, hw: Any, q: Question) -> tuple[Any, Any]:
    """The serving layout of the options on `hw` (`commands.prefill.serving_layout`: the one layout check, each
    refusal naming its option), the profile named in a refusal."""
    from k3sim.commands.decode import default_ep
    from k3sim.commands.prefill import serving_layout
    from k3sim.errors import InputError

    ep = default_ep(model, q.tp, 1) if q.ep is None else q.ep
    try:
        return serving_layout(model, hw, tp=q.tp, pp=q.pp, ep=ep, expert_kernel=q.expert_kernel,
                              convention=q.convention)
    except InputError as err:
        raise InputError(f"on {hw.name}: {err.reason}", source=err.source, field=err.field) from None


def _datasheet_share(rows: list[tuple[float, str]]) -> float:
    """The share of the seconds whose kernel answer stands on a datasheet roofline (a lower bound), rows of
    (seconds, source)."""
    total = sum(s for s, _ in rows) or 1.0
    return sum(s for s, src in rows if "datasheet" in src) / total


def _decode(model: Any, hw: Any, q: Question, kt: Any) -> dict:
    from k3sim.decode import decode_step

    _, layout = _layout_on(model, hw, q)
    r = decode_step(model, hw, layout, q.batch, q.context, kernel_time=kt)
    fit = r.max_batch_by_memory
    notes = ([] if fit is not None and fit >= q.batch else
             [f"memory: {'the weights do not fit' if fit is None else f'{fit} sequences fit'} at "
              f"{q.context:,} tokens, not the batch of {q.batch} (timed all the same)"])
    return {"figures": {"tpot_s": r.tpot_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                        "max_batch_by_memory": None if fit is None else float(fit)},
            "limiter": r.limiter, "expert_kernel": r.expert_kernel, "notes": notes,
            "datasheet_share_of_seconds": _datasheet_share([(x.seconds, x.source) for x in r.rows])}


def _prefill(model: Any, hw: Any, q: Question, kt: Any) -> dict:
    from k3sim.commands.prefill import memory_at, prefill_ttft

    par, layout = _layout_on(model, hw, q)
    r = prefill_ttft(model, hw, layout, q.prompt, q.cached, q.chunk, kernel_time=kt)
    mem = memory_at(model, hw, par, q.prompt, q.chunk)
    limiter = max(r.steps, key=lambda s: s["seconds"])["limiter"] if r.steps else ""
    return {"figures": {"ttft_s": r.ttft_s,
                        "prefill_tokens_per_s_per_gpu": (q.prompt - q.cached) / r.ttft_s / layout.gpus},
            "limiter": limiter, "expert_kernel": r.expert_kernel,
            "notes": [] if mem["fits"] else [f"memory: {mem['detail']} (timed all the same)"],
            "datasheet_share_of_seconds": _datasheet_share([(x["seconds"], x["source"]) for x in r.rows])}


TRAIN_OPTIONS = {"tp": "--train-tp", "pp": "--train-pp", "ep": "--train-ep", "dp": "--train-dp",
                 "num_micro_batches": "--micro-batches"}


def _train(model: Any, hw: Any, q: Question, kt: Any) -> dict:
    from k3sim.configs.parallel import Parallelism, check_layout
    from k3sim.errors import InputError
    from k3sim.training import train_step

    try:
        par = Parallelism(tp=q.train_tp, pp=q.train_pp, ep=q.train_ep, dp=q.train_dp)
        check_layout(model, par, mode="train", hardware=hw)
    except InputError as err:
        f = (err.field or "").split(".")[-1]
        raise InputError(f"on {hw.name}: {err.reason}", source=TRAIN_OPTIONS.get(f, "--train-tp")) from None
    r = train_step(model, hw, par, seq_len=q.seq_len, num_micro_batches=q.micro_batches, kernel_time=kt)
    return {"figures": {"step_time_s": r.step_time_s, "mfu": r.mfu, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu},
            "limiter": "", "expert_kernel": None,
            "notes": [] if r.fits else [f"memory: {r.verdict} (timed all the same)"],
            "datasheet_share_of_seconds": None}


ASK = {"decode": _decode, "prefill": _prefill, "train": _train}


def _ratios(points: list[dict], what: str) -> None:
    """Each point's ratio of every figure to the first profile's, and the speed-up (first's time / its time)."""
    first = points[0]["figures"]
    for p in points:
        p["ratio_to_first"] = {k: (v / first[k] if v is not None and first[k] else None)
                               for k, v in p["figures"].items()}
        t = p["figures"][HEADLINE[what]]
        p["speedup_vs_first"] = first[HEADLINE[what]] / t if t else None


def question_json(model: Any, q: Question) -> dict:
    """The question every profile was asked, SI units."""
    if q.what == "train":
        return {"layout": {"tp": q.train_tp, "pp": q.train_pp, "ep": q.train_ep, "dp": q.train_dp},
                "seq_len_tokens": q.seq_len, "micro_batches": q.micro_batches}
    from k3sim.commands.decode import default_ep

    ep = default_ep(model, q.tp, 1) if q.ep is None else q.ep
    out = {"layout": {"tp": q.tp, "pp": q.pp, "ep": ep}, "expert_kernel": q.expert_kernel,
           "convention": q.convention}
    if q.what == "decode":
        out.update(batch=q.batch, context_tokens=q.context)
    else:
        out.update(prompt_tokens=q.prompt, cached_tokens=q.cached, chunk_tokens=q.chunk)
    return out


def run_compare(model: Any, profiles: list[Any], q: Question, footing: str, chosen: str,
                source_ref: str = "h200") -> dict:
    """The comparison as data (the command's JSON): every profile asked `q` with the footing as kernel_time."""
    from k3sim.errors import InputError
    from k3sim.kernels.footing import DERIVED_IGNORES, Footing, footing_line, native_footing
    from k3sim.predict import predict_kernel_time

    if footing == "derived":
        source_profile(source_ref)  # an unknown or unreadable source: one line naming --derived-from
    try:
        kt = Footing(footing, predict_kernel_time, source_ref)
    except InputError as err:  # a source without measured rows of its own
        raise InputError(err.reason, source="--derived-from") from None
    points = []
    for hw in profiles:
        p = ASK[q.what](model, hw, q, kt)
        points.append({"hardware": hw.name, "native_footing": native_footing(hw), **p})
    _ratios(points, q.what)
    src = kt.source if footing == "derived" else None
    return {"what": q.what, "model": model.name, "question": question_json(model, q),
            "footing": {"name": footing, "chosen": chosen, "line": footing_line(footing, chosen, profiles, src),
                        "source_profile": None if src is None else src.name,
                        "ignores": list(DERIVED_IGNORES) if src is not None else [],
                        "native": {hw.name: native_footing(hw) for hw in profiles}},
            "first": profiles[0].name,
            "units": {f.key: f.unit for f in FIGURES[q.what]},
            "profiles": points}


def print_compare(data: dict) -> None:
    from k3sim.output import print_kv, print_table

    q, what = data["question"], data["what"]
    lay = q["layout"]
    if what == "train":
        asked = (f"training step, tp={lay['tp']} pp={lay['pp']} ep={lay['ep']} dp={lay['dp']}, "
                 f"{q['seq_len_tokens']:,}-token sequences, {q['micro_batches']} micro-batches")
    elif what == "decode":
        asked = (f"decode step, batch {q['batch']} at {q['context_tokens']:,} tokens of context, tp={lay['tp']} "
                 f"pp={lay['pp']} ep={lay['ep']}")
    else:
        asked = (f"prefill of {q['prompt_tokens']:,} tokens ({q['cached_tokens']:,} cached, chunks of "
                 f"{q['chunk_tokens']:,}), tp={lay['tp']} pp={lay['pp']} ep={lay['ep']}")
    print_kv("compare", [("model", data["model"]), ("question", asked), ("footing", data["footing"]["line"])])
    figs = FIGURES[what]
    # each profile's own footing is in the footing line; the limiter's words before its explanation (--json: all)
    cols = ["hardware", *[f.label for f in figs], f"speed vs {data['first']}"]
    if what != "train":
        cols += ["experts", "on datasheet", "limiter"]
    rows = []
    for p in data["profiles"]:
        row = [p["hardware"], *["n/a" if p["figures"][f.key] is None else f.fmt(p["figures"][f.key]) for f in figs],
               "n/a" if p["speedup_vs_first"] is None else f"{p['speedup_vs_first']:.3f}x"]
        if what != "train":
            row += [p["expert_kernel"], f"{p['datasheet_share_of_seconds']:.0%}", p["limiter"].split(" (")[0]]
        rows.append(row)
    print_table(f"{what} on the {data['footing']['name']} footing (speed: {data['first']}'s "
                f"{HEADLINE_LABEL[what]} over the profile's)", cols, rows)
    notes = [(p["hardware"], n) for p in data["profiles"] for n in p["notes"]]
    if notes:
        print_table("notes", ["profile", "note"], notes)
    if data["footing"]["ignores"]:
        print_table("what the derived footing leaves out", ["", "assumption"],
                    [(str(i + 1), n) for i, n in enumerate(data["footing"]["ignores"])])


def _what_only(options: tuple[str, ...], *whats: str):
    """The rule: `options` change the result only for the questions `whats`."""
    from k3sim.commands.options import only_when

    names = " or ".join(f"--what {w}" for w in whats)
    return only_when(options, lambda f: f["what"] in whats, lambda f: f"applies to {names} and the question is "
                     f"--what {f['what']}", f"remove it, or give {names}")


def rules() -> list:
    """Every option the user wrote must change the result (`commands.options.check`)."""
    from k3sim.commands.options import only_when

    return [_what_only(("--batch", "--context"), "decode"),
            _what_only(("--prompt", "--cached", "--chunk"), "prefill"),
            _what_only(("--tp", "--pp", "--ep", "--expert-kernel", "--convention"), "decode", "prefill"),
            _what_only(("--train-tp", "--train-pp", "--train-ep", "--train-dp", "--seq-len", "--micro-batches"),
                       "train"),
            only_when("--derived-from", lambda f: f["footing"] == "derived",
                      lambda f: f"names the source of the derived footing and this comparison is on the "
                                f"{f['footing']} footing", "remove it, or give --footing derived")]


def _prepare(model: Any, q: Question) -> tuple[Question, list[str]]:
    """The question with its defaults resolved (decode's context, prefill's chunk) and checked as the owning
    command checks them, and the notes that say so."""
    import dataclasses

    from k3sim.commands.decode import default_context
    from k3sim.commands.prefill import check_request, default_chunk
    from k3sim.errors import InputError
    from k3sim.step.layout import CONVENTIONS, EXPERT_KERNELS

    notes: list[str] = []
    if q.what == "decode":
        context, note = default_context(model, q.context)
        model.check_context(context, source="--context")
        q = dataclasses.replace(q, context=context)
        notes += [note] if note else []
    if q.what == "prefill":
        q = dataclasses.replace(q, chunk=default_chunk() if q.chunk is None else q.chunk)
        check_request(model, q.prompt, q.cached, q.chunk)
    if q.what != "train" and q.expert_kernel not in EXPERT_KERNELS:
        raise InputError(f"must be one of {', '.join(EXPERT_KERNELS)}, got {q.expert_kernel!r}",
                         source="--expert-kernel")
    if q.what != "train" and q.convention not in CONVENTIONS:
        raise InputError(f"must be graph or eager, got {q.convention!r}", source="--convention")
    return q, notes


def register(app: typer.Typer) -> None:
    from k3sim.commands.options import MODEL_SET

    @app.command("compare")
    def compare(
        hardware: str = typer.Option(..., "--hardware", help="profiles to compare, comma-separated names or paths "
                                     "(the first is the reference of the ratios), e.g. h200,b200,gb200-nvl72"),
        model: str = typer.Option("models/kimi-k3.yaml", "--model", help="model file (YAML or HF config.json)"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        what: str = typer.Option("decode", "--what", help="the question: decode (TPOT, tokens/s per GPU), prefill "
                                 "(TTFT of --prompt) or train (step time, MFU)"),
        footing: Optional[str] = typer.Option(None, "--footing", help="measured (every profile's own rows), derived "
                                              "(from --derived-from's measured kernels) or datasheet (every profile's "
                                              "datasheet roofline) [default: the most measured footing every profile "
                                              "has]"),
        derived_from: str = typer.Option("h200", "--derived-from", help="derived footing: the measured profile "
                                         "whose kernels are rescaled to every profile"),
        tp: int = typer.Option(8, "--tp", callback=option_range("parallel", "--tp"),
                               help="decode, prefill: tensor-parallel ranks"),
        pp: int = typer.Option(2, "--pp", callback=option_range("parallel", "--pp"),
                               help="decode, prefill: pipeline stages"),
        ep: Optional[int] = typer.Option(None, "--ep", callback=option_range("parallel", "--ep"),
                                         help="decode, prefill: expert-parallel ranks [default: --tp for an MoE "
                                              "model, as decode]"),
        expert_kernel: str = typer.Option("auto", "--expert-kernel", help="decode, prefill: auto (the cheapest on "
                                          "each profile), mxfp4_token, grouped_bf16, grouped_fp8 or deepgemm_fp8"),
        convention: str = typer.Option("graph", "--convention", help="decode, prefill: graph (one CUDA graph per "
                                       "step) or eager"),
        batch: int = typer.Option(64, "--batch", callback=option_range("batch", "--batch"),
                                  help="decode: sequences per step"),
        context: Optional[int] = typer.Option(None, "--context", callback=option_range("tokens", "--context"),
                                              help="decode: tokens of context per sequence [default: 32768, or the "
                                                   "model's max_context_tokens when shorter]"),
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
                                    help="train: tokens per sequence"),
        micro_batches: int = typer.Option(32, "--micro-batches", callback=option_range("batch", "--micro-batches"),
                                          help="train: micro-batches per step (one sequence each)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON (SI units)"),
    ) -> None:
        """Compare hardware profiles on one question (decode, prefill or train) on the same footing.

        Every profile priced the same way: measured (each one's own rows), derived (one measured profile's kernels
        rescaled to each profile's datasheet figures) or datasheet (every profile's roofline); the output says which
        footing it used. Ratios are to the first profile.
        """
        from k3sim.commands.options import check, given_options
        from k3sim.configs import load_model
        from k3sim.errors import InputError
        from k3sim.output import print_json

        if what not in WHATS:
            raise InputError(f"must be one of {', '.join(WHATS)}, got {shorten_name(what)!r}", source="--what")
        profiles = parse_hardware(hardware)
        used, chosen = choose_footing(footing, profiles, derived_from, "--derived-from" in given_options()[0])
        check(rules(), {"what": what, "footing": used})
        model_cfg = load_model(model)
        q, notes = _prepare(model_cfg, Question(what, tp, pp, ep, expert_kernel, convention, batch, context, prompt,
                                                cached, chunk, train_tp, train_pp, train_ep, train_dp, seq_len,
                                                micro_batches))
        data = run_compare(model_cfg, profiles, q, used, chosen, derived_from)
        data["notes"] = notes
        if json_out:
            print_json(data)
            return
        print_compare(data)
        for n in notes:
            print(f"note: {n}")
