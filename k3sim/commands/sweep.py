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
    @app.command("sweep")
    def sweep(
        scenario: Path = typer.Argument(..., help="scenario YAML"),
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
        requests: int = typer.Option(None, "--requests", min=1, help="serving: requests simulated per point "
                                                                     "(default: k3sim.planner.sweep.SERVING_REQUESTS)"),
        workers: int = typer.Option(None, "--workers", help="local processes (1: in this process; at most one per "
                                                            "chunk is started) [default: 1]"),
        scheduler: str = typer.Option(None, "--scheduler", help="Dask scheduler address tcp://HOST:PORT"),
        chunk_size: int = typer.Option(None, "--chunk-size", min=1, help="points per task"),
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Sweep layouts of a scenario; Pareto front of tokens/s per GPU vs step time (serving: goodput per GPU
        vs p99 TTFT over batch limits and P:D splits)."""
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
        res = _run_grid(scenario, given, workers=workers, scheduler=scheduler, chunk_size=chunk_size,
                        requests=requests, json_out=json_out)
        files = write_sweep(res, out)
        _print_sweep(res, name, out, files, json_out)


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
                        serving_requests=SERVING_REQUESTS if requests is None else requests)
    finally:
        if progress is not None:
            bar.stop()
    return res


# Column names of the terminal table, short enough for 80 columns (the files keep the full names).
SHORT = {"virtual_stages": "v", "num_micro_batches": "m", "micro_batch_size": "mbs",
         "global_batch_sequences": "batch", "tokens_per_step": "tok/step", "step_time_s": "step_s",
         "tokens_per_s_per_gpu": "tok/s/GPU", "prefill_replicas": "prefill", "decode_replicas": "decode"}


def _print_sweep(res, name: str, out: Path, files, json_out: bool) -> None:
    """Counts of points evaluated / refused / fitting and the Pareto front (or all of it as JSON)."""
    from k3sim.output import print_json, print_table

    df = res.table
    summary = {"scenario": name, "mode": res.mode, "points": len(df),
               "ok": int((df["status"] == "ok").sum()), "errors": int((df["status"] == "error").sum()),
               "fit": int(((df["status"] == "ok") & (df["fits"] == True)).sum()),  # noqa: E712
               "skipped": res.skipped, "wall_s": res.wall_s, "workers": res.workers, "scheduler": res.scheduler,
               "pareto_x": res.x, "pareto_y": res.y, "out": str(out), "files": files}
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
    print(f"wrote {', '.join(files)}")
