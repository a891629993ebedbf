"""`k3sim sweep SCENARIO --out DIR`: a grid of layouts -> Parquet table, Pareto front (listed and plotted).

Local processes by default (`--workers`), or a Dask distributed cluster (`--scheduler tcp://HOST:PORT`).
"""

from __future__ import annotations

from pathlib import Path

import typer


def int_list(text: str | None, option: str, minimum: int = 1) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4]; each value an integer >= `minimum`, else one InputError line naming the option."""
    from k3sim.errors import InputError

    if text is None:
        return None
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < minimum:
            kind = "positive integers" if minimum == 1 else f"integers >= {minimum}"
            raise InputError(f"expected comma-separated {kind}, got {text!r}", source=option)
        out.append(int(part))
    if not out:
        raise InputError("empty list", source=option)
    return out


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        scenario: Path = typer.Argument(..., help="scenario YAML"),
        out: Path = typer.Option(None, "--out", help="output directory (default reports/<scenario name>-sweep/)"),
        tp: str = typer.Option(None, "--tp", help="TP degrees, e.g. 4,8"),
        pp: str = typer.Option(None, "--pp", help="pipeline stages"),
        virtual: str = typer.Option(None, "--virtual", help="virtual stages per rank (training)"),
        ep: str = typer.Option(None, "--ep", help="EP degrees"),
        cp: str = typer.Option(None, "--cp", help="CP degrees (training)"),
        dp: str = typer.Option(None, "--dp", help="DP degrees (training: default fills the cluster; serving: "
                                                   "attention-DP)"),
        micro_batches: str = typer.Option(None, "--micro-batches", help="micro-batches per step (training; "
                                                                       "default keeps the scenario's global batch)"),
        max_batch: str = typer.Option(None, "--max-batch", help="serving: engine batch limits (max_num_seqs)"),
        prefill_replicas: str = typer.Option(None, "--prefill-replicas",
                                             help="serving: prefill replicas of P:D splits (0: the scenario's fleet)"),
        requests: int = typer.Option(None, "--requests", min=1, help="serving: requests simulated per point "
                                                                     "(default: k3sim.planner.sweep.SERVING_REQUESTS)"),
        workers: int = typer.Option(1, "--workers", help="local processes (1: in this process)"),
        scheduler: str = typer.Option(None, "--scheduler", help="Dask scheduler address tcp://HOST:PORT"),
        chunk_size: int = typer.Option(None, "--chunk-size", min=1, help="points per task"),
        json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        """Sweep layouts of a scenario; Pareto front of tokens/s per GPU vs step time (serving: goodput per GPU
        vs p99 TTFT over batch limits and P:D splits)."""
        import sys

        from k3sim.errors import InputError
        from k3sim.output import print_json, print_table
        from k3sim.planner.inputs import load
        from k3sim.planner.sweep import SERVING_REQUESTS
        from k3sim.planner.sweep import sweep as run_sweep

        given = {"tp": int_list(tp, "--tp"), "pp": int_list(pp, "--pp"),
                 "virtual_stages": int_list(virtual, "--virtual"), "ep": int_list(ep, "--ep"),
                 "cp": int_list(cp, "--cp"), "dp": int_list(dp, "--dp"),
                 "num_micro_batches": int_list(micro_batches, "--micro-batches"),
                 "max_batch": int_list(max_batch, "--max-batch"),
                 "prefill_replicas": int_list(prefill_replicas, "--prefill-replicas", minimum=0)}
        if scheduler is not None and not scheduler.startswith(("tcp://", "tls://", "inproc://")):
            raise InputError(f"expected tcp://HOST:PORT, got {scheduler!r}", source="--scheduler")
        from k3sim.report import check_out_dir

        name = load(scenario).scenario.name
        out = out or Path("reports") / f"{name}-sweep"
        check_out_dir(out)
        progress = None
        if not json_out and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            bar = Progress(console=Console(stderr=True), transient=True)
            bar.start()
            task = bar.add_task("sweep", total=None)
            progress = lambda done, total: bar.update(task, completed=done, total=total)  # noqa: E731
        try:
            res = run_sweep(scenario, out, given=given, workers=workers, scheduler=scheduler,
                            chunk_size=chunk_size, progress=progress,
                            serving_requests=SERVING_REQUESTS if requests is None else requests)
        finally:
            if progress is not None:
                bar.stop()
        df = res.table
        summary = {"scenario": name, "mode": res.mode, "points": len(df),
                   "ok": int((df["status"] == "ok").sum()), "errors": int((df["status"] == "error").sum()),
                   "fit": int(((df["status"] == "ok") & (df["fits"] == True)).sum()),  # noqa: E712
                   "wall_s": res.wall_s, "workers": res.workers, "scheduler": res.scheduler,
                   "pareto_x": res.x, "pareto_y": res.y, "out": str(out), "files": res.files}
        if json_out:
            print_json({**summary, "pareto": res.front})
            return
        dims = [c for c in ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "num_micro_batches", "max_batch",
                            "prefill_replicas", "decode_replicas")
                if c in res.front.columns]
        print(f"{summary['points']} points ({summary['ok']} evaluated, {summary['errors']} refused, "
              f"{summary['fit']} fit) in {res.wall_s:.2f} s on {res.scheduler} ({res.workers} worker(s))")
        print_table(f"Pareto front: {res.y} up, {res.x} down", dims + [res.x, res.y],
                    [[r[c] if not isinstance(r[c], float) else f"{r[c]:.4g}" for c in dims + [res.x, res.y]]
                     for r in res.front.to_dict(orient="records")])
        print(f"wrote {', '.join(res.files)}")
