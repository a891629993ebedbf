"""`k3sim sweep SCENARIO --out DIR`: a grid of layouts -> Parquet table, Pareto front (listed and plotted).

Local processes by default (`--workers`), or a Dask distributed cluster (`--scheduler tcp://HOST:PORT`).
"""

from __future__ import annotations

from pathlib import Path

import typer


def int_list(text: str | None, option: str, minimum: int = 1, kind: str = "parallel") -> list[int] | None:
    """'1,2,4' -> [1, 2, 4]: ASCII digits only (str.isdigit also passes '²', which int() refuses), each value
    >= `minimum` and inside the bounds table's `kind` range, none twice (a repeated value would be a repeated
    point); anything else is one InputError line naming the option."""
    import re

    from k3sim.configs.bounds import BOUNDS, check_range
    from k3sim.errors import InputError, shorten

    if text is None:
        return None
    out: list[int] = []
    hi = int(BOUNDS[kind].hi)
    for part in str(text).split(","):
        part = part.strip()
        digits = re.fullmatch(r"[0-9]+", part, flags=re.ASCII) is not None
        part = part.lstrip("0") or "0" if digits else part
        if not digits or (len(part) <= len(str(hi)) and int(part) < minimum):
            what = "positive integers" if minimum == 1 else f"integers >= {minimum}"
            raise InputError(f"expected comma-separated {what} (ASCII digits), got {shorten(repr(text), 60)}",
                             source=option)
        if len(part) > len(str(hi)) or int(part) > hi:  # the length first: int() of 5,000 digits raises
            raise InputError(f"{shorten(part, 30)} is outside [{minimum}, {hi:,}] {BOUNDS[kind].unit} "
                             f"({BOUNDS[kind].why})", source=option)
        value = int(part)
        if value >= 1:
            check_range(value, kind, option, integer=True)
        if value in out:
            raise InputError(f"{value} appears twice; give each value once", source=option)
        out.append(value)
    if not out:
        raise InputError("empty list", source=option)
    return out


def register(app: typer.Typer) -> None:
    from k3sim.commands.options import MODEL_SET

    @app.command("sweep")
    def sweep(
        scenario: Path = typer.Argument(..., help="scenario YAML"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        out: Path = typer.Option(None, "--out", help="output directory: new, empty or a previous sweep output "
                                 "(default ./k3sim-out/<scenario name>-sweep/)"),
        tp: str = typer.Option(None, "--tp", help="TP degrees, e.g. 4,8 (training)"),
        pp: str = typer.Option(None, "--pp", help="pipeline stages (training)"),
        virtual: str = typer.Option(None, "--virtual", help="virtual stages per rank (training)"),
        ep: str = typer.Option(None, "--ep", help="EP degrees (training)"),
        cp: str = typer.Option(None, "--cp", help="CP degrees (training)"),
        dp: str = typer.Option(None, "--dp", help="DP degrees (training; default fills the cluster)"),
        micro_batches: str = typer.Option(None, "--micro-batches", help="micro-batches per step (training; the "
                                          "global batch is kept: each sets the micro-batch size, global batch / "
                                          "(dp x micro-batches); default: derived from the global batch)"),
        global_batch: str = typer.Option(None, "--global-batch", help="sequences per step (training; default: "
                                         "the scenario's dp x micro-batches x micro_batch_size; several: a Pareto "
                                         "front per global batch)"),
        max_batch: str = typer.Option(None, "--max-batch", help="serving: engine batch limits (max_num_seqs)"),
        prefill_replicas: str = typer.Option(None, "--prefill-replicas",
                                             help="serving: prefill replicas of P:D splits (0: the scenario's fleet)"),
        requests: int = typer.Option(None, "--requests", min=1, help="serving: requests of the seeded synthetic "
                                     "chat sample per point, without --trace (default: "
                                     "k3sim.planner.sweep.SERVING_REQUESTS)"),
        trace: Path = typer.Option(None, "--trace", help="serving: a Mooncake JSONL trace every point serves "
                                   "instead of the synthetic sample (a file: every point rereads it; with "
                                   "--scheduler the workers read the same path)"),
        limit: int = typer.Option(None, "--limit", help="serving: only the first N requests of the --trace"),
        time_scale: float = typer.Option(None, "--time-scale", help="serving: multiply the --trace's own arrival "
                                         "times by S (0.5: twice the rate), keeping its timing"),
        arrival_rate: float = typer.Option(None, "--arrival-rate", help="serving: requests/s; replaces the "
                                           "--trace's own timing with a Poisson process (seed: serving.seed)"),
        workers: int = typer.Option(None, "--workers", help="local processes (1: in this process; at most one per "
                                                            "chunk is started) [default: 1]"),
        scheduler: str = typer.Option(None, "--scheduler", help="Dask scheduler address tcp://HOST:PORT"),
        chunk_size: int = typer.Option(None, "--chunk-size", min=1, help="points per task"),
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Sweep layouts of a scenario; Pareto front of tokens/s per GPU vs step time (serving: goodput per GPU
        vs p99 TTFT over batch limits and P:D splits, on a synthetic sample or the --trace)."""
        from k3sim.errors import InputError
        from k3sim.planner.inputs import load

        given = {"tp": int_list(tp, "--tp"), "pp": int_list(pp, "--pp"),
                 "virtual_stages": int_list(virtual, "--virtual"), "ep": int_list(ep, "--ep"),
                 "cp": int_list(cp, "--cp"), "dp": int_list(dp, "--dp"),
                 "num_micro_batches": int_list(micro_batches, "--micro-batches", kind="batch"),
                 "global_batch_sequences": int_list(global_batch, "--global-batch", kind="batch"),
                 "max_batch": int_list(max_batch, "--max-batch", kind="batch"),
                 "prefill_replicas": int_list(prefill_replicas, "--prefill-replicas", minimum=0, kind="replicas")}
        if requests is not None:
            from k3sim.configs.bounds import check_range

            check_range(requests, "requests", "--requests", integer=True)
        if scheduler is not None and not scheduler.startswith(("tcp://", "tls://", "inproc://")):
            raise InputError(f"expected tcp://HOST:PORT, got {scheduler!r}", source="--scheduler")
        if workers is not None:
            from k3sim.configs.bounds import check_range

            check_range(workers, "workers", "--workers", integer=True)
            if scheduler is not None:
                raise InputError("sets local processes; with --scheduler the cluster's workers run the chunks "
                                 "(drop --workers, or drop --scheduler to run locally)", source="--workers")
        workers = 1 if workers is None else workers
        from k3sim.files import check_output_dir, default_out, project_path, safe_name
        from k3sim.report.sweep import KIND, write_sweep

        scenario = project_path(scenario)  # scenarios/... works from any directory
        from k3sim.reader import probe

        if not probe(scenario, source=str(scenario), what="scenario").rereadable:
            raise InputError("is a pipe, which can be read only once, and every sweep task reads its scenario: "
                             "save it to a file first (e.g. cat ... > scenario.yaml)", source=str(scenario))
        inp = load(scenario)
        name = inp.scenario.name
        from k3sim.commands.options import SWEEP, check

        check(SWEEP, {"mode": inp.mode, "parallel": workers > 1 or scheduler is not None})  # no ignored option
        if out is None:
            out = default_out(safe_name(name, source=str(scenario), field="name") + "-sweep")
        check_output_dir(out, kind=KIND)  # refused before the grid runs
        sample = _serving_sample(inp, trace, limit, time_scale, arrival_rate, requests)
        res = _run_grid(scenario, given, workers=workers, scheduler=scheduler, chunk_size=chunk_size,
                        requests=sample, json_out=json_out)
        files = write_sweep(res, out)
        _print_sweep(res, name, out, files, json_out, _sample_facts(inp, sample), _slos(inp))


def _serving_sample(inp, trace, limit, time_scale, arrival_rate, requests):
    """What every serving point simulates: the user's --trace (`serving.run.TraceSample`: its own timing,
    scaled by --time-scale, or a Poisson --arrival-rate), else the seeded synthetic sample's size (--requests,
    default `planner.sweep.SERVING_REQUESTS`). Options that do not apply are refused in one line."""
    from k3sim.errors import InputError

    for option, value in (("--trace", trace), ("--limit", limit), ("--time-scale", time_scale),
                          ("--arrival-rate", arrival_rate)):
        if value is not None and inp.mode == "train":
            raise InputError("sets the requests of a serving sweep; a training sweep serves none: sweep a serve "
                             "scenario, or remove it", source=option)
    if trace is None:
        for option, value in (("--limit", limit), ("--time-scale", time_scale), ("--arrival-rate", arrival_rate)):
            if value is not None:
                raise InputError("applies to a --trace; the synthetic sample is sized by --requests: add --trace "
                                 "FILE, or remove it", source=option)
        from k3sim.planner.sweep import SERVING_REQUESTS

        return SERVING_REQUESTS if requests is None else requests
    if requests is not None:
        raise InputError("sizes the synthetic sample; a --trace serves its own requests: use --limit N, or "
                         "remove --requests", source="--requests")
    from k3sim.configs.bounds import check_range
    from k3sim.files import project_path
    from k3sim.serving.arrivals import check_time_scale
    from k3sim.serving.run import TraceSample, check_trace

    if limit is not None and not 1 <= limit <= 2 ** 40:  # serve --limit's sanity bound (a trace streams)
        raise InputError(f"must be between 1 and {2 ** 40:,} (got {limit})", source="--limit")
    if time_scale is not None:
        check_time_scale(time_scale)
        if arrival_rate is not None:
            raise InputError("keeps the trace's own timing, scaled, and --arrival-rate replaces that timing with a "
                             "Poisson process: give one of the two", source="--time-scale")
    if arrival_rate is not None:
        check_range(arrival_rate, "rate", "--arrival-rate")
    path = project_path(trace)
    sv = inp.scenario.serving
    hash_block = sv.engine.hash_block_tokens if sv is not None else 512
    check_trace(path, hash_block, rereads=True, limit=limit)  # every point rereads it: validated once, here
    return TraceSample(str(Path(path).resolve()), limit, time_scale, arrival_rate, sv.seed if sv is not None else 0)


def _slos(inp) -> tuple[float, float] | None:
    """(TTFT, TPOT) SLOs in seconds every serving point is judged by: the scenario's serving section's."""
    if inp.mode == "train":
        return None
    from k3sim.configs.serving import ServingConfig

    sv = inp.scenario.serving or ServingConfig()
    return sv.slo_ttft_s, sv.slo_tpot_s


def _sample_facts(inp, sample) -> dict | None:
    """The serving sample as the output reports it: where the requests come from, how many, the rate they
    offer and their mean prompt (a synthetic chat sample is light traffic of short prompts, so the output says
    which traffic the front is about)."""
    if inp.mode == "train":
        return None
    if hasattr(sample, "stream"):
        facts, stream = sample.describe(), sample.stream()
    else:
        from types import SimpleNamespace

        from k3sim.planner.plan import SERVING_WORKLOAD, serving_sample

        seed = inp.scenario.serving.seed if inp.scenario.serving is not None else 0
        facts = {"kind": "synthetic", "workload": SERVING_WORKLOAD, "seed": seed}
        stream = serving_sample(SimpleNamespace(serving=SimpleNamespace(seed=seed)), sample)
    n, first, last, tokens = 0, None, 0.0, 0
    for r in stream:
        n += 1
        first = r.arrival_s if first is None else first
        last = r.arrival_s
        tokens += r.input_tokens
    facts.update(requests=n, offered_rate_per_s=(n - 1) / (last - first) if n > 1 and last > first else None,
                 mean_input_tokens=tokens / n if n else None)
    return facts


def _run_grid(scenario: Path, given: dict, *, workers: int, scheduler, chunk_size, requests, json_out: bool):
    """Evaluate the grid (local processes or the Dask cluster) with a progress bar on stderr at a terminal;
    the bar is stopped however the run ends, so an error or Ctrl-C leaves a clean terminal."""
    import sys

    from k3sim.planner.sweep import SERVING_REQUESTS
    from k3sim.planner.sweep import sweep as run_sweep

    progress = None
    if not json_out and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress

        bar = Progress(console=Console(stderr=True), transient=True)
        bar.start()
        task = bar.add_task("sweep", total=None)
        progress = lambda done, total: bar.update(task, completed=done, total=total)  # noqa: E731
    try:
        res = run_sweep(scenario, given=given, workers=workers, scheduler=scheduler,
                        chunk_size=chunk_size, progress=progress,
                        serving_requests=SERVING_REQUESTS if requests is None else requests)  # count or TraceSample
    finally:
        if progress is not None:
            bar.stop()
    return res


# Column names of the terminal table, short enough for 80 columns (the files keep the full names).
SHORT = {"virtual_stages": "v", "num_micro_batches": "m", "micro_batch_size": "mbs",
         "global_batch_sequences": "batch", "tokens_per_step": "tok/step", "step_time_s": "step_s",
         "tokens_per_s_per_gpu": "tok/s/GPU", "prefill_replicas": "prefill", "decode_replicas": "decode"}


def _print_sweep(res, name: str, out: Path, files, json_out: bool, sample: dict | None = None,
                 slos: tuple[float, float] | None = None) -> None:
    """Counts of points evaluated / refused / fitting and the Pareto front (or all of it as JSON); a serving
    sweep says which requests it served and, when every point met the SLOs alike, what that means."""
    from k3sim.output import print_json, print_table

    df = res.table
    summary = {"scenario": name, "mode": res.mode, "points": len(df),
               "ok": int((df["status"] == "ok").sum()), "errors": int((df["status"] == "error").sum()),
               "fit": int(((df["status"] == "ok") & (df["fits"] == True)).sum()),  # noqa: E712
               "skipped": res.skipped, "wall_s": res.wall_s, "workers": res.workers, "scheduler": res.scheduler,
               "pareto_x": res.x, "pareto_y": res.y, "out": str(out), "files": files,
               "requests_source": sample, "notes": _serving_notes(res, sample, slos)}
    if json_out:
        print_json({**summary, "pareto": res.front})
        return
    dims = [c for c in ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "num_micro_batches", "micro_batch_size",
                        "global_batch_sequences", "tokens_per_step", "max_batch", "prefill_replicas",
                        "decode_replicas")
            if c in res.front.columns]
    print(f"{summary['points']} points ({summary['ok']} evaluated, {summary['errors']} refused, "
          f"{summary['fit']} fit) in {res.wall_s:.2f} s on {res.scheduler} ({res.workers} worker(s))")
    if res.skipped:
        print(f"{sum(res.skipped.values()):,} grid points skipped: "
              + "; ".join(f"{k} {v:,}" for k, v in res.skipped.items()))
    per_batch = " (one front per global batch)" if res.mode == "train" and len(res.front) and \
        res.front["global_batch_sequences"].nunique() > 1 else ""
    cols = dims + [res.x, res.y]
    print_table(f"Pareto front: {res.y} up, {res.x} down{per_batch}", [SHORT.get(c, c) for c in cols],
                [[f"{r[c]:,}" if c == "tokens_per_step" else r[c] if not isinstance(r[c], float) else f"{r[c]:.4g}"
                  for c in cols] for r in res.front.to_dict(orient="records")])
    for line in summary["notes"]:
        print(line)
    print(f"wrote {', '.join(files)}")


def _serving_notes(res, sample: dict | None, slos: tuple[float, float] | None) -> list[str]:
    """The serving sweep's requests in one line, and, when every point meets both SLOs at p99 (a load every
    layout serves: goodput is the offered rate at each), that the front then ranks by p99 TTFT at a light load,
    which favours a dedicated prefill pool where a loaded fleet can favour colocated replicas (`serve` on the
    same trace at the same rate compares them)."""
    if sample is None:
        return []
    rate = sample["offered_rate_per_s"]
    rate_text = f"{rate:.3g} requests/s offered" if rate is not None else "all at once"
    what = (f"trace {sample['trace']}" if sample["kind"] == "trace" else
            f"a seeded synthetic {sample['workload']} sample (give --trace FILE for your traffic)")
    notes = [f"requests: {what}: {sample['requests']:,} requests, {rate_text}, mean prompt "
             f"{sample['mean_input_tokens'] or 0:,.0f} tokens"]
    ok = res.fitting
    if len(ok) > 1 and slos is not None and (ok["ttft_p99_s"] <= slos[0]).all() and (ok["tpot_p99_s"] <= slos[1]).all():
        pd_points = (ok["prefill_replicas"] > 0).any()
        notes.append(f"every point meets both SLOs at p99 (TTFT <= {slos[0]:g} s, TPOT <= {slos[1]:g} s): at this "
                     "light load goodput is about the offered rate at each, so the front ranks by p99 TTFT"
                     + (", where a dedicated prefill pool answers first; under load colocated replicas can "
                        "serve more (`k3sim serve --trace ... --disaggregate P:D` at your rate compares them)"
                        if pd_points else "")
                     + "; raise the load with --time-scale < 1 or --arrival-rate on a --trace")
    return notes
