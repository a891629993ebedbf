"""Plots and files of a serving run or a rate sweep, written whole through `k3sim.files.output_dir` (kinds
`serve` and `serve-sweep-rate`). Wall-clock seconds are printed and in `--json`, not in the files: a file
holds results only, so a run regenerated from the same inputs writes the same bytes.

The knee of a rate sweep is the lowest offered rate at which the fleet completes less than `KNEE_FRACTION`
of the offered requests per second: past it the queue grows for as long as requests keep coming, and p99 TTFT
grows with the length of the run instead of with the load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

KNEE_FRACTION = 0.95  # modelling choice: 5 % below the offered rate is sustained queue growth, not noise
RUN_KIND = "serve"  # output kinds (k3sim.files manifest)
SWEEP_KIND = "serve-sweep-rate"
WALL_CLOCK = ("wall_s",)  # machine timings: not results, never written to a file


def _results(obj):
    """A summary dict or a frame without its wall-clock fields."""
    if isinstance(obj, dict):
        return {k: v for k, v in obj.items() if k not in WALL_CLOCK}
    return obj.drop(columns=[c for c in WALL_CLOCK if c in obj.columns])


def knee_rate(rates, throughputs) -> float | None:
    for r, x in sorted(zip(rates, throughputs)):
        if x < KNEE_FRACTION * r:
            return float(r)
    return None


def _cdf(ax, values, label):
    import numpy as np

    v = np.sort(values[~np.isnan(values)])
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)


def plot_latency_cdfs(df, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from k3sim.files import save_figure

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, col, name in zip(axes, ("ttft_s", "tpot_s", "e2e_s", "queue_s"),
                             ("TTFT", "TPOT", "end-to-end latency", "queueing delay")):
        _cdf(ax, df[col].to_numpy(dtype=float), name)
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.set_title(name)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot_timeseries(ts, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from k3sim.files import save_figure

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    a1.plot(ts["t_s"], ts["running"], label="running (batch)")
    a1.plot(ts["t_s"], ts["waiting"], label="waiting")
    a1.set_ylabel("requests")
    a1.legend()
    a1.grid(alpha=0.3)
    a2.plot(ts["t_s"], ts["pinned_bytes"] / 1e9, label="pinned by requests")
    a2.plot(ts["t_s"], ts["cached_bytes"] / 1e9, label="cached, evictable")
    a2.set_ylabel("pool (GB, all replicas, per TP rank)")
    a2.set_xlabel("simulated time (s)")
    a2.legend()
    a2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot_rate_sweep(df, path: Path, title: str) -> float | None:
    """Throughput and p99 TTFT vs offered rate, the knee marked. Returns the knee (or None)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from k3sim.files import save_figure

    rates = df["arrival_rate"].to_numpy(dtype=float)
    knee = knee_rate(rates, df["throughput_requests_per_s"].to_numpy(dtype=float))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    a1.plot(rates, df["throughput_requests_per_s"], "o-", label="completed")
    a1.plot(rates, df["goodput_requests_per_s"], "s--", label="goodput (within both SLOs)")
    a1.plot(rates, rates, ":", color="grey", label="offered")
    a1.set_xlabel("arrival rate (requests/s)")
    a1.set_ylabel("requests/s")
    a1.grid(alpha=0.3)
    a2.plot(rates, df["ttft_p99_s"], "o-", label="p99 TTFT")
    a2.plot(rates, df["ttft_p50_s"], "s--", label="p50 TTFT")
    a2.set_yscale("log")
    a2.set_xlabel("arrival rate (requests/s)")
    a2.set_ylabel("TTFT (s)")
    a2.grid(alpha=0.3)
    for ax in (a1, a2):
        if knee is not None:
            ax.axvline(knee, color="red", alpha=0.6, label=f"knee {knee:.3g} req/s")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return knee


def write_run(out: Path, res, title: str) -> dict[str, str]:
    """summary.json, requests.csv + requests.parquet, timeseries.csv, latency_cdfs.png, timeseries.png."""
    from k3sim.files import atomic_path, atomic_write_text, output_dir
    from k3sim.output import to_jsonable

    out = Path(out)
    files = {k: str(out / v) for k, v in (("summary", "summary.json"), ("requests_csv", "requests.csv"),
                                          ("requests_parquet", "requests.parquet"),
                                          ("timeseries", "timeseries.csv"), ("latency_cdfs", "latency_cdfs.png"),
                                          ("timeseries_plot", "timeseries.png"))}
    df = res.frame()
    ts = timeseries_frame_from(res)
    with output_dir(out, kind=RUN_KIND):
        atomic_write_text(files["summary"], json.dumps(to_jsonable(_results(res.summary)), indent=2) + "\n")
        with atomic_path(files["requests_csv"]) as tmp:  # streamed: a run may hold a million requests
            df.to_csv(tmp, index=False)
        with atomic_path(files["requests_parquet"]) as tmp:
            df.to_parquet(tmp, index=False)
        with atomic_path(files["timeseries"]) as tmp:
            ts.to_csv(tmp, index=False)
        plot_latency_cdfs(df, Path(files["latency_cdfs"]), title)
        if len(ts):
            plot_timeseries(ts, Path(files["timeseries_plot"]), title)
        else:
            del files["timeseries_plot"]
    return files


def timeseries_frame_from(res):
    import pandas as pd

    return pd.DataFrame(res.samples, columns=["t_s", "running", "waiting", "pinned_bytes", "cached_bytes",
                                              "in_system"])


def write_sweep(out: Path, df, title: str) -> tuple[dict[str, str], float | None]:
    """rate_sweep.csv (one row per rate, no wall-clock column) and rate_sweep.png; returns (files, knee)."""
    from k3sim.files import atomic_write_text, output_dir

    out = Path(out)
    files = {"sweep_csv": str(out / "rate_sweep.csv"), "sweep_plot": str(out / "rate_sweep.png")}
    with output_dir(out, kind=SWEEP_KIND):
        # 12 significant digits: LO:HI:N rates come out as 0.30000000000000004; the results keep their precision
        atomic_write_text(files["sweep_csv"], _results(df).to_csv(index=False, float_format="%.12g"))
        knee = plot_rate_sweep(df, Path(files["sweep_plot"]), title)
    return files, knee


def finite(x) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
