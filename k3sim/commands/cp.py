"""`k3sim cp`: per-rank traffic and attention time of one training step under context parallelism,
or (`--sweep`) a table over S and P with the crossover plot and the report figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from k3sim.errors import InputError


def parse_tokens(text: str, option: str) -> int:
    """`1048576`, `1M`, `32K` (binary prefixes), `1e6` -> int."""
    t = str(text).strip()
    mult = {"k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30}.get(t[-1:].lower(), 1)
    try:
        v = float(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise InputError(f"not a token count: {text!r}", source=option) from None
    if not math.isfinite(v):
        raise InputError(f"not a token count: {text!r}", source=option)
    if v != int(v):
        raise InputError(f"not a whole number of tokens: {text!r}", source=option)
    from k3sim.configs.bounds import check_range

    if abs(v) >= 2 ** 63:                               # the model holds token positions in int64 arrays
        raise InputError(f"token count out of range (64-bit): {text[:40]!r}", source=option)
    return int(check_range(int(v), "tokens", option, integer=True))


def parse_list(text: str, option: str) -> list[int]:
    return [parse_tokens(x, option) for x in text.split(",") if x.strip()]


def _check_a_point_runs(g, hw, seq_lens: list[int], cps: list[int], state_dtype: str) -> None:
    """Refuse a sweep whose every (S, P) point would be skipped (a length per rank past the kernels' range),
    before anything is computed or written: it exited 0 with empty plots. Points are probed one by one with
    the sweep's own function and the probe stops at the first that runs (~0.2 s on a normal grid)."""
    from k3sim.cp.sweep import sweep

    first = None
    for S in seq_lens:
        for P in cps:
            try:
                rows = sweep(g, hw, [S], [P], state_dtype=state_dtype)
            except InputError as err:
                first = first or err.reason
                continue
            if any(not r["skipped"] for r in rows):
                return
            first = first or next((r["skipped"] for r in rows if r["skipped"]), None)
    raise InputError(f"no (S, P) point of the sweep can run (first reason: {first}); lower --seq-lens or raise "
                     "--cps", source="--seq-lens")


# Kernel parameters (k3sim.kernels.ops) and the cp options that set them: an out-of-range `T` is the user's
# --seq-len (T = S / P tokens per rank), `docs` is --docs.
KERNEL_FIELD_OPTIONS = {"T": "--seq-len", "docs": "--docs"}


def register(app: typer.Typer) -> None:
    @app.command("cp")
    def cp(
        model: str = typer.Option("models/kimi-k3.yaml", "--model", help="Model YAML or HF config.json."),
        hardware: str = typer.Option("h200", "--hardware", help="Hardware profile name or path."),
        seq_len: Optional[str] = typer.Option(None, "--seq-len",
                                              help="Global tokens per sequence (1M, 32K ok) [default: 1M]."),
        cp_degree: int = typer.Option(8, "--cp", help="CP degree P (ranks sharing one sequence)."),
        strategy: Optional[str] = typer.Option(None, "--strategy",
                                               help="KDA layers: kcp | ulysses | lasp2 (reference) [default: kcp]."),
        mla_strategy: Optional[str] = typer.Option(
            None, "--mla-strategy", help="MLA layers: allgather-kv | ring | zigzag-ring | ulysses [default: allgather-kv]."),
        mla_kv: Optional[str] = typer.Option(None, "--mla-kv",
                                             help="MLA K/V moved as the 576-wide latent or expanded [default: latent]."),
        state_dtype: Optional[str] = typer.Option(None, "--state-dtype",
                                                  help="bf16 | fp32 (default: the model's, fp32 as in fla)."),
        tp: int = typer.Option(1, "--tp", help="Head-parallel TP degree inside each CP rank."),
        docs: Optional[int] = typer.Option(None, "--docs", help="Equal-length packed documents per sequence."),
        doc_mean: Optional[float] = typer.Option(None, "--doc-mean-tokens",
                                                 help="Exponential document lengths with this mean (seeded)."),
        seed: int = typer.Option(0, "--seed", help="Seed for --doc-mean-tokens."),
        do_sweep: bool = typer.Option(False, "--sweep", help="Sweep S and P; write table, plots and summary."),
        seq_lens: str = typer.Option("4K,8K,16K,32K,64K,128K,256K,512K,1M", "--seq-lens", help="Sweep lengths."),
        cps: str = typer.Option("2,4,8,16,32", "--cps", help="Sweep CP degrees."),
        out: Path = typer.Option(Path("reports/cp"), "--out", help="Directory for sweep outputs."),
        as_json: bool = typer.Option(False, "--json", help="Stable JSON, SI units."),
    ) -> None:
        """Context parallelism: KCP on KDA layers vs ring / zigzag / all-gather / Ulysses on MLA layers."""
        from k3sim.configs import load_hardware, load_model
        from k3sim.cp import (DEFAULT_MLA_KV, DEFAULT_MLA_STRATEGY, check_state_dtype, cp_step, default_state_dtype,
                              geometry_from_model)
        from k3sim.output import human_bytes, human_seconds, print_json, print_kv, print_table

        from k3sim.configs import Parallelism, check_layout
        from k3sim.configs.bounds import check_range

        for opt, v in (("--cp", cp_degree), ("--tp", tp)):
            check_range(v, "parallel", opt, integer=True)
        m = load_model(model)
        hw = load_hardware(hardware)
        try:  # the one layout check; its fields are the options here
            check_layout(m, Parallelism(tp=tp, cp=cp_degree), hardware=hw)
        except InputError as err:
            raise InputError(err.reason, source=f"--{(err.field or 'tp').split('.')[-1]}") from None
        g = geometry_from_model(m, tp=tp)
        # an option given as "" is bad input (checked below), not a request for the default
        sdt = default_state_dtype(m) if state_dtype is None else state_dtype
        check_state_dtype(sdt)
        if do_sweep:
            from k3sim.cp.report import write_report

            if docs is not None or doc_mean is not None:
                raise InputError("--sweep models one document per sequence; drop --docs / --doc-mean-tokens",
                                 source="--sweep")
            ignored = [o for o, v in (("--seq-len", seq_len), ("--strategy", strategy),
                                      ("--mla-strategy", mla_strategy), ("--mla-kv", mla_kv)) if v is not None]
            if ignored:
                raise InputError(f"--sweep covers every strategy and the lengths of --seq-lens; drop {', '.join(ignored)}",
                                 source="--sweep")

            grid_s, grid_p = parse_list(seq_lens, "--seq-lens"), parse_list(cps, "--cps")
            _check_a_point_runs(g, hw, grid_s, grid_p, sdt)
            res = write_report(g, hw, grid_s, grid_p, out, state_dtype=sdt, focus_cp=cp_degree)
            if as_json:
                print_json(res)
                return
            print_table("fastest strategy per layer kind (changes with S)", ["P", "layer", "fastest", "from S"],
                        [(w["cp"], w["layer"], w["fastest"], f"{w['from_seq_len']:,}") for w in res["winners"]])
            print_kv("written", [(k, v) for k, v in res["files"].items()])
            return
        S = parse_tokens("1048576" if seq_len is None else seq_len, "--seq-len")
        lengths = None
        if doc_mean is not None:
            from k3sim.cp.docs import sample_doc_lengths

            lengths = sample_doc_lengths(S, doc_mean, seed)
        try:
            r = cp_step(g, hw, S, cp_degree, "kcp" if strategy is None else strategy,
                        DEFAULT_MLA_STRATEGY if mla_strategy is None else mla_strategy, state_dtype=sdt,
                        mla_kv=DEFAULT_MLA_KV if mla_kv is None else mla_kv, docs=docs, doc_lengths=lengths)
        except InputError as err:
            # a kernel's range (T tokens per rank, docs) reached through an option: name the option
            option = KERNEL_FIELD_OPTIONS.get(err.field or "")
            if option is None or (err.source or "").startswith("--"):
                raise
            raise InputError(f"{err.reason} (reached from {option} {S if option == '--seq-len' else docs} "
                             f"with --cp {cp_degree})", source=option) from None
        if as_json:
            print_json(r)
            return
        print_kv(f"{r.model} on {r.hardware}: S={S:,}, P={r.cp}, TP={r.tp}, {r.link}", [
            ("KDA strategy / MLA strategy", f"{r.kda_strategy} / {r.mla_strategy} ({r.mla_kv})"),
            ("KDA layer: fwd bytes received per rank", human_bytes(r.kda_layer_recv_bytes_per_rank)),
            ("  of which state fragments", human_bytes(r.kda_layer_state_recv_bytes_per_rank)),
            ("MLA layer: fwd bytes received per rank", human_bytes(r.mla_layer_recv_bytes_per_rank)),
            ("KDA layer fwd+bwd", human_seconds(r.kda_layer_time_s)),
            ("MLA layer fwd+bwd", human_seconds(r.mla_layer_time_s)),
            (f"step attention ({r.num_kda_layers} KDA + {r.num_mla_layers} MLA)", human_seconds(r.step_attention_time_s)),
        ])
        print_table("breakdown per layer", ["layer", "phase", "component", "time", "source"],
                    [(b["layer"], b["phase"], b["component"], human_seconds(b["seconds_per_layer"]), b["source"])
                     for b in r.breakdown])
