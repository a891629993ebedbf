"""`k3sim serve`: a fleet of replicas under a request trace: TTFT, TPOT, latency, throughput, goodput, hit rate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from k3sim.commands.scale import MLA_KERNEL_HELP, layout_overrides
from k3sim.configs.bounds import option_range

SUMMARY_KEYS = ["requests", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s",
                "throughput_requests_per_s", "throughput_output_tokens_per_s_per_gpu", "goodput_requests_per_s",
                "token_hit_rate", "mean_requests_in_system", "mean_e2e_s", "sim_seconds"]


def _rates(text: str) -> list[float]:
    """'0.5,1,2' or 'lo:hi:n' (n evenly spaced rates from lo to hi)."""
    from k3sim.configs.bounds import check_range
    from k3sim.errors import InputError

    def num(x: str) -> float:
        try:
            v = float(x)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"rates must be positive numbers of requests/s, got '{x.strip()[:40]}'",
                             source="--sweep-rate")
        return check_range(v, "rate", "--sweep-rate")

    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise InputError(f"expected LO:HI:N or a comma-separated list, got '{text}'", source="--sweep-rate")
        lo, hi = num(parts[0]), num(parts[1])
        try:
            n = int(parts[2])
        except ValueError:
            n = 0
        if n < 2 or n > 256 or hi <= lo:
            raise InputError(f"LO:HI:N needs LO < HI and 2 <= N <= 256, got '{text}'", source="--sweep-rate")
        return [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    out = [num(x) for x in text.split(",") if x.strip()]
    if not out:
        raise InputError("needs at least one rate", source="--sweep-rate")
    return sorted(set(out))


def _pool_bytes(text: Optional[str]):
    from k3sim.errors import InputError

    if text is None:
        return None
    if text.strip().lower() in ("unbounded", "none", "inf"):
        return "unbounded"
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise InputError(f"expected a positive number of bytes per GPU or 'unbounded', got '{text}'",
                         source="--pool-bytes")
    return v


def _progress(total: int | None):
    """A progress bar on stderr for long runs at a terminal (arrived requests); None otherwise."""
    import sys

    if not sys.stderr.isatty() or (total is not None and total < 2000):
        return None, None
    prog, task = _bar("serving", total)
    return prog, (lambda n: prog.advance(task, n))


def _bar(label: str, total: int | None):
    """A started transient rich progress bar on stderr and its task (the caller checked stderr is a terminal:
    piped, nothing is drawn, and stdout's bytes never depend on it)."""
    from rich.console import Console
    from rich.progress import Progress

    prog = Progress(console=Console(stderr=True), transient=True)
    task = prog.add_task(label, total=total)
    prog.start()
    return prog, task


def _rate_progress(rates: int):
    """(bar, progress(done, total)) for a rate sweep at a terminal (each rate is a whole run: seconds to
    minutes); (None, None) when stderr is piped."""
    import sys

    if not sys.stderr.isatty():
        return None, None
    prog, task = _bar(f"rate sweep ({rates} rates)", rates)
    return prog, (lambda done, total: prog.update(task, completed=done, total=total))


def register(app: typer.Typer) -> None:
    """Registers the command. Over 100 lines, with the command it defines: a typer command's signature is its
    option list (one parameter per option, as typer reads them); the body stays short."""
    from k3sim.commands.options import MODEL_SET

    @app.command("serve")
    def serve(
        scenario: Path = typer.Option(Path("scenarios/default.yaml"), "--scenario", help="scenario YAML"),
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        trace: Optional[Path] = typer.Option(None, "--trace", help="Mooncake JSONL trace"),
        workload: Optional[str] = typer.Option(None, "--workload",
                                               help="synthetic instead of a trace: chat | system-prompts | agent | "
                                                    "rag | stream (block ids made on the fly: any size)"),
        n_requests: int = typer.Option(1000, "--requests", help="synthetic --workload size (a --trace: --limit)"),
        arrival_rate: Optional[float] = typer.Option(None, "--arrival-rate",
                                                     help="requests/s: replaces the trace's own timing (bursts, "
                                                          "think times) with a Poisson (or --arrival gamma) "
                                                          "process; to keep that timing use --time-scale"),
        time_scale: Optional[float] = typer.Option(None, "--time-scale", help="multiply the trace's own arrival "
                                                   "times by S (0.5: twice the rate), keeping its conversation "
                                                   "timing; not with --arrival-rate or --sweep-rate"),
        arrival: str = typer.Option("poisson", "--arrival", help="with --arrival-rate or --sweep-rate: poisson | gamma"),
        arrival_cv: float = typer.Option(2.0, "--arrival-cv", help="with --arrival gamma: coefficient of variation "
                                                                     "of the gaps"),
        cache_policy: Optional[str] = typer.Option(None, "--cache-policy", help="coarse | decoupled | full-attention"),
        pool_bytes: Optional[str] = typer.Option(None, "--pool-bytes",
                                                 help="per-GPU pool bytes or 'unbounded' [default: memory planner]"),
        host_pool_bytes: Optional[float] = typer.Option(
            None, "--host-pool-bytes", help="per-GPU host-memory tier under the pool for evicted KV pages and state "
            "checkpoints (bytes; 0: none); restores at the profile's host link [default: "
            "serving.engine.host_pool_bytes, 0]"),
        router: Optional[str] = typer.Option(None, "--router", help="round-robin | least-loaded | prefix-aware"),
        disaggregate: Optional[str] = typer.Option(None, "--disaggregate", help="P:D prefill:decode replicas"),
        replicas: Optional[int] = typer.Option(None, "--replicas", help="replicas of the layout (a what-if: may "
                                                                        "exceed the cluster) [default: serving "
                                                                        "section or cluster GPUs / GPUs per replica]"),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="vllm | sarathi"),
        pp_microbatches: Optional[bool] = typer.Option(None, "--pp-microbatches/--no-pp-microbatches",
                                                       help="pp batches in flight per replica (pp engines on "
                                                            "shares of the pool), as engines run [default: serving "
                                                            "section, on; one batch with attention DP]"),
        attention_dp: Optional[int] = typer.Option(None, "--attention-dp", callback=option_range("parallel", "--attention-dp"),
                                                   help="attention data-parallel ranks per replica (parallelism.dp) "
                                                        "[default: the scenario's]"),
        ep: Optional[int] = typer.Option(None, "--ep", callback=option_range("parallel", "--ep"),
                                         help="expert-parallel ranks [default: the scenario's]"),
        ep_kernel: Optional[str] = typer.Option(None, "--ep-kernel", help="EP all-to-all: normal | low-latency | "
                                                "nccl | auto [default: the scenario's, auto]"),
        dispatch_dtype: Optional[str] = typer.Option(None, "--dispatch-dtype",
                                                     help="fp8 | bf16 | auto [default: the scenario's, auto]"),
        redundant_experts: Optional[int] = typer.Option(None, "--redundant-experts",
                                                        help="extra expert slots over the EP ranks (EPLB)"),
        max_nodes_per_token: Optional[int] = typer.Option(None, "--max-nodes-per-token",
                                                          callback=option_range("parallel", "--max-nodes-per-token"),
                                                          help="node-limited routing [default: unlimited]"),
        tbo: Optional[bool] = typer.Option(None, "--tbo/--no-tbo", help="two-batch overlap [default: the "
                                           "scenario's, off]"),
        tbo_variant: Optional[str] = typer.Option(None, "--tbo-variant", help="overlap | five-stage | auto"),
        routing_zipf: Optional[float] = typer.Option(None, "--routing-zipf", "--zipf", help="router skew: Zipf exponent of "
                                                     "expert popularity [default: the scenario's, 0]"),
        mla_kernel: Optional[str] = typer.Option(None, "--mla-kernel", help=MLA_KERNEL_HELP + " [default: the "
                                                 "scenario's, measured]"),
        mtp: Optional[int] = typer.Option(None, "--mtp", help="MTP draft tokens per decode step (serving.mtp)"),
        acceptance: Optional[float] = typer.Option(None, "--acceptance", help="per-draft acceptance rate "
                                                   "(serving.acceptance)"),
        slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="goodput: TTFT SLO (s)"),
        slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="goodput: TPOT SLO (s)"),
        seed: Optional[int] = typer.Option(None, "--seed", help="arrival and synthetic seed [default: serving.seed]"),
        limit: Optional[int] = typer.Option(None, "--limit", help="serve only the first N requests of the --trace"),
        sweep_rate: Optional[str] = typer.Option(None, "--sweep-rate",
                                                 help="rates (req/s) 'a,b,c' or 'LO:HI:N': one run each, plots"),
        processes: Optional[int] = typer.Option(None, "--processes",
                                                help="sweep workers (default: one per core; at most one per rate)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory (new, empty or a previous serve output "
                                           "of the same kind): per-request table, time series, plots"),
        bands: bool = typer.Option(False, "--bands", help="also serve at both ends of the step model's error band "
                                   "(from the project's whole-step checks): *_low / *_high figures, 3x the run time"),
        json_out: bool = typer.Option(False, "--json", help="print JSON (SI units)"),
    ) -> None:
        """Serve a trace on the scenario's fleet: continuous batching, chunked prefill, hybrid prefix cache."""
        from k3sim.commands.options import given_options
        from k3sim.commands.scale import ep_errors_named

        _check_run_options(arrival_rate, arrival, arrival_cv, processes, limit, n_requests, workload)
        rates = _rates(sweep_rate) if sweep_rate is not None else None
        _check_timing(time_scale, arrival_rate, rates)
        if out is not None:  # an --out k3sim may not write is refused before the run
            from k3sim.files import check_output_dir
            from k3sim.serving.report import RUN_KIND, SWEEP_KIND

            check_output_dir(out, kind=SWEEP_KIND if rates is not None else RUN_KIND)
        setup, source, label, total = _serve_setup(
            scenario, trace=trace, workload=workload, n_requests=n_requests, arrival=arrival, arrival_cv=arrival_cv,
            cache_policy=cache_policy, pool_bytes=pool_bytes, host_pool_bytes=host_pool_bytes, router=router,
            disaggregate=disaggregate, replicas=replicas, scheduler=scheduler, pp_microbatches=pp_microbatches, slo_ttft=slo_ttft,
            slo_tpot=slo_tpot, seed=seed, limit=limit, sweep=rates is not None, time_scale=time_scale,
            layout=layout_overrides(dp=attention_dp, ep=ep, ep_kernel=ep_kernel, dispatch_dtype=dispatch_dtype,
                                    redundant_experts=redundant_experts, max_nodes_per_token=max_nodes_per_token,
                                    tbo=tbo, tbo_variant=tbo_variant, routing_zipf=routing_zipf,
                                    mla_decode_kernel=mla_kernel),
            mtp=mtp, acceptance=acceptance)
        if bands and rates is not None:
            from k3sim.errors import InputError

            raise InputError("serves each rate once more at both ends of the error band; give it without "
                             "--sweep-rate (one run), or drop it", source="--bands")
        if rates is not None:
            with ep_errors_named(given_options()[0], batch_option="--ep-kernel"):
                _serve_rate_sweep(setup, source, label, rates, processes=processes, out=out, json_out=json_out)
            return
        with ep_errors_named(given_options()[0], batch_option="--ep-kernel"):
            _serve_one(setup, source, label, arrival_rate, total, out=out, json_out=json_out, bands=bands)



def _check_timing(time_scale, arrival_rate, rates) -> None:
    """One way to time the requests: --arrival-rate or --sweep-rate (a Poisson or gamma process replaces the
    trace's timing), or --time-scale (keeps it, scaled)."""
    from k3sim.errors import InputError

    if rates is not None and arrival_rate is not None:
        raise InputError("give --arrival-rate or --sweep-rate, not both", source="--sweep-rate")
    if time_scale is None:
        return
    from k3sim.serving.arrivals import check_time_scale

    check_time_scale(time_scale)
    other = "--arrival-rate" if arrival_rate is not None else "--sweep-rate" if rates is not None else None
    if other is not None:
        raise InputError(f"keeps the trace's own timing, scaled, and {other} replaces that timing with a Poisson "
                         "process: give one of the two", source="--time-scale")


def _check_run_options(arrival_rate, arrival, arrival_cv, processes, limit, n_requests, workload) -> None:
    """The options of the run itself (arrivals, workers, sizes), each in its range, before any work."""
    from k3sim.errors import InputError

    from k3sim.configs.bounds import check_range

    if arrival_rate is not None:
        check_range(arrival_rate, "rate", "--arrival-rate")
        if arrival_rate <= 0:
            raise InputError(f"must be a positive number of requests/s (got {arrival_rate})",
                             source="--arrival-rate")
    if arrival not in ("poisson", "gamma"):
        raise InputError(f"unknown arrival process '{arrival}' (choose poisson, gamma)", source="--arrival")
    # gamma gaps with cv above 100 are all but one huge gap (a modelling-choice bound against typos)
    if not (math.isfinite(arrival_cv) and 0 < arrival_cv <= 100):
        raise InputError(f"must be a number in (0, 100] (got {arrival_cv})", source="--arrival-cv")
    if processes is not None:  # bounds.py's range; at most one worker per rate is started
        check_range(processes, "workers", "--processes", integer=True)
    for opt, v, hi in (("--limit", limit, 2 ** 40), ("--requests", n_requests, 10 ** 9)):
        # modelling-choice sanity bounds (a streamed workload may be as long as a trace)
        if v is not None and not 1 <= v <= hi:
            raise InputError(f"must be between 1 and {hi:,} (got {v})", source=opt)
    if workload is not None and workload != "stream":
        check_range(n_requests, "requests", "--requests", integer=True)  # held in memory: bounds.py's range


def _serve_setup(scenario: Path, *, trace, workload, n_requests, arrival, arrival_cv, cache_policy, pool_bytes,
                 router, disaggregate, replicas, scheduler, pp_microbatches, slo_ttft, slo_tpot, seed, limit,
                 sweep: bool, layout: dict | None = None, mtp: int | None = None, acceptance: float | None = None,
                 time_scale: float | None = None, host_pool_bytes: float | None = None):
    """The fleet and the request source the options name, checked before any request is served (every
    option given must change the run; a trace a sweep rereads is validated first). Returns the setup, the
    source (a function of the arrival rate), the run's label and the request count for the progress bar."""
    from k3sim.errors import InputError
    from k3sim.files import project_path
    from k3sim.serving.run import ServeSetup, check_trace, request_source

    from k3sim.commands.scale import layout_errors_named

    with layout_errors_named(layout or {}):
        setup = ServeSetup.from_scenario(project_path(scenario), cache_policy=cache_policy,
                                         pool_bytes=_pool_bytes(pool_bytes), router=router, disaggregate=disaggregate,
                                         slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, replicas=replicas,
                                         scheduler=scheduler, seed=seed, pp_microbatches=pp_microbatches,
                                         layout=layout or None, mtp=mtp, acceptance=acceptance,
                                         host_pool_bytes=host_pool_bytes)
    from k3sim.commands.options import SERVE, check, serve_facts

    check(SERVE, serve_facts(setup, project_path(scenario)))  # every option given changes the run
    seed_v = setup.serving.seed
    if trace is not None:
        trace = project_path(trace)
        # a single run validates the trace while it consumes it (one pass, so a pipe works), hence no request
        # count for the progress bar; a sweep, which rereads it, validates it first
        check_trace(trace, setup.pools[0].cache.effective_hash_block_tokens, rereads=sweep,
                    limit=limit)
        total = None
    elif workload is not None:
        from k3sim.workloads.synthetic import SYNTHETIC_WORKLOADS

        if workload not in (*SYNTHETIC_WORKLOADS, "stream"):
            raise InputError(f"unknown workload '{workload}' (choose {', '.join(SYNTHETIC_WORKLOADS)}, stream)",
                             source="--workload")
        total = n_requests
    else:
        raise InputError("give exactly one of --trace FILE or --workload NAME", source="--trace")
    source = request_source(trace=trace, workload=workload, n_requests=n_requests, seed=seed_v,
                            arrival=arrival, cv=arrival_cv, limit=limit, time_scale=time_scale)
    label = f"{setup.scenario_name}: {trace.name if trace is not None else workload}"
    if time_scale is not None:
        label += f" (times x {time_scale:g})"
    return setup, source, label, total


def _serve_rate_sweep(setup, source, label: str, rates: list[float], *, processes, out, json_out: bool) -> None:
    """One run per arrival rate (in worker processes, warmed on the first requests of the fastest rate), then
    the knee of throughput against rate: printed, and with --out written as tables and plots."""
    import itertools

    from k3sim.files import output_dir
    from k3sim.output import print_json, print_table
    from k3sim.serving.run import sweep_rates

    warm = source(max(rates))
    prog, tick = _rate_progress(len(rates))
    try:
        df = sweep_rates(setup, source, rates, processes=processes, warm=itertools.islice(warm, 300), progress=tick)
    finally:
        if prog is not None:
            prog.stop()
    files, knee = {}, None
    if out is not None:
        from k3sim.serving.report import SWEEP_KIND, write_sweep

        with output_dir(out, kind=SWEEP_KIND) as d:
            files, knee = write_sweep(d, df, f"{label}: rate sweep")
    else:
        from k3sim.serving.report import knee_rate

        knee = knee_rate(df["arrival_rate"], df["throughput_requests_per_s"])
    if json_out:
        print_json({"knee_arrival_rate": knee, "files": files, "rows": df})
        return
    cols = ["arrival_rate", "throughput_requests_per_s", "goodput_requests_per_s", "ttft_p50_s",
            "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "token_hit_rate", "overloaded", "wall_s"]
    print_table(f"rate sweep: {label}", cols,
                [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
                 for row in df[cols].itertuples(index=False)])
    print(f"knee: {knee:.4g} requests/s" if knee is not None else "knee: not reached at these rates")
    over = df[df["overloaded"]]
    if len(over):
        print(f"overloaded from {over['arrival_rate'].min():.4g} requests/s: the queue grows, so those rows' TTFTs "
              "grow with the trace's length; the fleet sustains about "
              f"{over['sustainable_rate_per_s'].median():.4g} requests/s (median of their completion rates)")
    for k, v in files.items():
        print(f"{k}: {v}")


def _serve_one(setup, source, label: str, arrival_rate, total, *, out, json_out: bool, bands: bool = False) -> None:
    """One serving run (a progress bar at a terminal for long ones), with --out its per-request table, time
    series and plots, then its summary; `bands`: the same requests served again at both ends of the error band."""
    from k3sim.files import output_dir
    from k3sim.serving.run import simulate

    prog, tick = _progress(total)
    try:
        requests = list(source(arrival_rate)) if bands else source(arrival_rate)
        res = simulate(setup, requests, progress=tick)
    finally:
        if prog is not None:
            prog.stop()
    if bands:
        res.summary.update(band_fields(setup, requests))
    files = {}
    if out is not None:
        from k3sim.serving.report import RUN_KIND, write_run

        with output_dir(out, kind=RUN_KIND) as d:
            files = write_run(d, res, label)
    _print_summary(res.summary, label, files, json_out)


# the serving figures a band brackets: times (the slow end is the high one) and rates (the slow end the low one)
BAND_TIMES = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s")
BAND_RATES = ("goodput_requests_per_s", "throughput_output_tokens_per_s_per_gpu")


def band_fields(setup, requests: list) -> dict:
    """`*_low` / `*_high` of the serving figures from the DES at both ends of the step model's error band
    (`planner.bands.simulate_end`: every pool's decode and prefill steps scaled by the band's factors), and the
    checks the band comes from (`band`)."""
    from k3sim.planner.bands import serve_bands, simulate_end

    fast, slow = simulate_end(setup, requests, "fast"), simulate_end(setup, requests, "slow")
    out: dict = {}
    for k in BAND_TIMES + BAND_RATES:
        lo, hi = sorted((fast[k], slow[k]))
        out[f"{k}_low"], out[f"{k}_high"] = lo, hi
    d, p = serve_bands(setup)
    out["band"] = {"decode": d.describe() if d else "no decode check of this model family on this profile",
                   "prefill": p.describe() if p else "no prefill check of this model family on this profile"}
    return out


def _print_summary(s: dict, label: str, files: dict, json_out: bool) -> None:
    """The run's summary: every key as JSON (the stable SUMMARY_KEYS first), or the headline figures."""
    from k3sim.output import human_seconds, print_json, print_kv

    if json_out:
        print_json({**{k: s[k] for k in SUMMARY_KEYS}, **{k: v for k, v in s.items() if k not in SUMMARY_KEYS},
                    "files": files})
        return
    over = s["overloaded"]
    growing = "not a steady state: grows with the queue (overloaded)"
    print_kv(f"serve: {label}", [
        ("requests", f"{s['requests']} (rejected {s['requests_rejected']}, preemptions {s['preemptions']})"),
        *([("overloaded", overload_line(s))] if over else []),
        ("TTFT p50 / p99", growing if over else
         f"{human_seconds(s['ttft_p50_s'])} / {human_seconds(s['ttft_p99_s'])}"),
        ("TPOT p50 / p99", f"{human_seconds(s['tpot_p50_s'])} / {human_seconds(s['tpot_p99_s'])}"),
        ("e2e p50 / p99", growing if over else f"{human_seconds(s['e2e_p50_s'])} / {human_seconds(s['e2e_p99_s'])}"),
        ("throughput", f"{s['throughput_requests_per_s']:.4g} req/s, "
                       f"{s['throughput_output_tokens_per_s_per_gpu']:.4g} output tokens/s/GPU"),
        ("goodput", f"{s['goodput_requests_per_s']:.4g} req/s (TTFT <= {s['slo_ttft_s']} s, "
                    f"TPOT <= {s['slo_tpot_s']} s)"),
        ("prefix-cache token hit rate", f"{100 * s['token_hit_rate']:.2f} %"),
        *([("error band (DES at both ends)",
            f"TTFT p99 {human_seconds(s['ttft_p99_s_low'])}-{human_seconds(s['ttft_p99_s_high'])}, TPOT p99 "
            f"{human_seconds(s['tpot_p99_s_low'])}-{human_seconds(s['tpot_p99_s_high'])}, goodput "
            f"{s['goodput_requests_per_s_low']:.4g}-{s['goodput_requests_per_s_high']:.4g} req/s; decode: "
            f"{s['band']['decode']}; prefill: {s['band']['prefill']}")] if "band" in s else []),
        *([("of which from host memory", f"{100 * s['token_hit_rate_host']:.2f} % of prompt tokens; "
                                         f"{s['host_restore_bytes'] / 2**30:,.1f} GiB restored in "
                                         f"{s['host_restore_s']:.3g} s of host-link time, "
                                         f"{s['requests_restored']:,} requests waited for a restore")]
          if "token_hit_rate_host" in s else []),
        ("mean in system (Little)", f"{s['mean_requests_in_system']:.4g} (error "
                                    f"{100 * s['little_law_relative_error']:.2g} %)"),
        ("simulated / wall", f"{s['sim_seconds']:.6g} s / {s['wall_s']:.3g} s"),
        ("router", router_line(s["router"])),
        *[("warning", w) for w in s["warnings"]],
        *[(k, v) for k, v in files.items()],
    ])


def overload_line(s: dict) -> str:
    """The overloaded run's one line: offered against sustainable rate, and what to change."""
    return (f"arrivals at {s['offered_rate_per_s']:.4g} requests/s, the fleet sustains about "
            f"{s['sustainable_rate_per_s']:.4g} requests/s (its completion rate over the second half of the "
            f"arrivals, while the waiting queue grew by {s['queue_growth_requests']:,}); lower the rate "
            "(--time-scale, --arrival-rate) or add replicas")


def router_line(r: dict) -> str:
    """Which router, how it spread the requests, and the common prefix the prefix-aware one ignored."""
    spread = r["requests_per_engine"]
    text = r["name"] + (f": {min(spread):,}-{max(spread):,} requests per engine (of {len(spread)})"
                        if len(spread) > 1 else "")
    if r["name"] == "prefix-aware":
        text += (f"; ignores the {r['ignored_common_blocks']} leading hash block(s) every request shares, load "
                 f"cap {r['load_cap']} requests above the least loaded")
    return text
