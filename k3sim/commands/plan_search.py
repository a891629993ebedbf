"""`k3sim plan SCENARIO --trace T [--arrival-rate R] --slo-ttft S --slo-tpot S [--gpus N]`: the serving search.

The question a user brings ("which layout, how many GPUs, on my traffic?") answered by
`k3sim.planner.serve_search.search`, then the usual planning report of the answer's layout (memory, decode,
CP, prefix cache), led by the search: the recommendation, the SLO that binds, the runner-ups, the front.
Exit 0 with `meets_slo: false` when no layout meets the SLOs (the closest is the answer), or 2 with
`--require-slo`; a budget no layout fits is one line naming --gpus, exit 2.
"""

from __future__ import annotations

from pathlib import Path

from k3sim.errors import InputError


def run_search(path: Path, out: Path | None, no_report: bool, json_out: bool, opts: dict) -> None:
    """Load, search, plan the answer's layout, write the report (opened before the slow part), print."""
    import typer

    from k3sim.planner.inputs import load

    inp = load(path, own_layout=False)
    if inp.mode != "serve":
        raise InputError(f"a serving search needs a serving scenario (workload.mode is '{inp.mode}'); for training "
                         "use --tokens / --days", source="--trace" if opts["trace"] is not None else "--workload")
    if no_report and out is not None:
        raise InputError("--no-report writes no files; drop --out or --no-report", source="--out")
    traffic = _traffic(inp, opts)
    sv = inp.scenario.serving
    slo_ttft = opts["slo_ttft"] if opts["slo_ttft"] is not None else (sv.slo_ttft_s if sv else 2.0)
    slo_tpot = opts["slo_tpot"] if opts["slo_tpot"] is not None else (sv.slo_tpot_s if sv else 0.1)
    for flag, v in (("--slo-ttft", slo_ttft), ("--slo-tpot", slo_tpot)):
        if not (v > 0 and v < 1e9):
            raise InputError(f"must be a positive number of seconds (got {v})", source=flag)
    written = None
    if no_report:
        res = _plan(path, inp, traffic, slo_ttft, slo_tpot, opts, json_out)
    else:
        from k3sim.commands.plan import default_report_dir
        from k3sim.files import output_dir
        from k3sim.report import write_report
        from k3sim.report.render import KIND

        written = out if out is not None else default_report_dir(path, suffix="-search", name=inp.scenario.name)
        with output_dir(written, kind=KIND):  # checked and opened before the (slow) search
            res = _plan(path, inp, traffic, slo_ttft, slo_tpot, opts, json_out)
            write_report(res, written)
    if not res.serving_search.meets_slo and opts["require_slo"]:  # the question asked was "meets?": no, in one line
        if json_out:
            _print(res, written, json_out)
            raise typer.Exit(2)
        where = f" (report: {written})" if written else ""
        raise InputError(res.serving_search.verdict() + where, source="--require-slo")
    _print(res, written, json_out)


def _traffic(inp, opts: dict):
    from k3sim.files import project_path
    from k3sim.planner.serve_search import load_traffic
    from k3sim.reader import probe

    trace = opts["trace"]
    if trace is not None and opts["workload"] is not None:
        raise InputError("give one of --trace FILE or --workload NAME, not both", source="--workload")
    if trace is not None:
        trace = project_path(trace)
        probe(trace, source=f"--trace {trace}", what="Mooncake JSONL trace")
    elif opts["workload"] not in _workloads():
        raise InputError(f"unknown workload '{opts['workload']}' (choose {', '.join(_workloads())})", source="--workload")
    if opts["arrival_rate"] is not None and opts["time_scale"] is not None:
        raise InputError("--arrival-rate replaces the traffic's arrival times and --time-scale stretches them: "
                          "give one", source="--time-scale")
    if opts["arrival_rate"] is not None and not (0 < opts["arrival_rate"] <= 1e6):
        raise InputError(f"must be a positive rate in requests/s up to 1e6 (got {opts['arrival_rate']})",
                         source="--arrival-rate")
    seed = inp.scenario.serving.seed if inp.scenario.serving else 0
    n = opts["requests"] or 1000
    return load_traffic(trace=trace, workload=opts["workload"], arrival_rate=opts["arrival_rate"], seed=seed,
                        n_requests=n, limit=opts["requests"] if trace is not None else None,
                        time_scale=opts["time_scale"])


def _workloads() -> tuple[str, ...]:
    from k3sim.workloads.synthetic import SYNTHETIC_WORKLOADS

    return tuple(SYNTHETIC_WORKLOADS)


def _plan(path: Path, inp, traffic, slo_ttft: float, slo_tpot: float, opts: dict, json_out: bool):
    """The search, then the plan of the layout it answers with (recommended, or the closest)."""
    from k3sim.commands.plan import progress_bar
    from k3sim.planner.plan import plan_searched
    from k3sim.planner.serve_search import FINALISTS, SCREEN_REQUESTS, search
    from k3sim.procs import worker_count

    bar = progress_bar(json_out)
    kw = dict(slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, percentile=opts["slo_percentile"], gpus=opts["gpus"],
              screen_requests=opts["screen_requests"] or SCREEN_REQUESTS, finalists=opts["finalists"] or FINALISTS,
              workers=worker_count(opts["workers"], 1 << 16), scheduler=opts["scheduler"])
    if bar is None:
        result = search(inp.path, traffic, **kw)
    else:
        with bar:
            task = bar.add_task("search", total=None)

            def tick(stage: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, description=f"search: {stage}")

            result = search(inp.path, traffic, **kw, progress=tick)
    return plan_searched(path, inp, result)


def _print(res, written, json_out: bool) -> None:
    from k3sim.output import print_json, print_kv, print_table
    from k3sim.planner.serve_search import describe

    s = res.serving_search
    if json_out:
        data = res.to_json()
        data["report_dir"] = str(written) if written else None
        print_json(data)
        return
    print(f"scenario {res.scenario}: serving search on {s.traffic}")
    print(f"answer: {s.verdict()}")
    rows = [[i + 1, r["gpus"], describe(r), f"{r['ttft_s']:.3g}", f"{r['tpot_s'] * 1e3:.3g}",
             f"{r['goodput_requests_per_s_per_gpu']:.3g}", "yes" if r["meets_slo"] else "no"]
            for i, r in enumerate(s.top)]
    pct = f"p{s.percentile}"
    print_table("best layouts (whole traffic for the finalists, the screen for the rest)",
                ["#", "GPUs", "layout", f"{pct} TTFT s", f"{pct} TPOT ms", "goodput req/s/GPU", "meets SLO"], rows)
    kv = [("candidates", f"{s.candidates:,}"), ("pruned", ", ".join(f"{k} {v:,}" for k, v in s.pruned.items()) or "none"),
          ("simulated", f"{len(s.screened):,} on {s.screen_requests:,} requests, {len(s.finals)} on all "
                        f"{s.traffic_requests:,}"),
          ("Pareto front", f"{len(s.front)} layouts"), ("search time", f"{s.wall_s:.1f} s")]
    if written:
        kv.append(("report", f"{written}/report.md, {written}/report.html"))
    print_kv("serving search", kv)
