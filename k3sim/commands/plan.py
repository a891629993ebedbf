"""`k3sim plan [SCENARIO] --out DIR`: the planning report of a scenario (default scenarios/default.yaml).

Writes `report.md`, `report.html`, `plan.json` and `figures/` to `--out` (default
`./k3sim-out/<scenario name>/` under the working directory), whole, through `k3sim.files.output_dir`
(kind `plan`): the directory is checked before planning, and an existing one that is neither empty nor a
previous plan report is refused. A layout that does not fit still gets its report (the memory figures and the verdict), then
the verdict is the one error line and the exit code is 2, as for every plan that does not fit.

`--tokens N --days D` (or the scenario's training.tokens / training.days) adds the token budget: the smallest
cluster and its layout that trains N tokens in D days (`k3sim.planner.budget`; `--max-gpus` caps the clusters
tried). A budget no layout meets is reported the same way: the report, then one line with the best layout's
figures, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import typer

from k3sim.configs.bounds import option_range

DEFAULT_SCENARIO = Path("scenarios/default.yaml")


def scenario_path(path: Path) -> Path:
    """The path as given, or (a relative path missing from the working directory) the project's copy."""
    from k3sim.files import project_path

    return project_path(path)


def pick_scenario(positional: Path | None, option: Path | None) -> Path:
    """`k3sim plan X` and `k3sim plan --scenario X` are the same; both at once must agree."""
    from k3sim.errors import InputError

    if positional is not None and option is not None and positional != option:
        raise InputError(f"two scenarios given ({positional} and {option}); give one", source="--scenario")
    return scenario_path(positional or option or DEFAULT_SCENARIO)


def default_report_dir(path: Path, suffix: str = "", name: str | None = None) -> Path:
    """`./k3sim-out/<scenario name><suffix>/`; the name must be one path component (`k3sim.files.safe_name`).
    `name`: the scenario's name when the caller has loaded it (a scenario from a pipe is read once)."""
    from k3sim.files import default_out, safe_name

    if name is None:
        from k3sim.configs.loaders import load_scenario

        name = load_scenario(path).name
    return default_out(safe_name(name, source=str(path), field="name") + suffix)


def progress_bar(json_out: bool):
    """A rich progress display on stderr (sections of the plan); None with --json or off a terminal."""
    import sys

    if json_out or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import Progress

    return Progress(console=Console(stderr=True), transient=True)


def register(app: typer.Typer) -> None:
    """Registers the command. Over 100 lines, with the command it defines: a typer command's signature is its
    option list (one parameter per option, as typer reads them); the body stays short."""
    from k3sim.commands.options import MODEL_SET

    @app.command("plan")
    def plan(
        scenario_arg: Path = typer.Argument(None, help="scenario YAML "
                                            "(default scenarios/default.yaml)", show_default=False),
        scenario: Path = typer.Option(None, "--scenario", help="scenario YAML (same as the argument)"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        out: Path = typer.Option(None, "--out", help="report directory: new, empty or a previous plan report "
                                 "(default ./k3sim-out/<scenario name>/)"),
        no_report: bool = typer.Option(False, "--no-report", help="compute and print only; write no files"),
        serving_requests: int = typer.Option(None, "--serving-requests", min=1,
                                             help="requests of the serving simulation sample (default: the "
                                                  "serving package's report sample)"),
        tokens: float = typer.Option(None, "--tokens", callback=option_range("train_tokens", "--tokens", integer=False),
                                     help="training: token budget, e.g. 15e12 (with --days; overrides "
                                          "training.tokens) [default: training.tokens]"),
        days: float = typer.Option(None, "--days", callback=option_range("train_days", "--days", integer=False),
                                   help="training: wall-clock days the token budget may take (overrides "
                                        "training.days) [default: training.days]"),
        max_gpus: int = typer.Option(None, "--max-gpus", callback=option_range("gpus", "--max-gpus"),
                                     help="training: the largest cluster the token budget's sweep tries "
                                          "[default: the bounds table's GPU maximum, 1,048,576]"),
        trace: Path = typer.Option(None, "--trace", help="serving search: the user's Mooncake JSONL trace"),
        workload: str = typer.Option(None, "--workload", help="serving search: a synthetic workload instead of "
                                     "a trace (chat | system-prompts | agent | rag)"),
        arrival_rate: float = typer.Option(None, "--arrival-rate", help="serving search: Poisson arrivals at this "
                                           "rate (req/s) over the traffic's requests [default: their own times]"),
        time_scale: float = typer.Option(None, "--time-scale", help="serving search: the trace's own arrival "
                                         "times x this factor (0.5 = twice the rate)"),
        slo_ttft: float = typer.Option(None, "--slo-ttft", help="serving search: TTFT SLO (s) [default: "
                                       "serving.slo_ttft_s]"),
        slo_tpot: float = typer.Option(None, "--slo-tpot", help="serving search: TPOT SLO (s) [default: "
                                       "serving.slo_tpot_s]"),
        slo_percentile: int = typer.Option(99, "--slo-percentile", help="serving search: the percentile the "
                                           "SLOs hold at (50 | 90 | 99)"),
        gpus: int = typer.Option(None, "--gpus", callback=option_range("gpus", "--gpus"),
                                 help="serving search: GPU budget [default: the scenario's cluster]"),
        requests: int = typer.Option(None, "--requests", min=1, help="serving search: synthetic --workload size "
                                     "(a --trace: its first N requests) [default: 1000 / the whole trace]"),
        screen_requests: int = typer.Option(None, "--screen-requests", min=1, help="serving search: requests "
                                            "of the screening runs [default: 600]"),
        finalists: int = typer.Option(None, "--finalists", min=1, help="serving search: screened layouts "
                                      "run on the whole traffic [default: 6]"),
        workers: int = typer.Option(None, "--workers", min=1, help="serving search: local worker processes "
                                    "[default: one per core]"),
        dask_scheduler: str = typer.Option(None, "--scheduler", help="serving search: a Dask scheduler "
                                           "address (tcp://HOST:PORT) instead of local processes"),
        require_slo: bool = typer.Option(False, "--require-slo", help="serving search: exit 2 when no layout "
                                         "meets the SLOs (default: exit 0, meets_slo false)"),
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Plan a scenario: memory, step time or serving latency, CP, decode, prefix cache, report. With a
        serving scenario and --trace / --workload, a search for the cheapest layout meeting the SLOs."""
        search_opts = {"trace": trace, "workload": workload, "arrival_rate": arrival_rate, "time_scale": time_scale,
                       "slo_ttft": slo_ttft, "slo_tpot": slo_tpot, "gpus": gpus, "requests": requests,
                       "screen_requests": screen_requests, "finalists": finalists, "workers": workers,
                       "scheduler": dask_scheduler, "require_slo": require_slo, "slo_percentile": slo_percentile}
        if trace is not None or workload is not None:
            from k3sim.commands.plan_search import run_search

            run_search(pick_scenario(scenario_arg, scenario), out, no_report, json_out, search_opts)
            return
        _refuse_search_only(search_opts)
        from k3sim.errors import DoesNotFit
        from k3sim.output import print_json, print_kv
        from k3sim.planner.plan import plan as run_plan
        from k3sim.planner.plan import SECTIONS

        path = pick_scenario(scenario_arg, scenario)
        from k3sim.commands.options import PLAN, check
        from k3sim.planner.inputs import load

        if serving_requests is not None:  # bounds.py's range, named as the user wrote it (not --requests)
            from k3sim.configs.bounds import check_range

            check_range(serving_requests, "requests", "--serving-requests", integer=True)
        inp = load(path, own_layout=True)  # read once: the scenario may be a pipe
        check(PLAN, {"mode": inp.mode, "scenario_tokens": inp.training.tokens is not None,
                     "scenario_days": inp.training.days is not None})  # every option given changes the plan
        budget = {"tokens": tokens, "days": days, "max_gpus": max_gpus}
        if no_report and out is not None:
            from k3sim.errors import InputError

            raise InputError("--no-report writes no files; drop --out or --no-report", source="--out")
        if no_report:
            res = _run(path, inp, serving_requests, json_out, run_plan, SECTIONS, budget)
            written = None
        else:
            from k3sim.files import output_dir
            from k3sim.report import write_report
            from k3sim.report.render import KIND

            written = out if out is not None else default_report_dir(path, name=inp.scenario.name)
            with output_dir(written, kind=KIND):  # checked and opened before the (slow) plan
                res = _run(path, inp, serving_requests, json_out, run_plan, SECTIONS, budget)
                write_report(res, written)
        if json_out:
            data = res.to_json()
            data["report_dir"] = str(written) if written else None
            print_json(data)
        else:
            print(f"scenario {res.scenario}: {res.description}".rstrip(": "))
            from k3sim.output import human_seconds

            degrees = ", ".join(f"{k}={res.parallelism[k]}" for k in ("tp", "pp", "virtual_stages", "ep", "cp", "dp")
                                if k in ("tp", "pp") or res.parallelism.get(k, 1) != 1)
            print(f"cluster: {res.cluster['num_gpus']} x {res.hardware}, {res.replicas} replica(s); layout {degrees}")
            kv = {"verdict": res.verdict}
            t = res.training
            if t is not None:
                kv.update({"step time": human_seconds(t.step_time_s), "tokens/s": f"{t.tokens_per_s:,.0f}",
                           "MFU": f"{100 * t.mfu:.1f} %", "pipeline bubble ratio": f"{t.bubble_ratio:.3f}"})
                kv.update({f"exposed {k.upper()} communication": human_seconds(v)
                           for k, v in t.exposed_comm_s.items() if v})
            if res.memory is not None and hasattr(res.memory, "max_concurrent_requests"):
                kv["max concurrent requests"] = res.memory.max_concurrent_requests
            srv = res.serving or {}
            for k, label in (("requests", "requests simulated"), ("ttft_p99_s", "TTFT p99"), ("tpot_p99_s", "TPOT p99"),
                             ("goodput_requests_per_s", "goodput (requests/s within both SLOs)"),
                             ("throughput_output_tokens_per_s_per_gpu", "output tokens/s per GPU"),
                             ("token_hit_rate", "prefix-cache token hit rate")):
                if k in srv:
                    v = srv[k]
                    kv[label] = (human_seconds(v) if k.endswith("_s") and not k.endswith("per_s")
                                 else f"{100 * v:.1f} %" if k == "token_hit_rate"
                                 else f"{v:.4g}" if isinstance(v, float) else v)
            kv.update(_budget_lines(res.token_budget))
            if written:
                kv["report"] = f"{written}/report.md, {written}/report.html"
            print_kv(f"plan of {res.scenario}", list(kv.items()))
        b = res.token_budget
        if b is not None and not b.met:  # the question asked: answered no, with the best layout's figures
            from k3sim.errors import InputError

            if json_out:
                raise typer.Exit(2)
            given = "--days" if days is not None else "--tokens" if tokens is not None else None
            raise InputError(b.shortfall(), source=given or str(path), field=None if given else "training.days")
        if not res.fits:
            if json_out:
                raise typer.Exit(2)
            raise DoesNotFit(res.verdict, source=str(path))  # the report path is in the table above


def _refuse_search_only(opts: dict) -> None:
    """A search option without the traffic it searches on changes nothing: refused, naming the option."""
    from k3sim.errors import InputError

    for key, flag in (("arrival_rate", "--arrival-rate"), ("time_scale", "--time-scale"), ("slo_ttft", "--slo-ttft"),
                      ("slo_tpot", "--slo-tpot"), ("gpus", "--gpus"), ("requests", "--requests"),
                      ("screen_requests", "--screen-requests"), ("finalists", "--finalists"),
                      ("workers", "--workers"), ("scheduler", "--scheduler")):
        if opts[key] is not None:
            raise InputError("is a serving-search option: give the traffic to search on (--trace FILE or "
                             "--workload NAME)", source=flag)
    if opts["require_slo"] or opts["slo_percentile"] != 99:
        raise InputError("is a serving-search option: give the traffic to search on (--trace FILE or "
                         "--workload NAME)", source="--require-slo" if opts["require_slo"] else "--slo-percentile")


def _run(path, inp, serving_requests, json_out, run_plan, sections, budget):
    """The plan of the loaded inputs `inp`, with a progress bar at a terminal; `budget`: the token-budget
    options (tokens, days, max_gpus; None = the scenario's)."""
    bar = progress_bar(json_out)
    if bar is None:
        return run_plan(path, serving_requests=serving_requests, inputs=inp, **budget)
    with bar:
        task = bar.add_task("planning", total=len(sections))
        return run_plan(path, serving_requests=serving_requests, inputs=inp, **budget,
                        progress=lambda name: bar.update(task, advance=1, description=f"plan: {name}"))


def _budget_lines(b) -> dict[str, str]:
    """The token budget's answer as lines of the text output (none without a budget)."""
    if b is None:
        return {}
    from k3sim.planner.budget import layout_text

    out = {"token budget": f"{b.tokens:.3g} tokens in {b.days:g} days: {b.required_tokens_per_s:,.0f} tokens/s "
                           f"at {', '.join(f'{t:,}' for t in b.global_batch_sequences)} sequences per step"}
    for name, r in (("smallest cluster", b.chosen), ("runner-up", b.runner_up), ("best found", b.best)):
        if r is not None:
            plan_days = f"; k3sim plan of it: {r['plan_days']:.1f} days" if "plan_days" in r else ""
            out[name] = (f"{r['gpus']:,} GPUs, {layout_text(r)}: {r['tokens_per_s']:,.0f} tokens/s, "
                         f"{r['days']:.1f} days{plan_days}")
    swept = [c["gpus"] for c in b.clusters]
    if swept:
        out["budget sweep"] = (f"clusters {swept[0]:,} to {swept[-1]:,} GPUs: {sum(c['points'] for c in b.clusters):,} "
                               f"layouts, {sum(c['priced'] for c in b.clusters):,} priced, in {b.wall_s:.1f} s")
    return out
