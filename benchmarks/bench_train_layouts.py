"""Balanced pipeline stages benchmark (issue 22 item 5, Performance): 10,000 K3 training layouts through the
sweep's evaluation (`k3sim.planner.sweep.run_points`, the analytic path `k3sim sweep` runs) with
`training.stage_split: balanced` (the default) against the same layouts split by layer count, serial and on
two local worker processes; `k3sim plan` of the two training scenarios; `balanced_split` alone on K3's
per-layer seconds.

    python3 benchmarks/bench_train_layouts.py [--out k3sim-out/bench_train_layouts] [--points 10000]
                                              [--repeats 3] [--baseline-repeats 1]

Every layout run is a fresh process (cold caches: kernel times, layer costs, collectives), timed inside that
process around `run_points` (wall) and by the parent from the children's rusage (CPU seconds, workers
included). Medians over the repeats. Writes benchmark.json and benchmark.md under --out."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {"32k": ROOT / "scenarios" / "k3-h200-train-32k.yaml", "1m": ROOT / "scenarios" / "k3-h200-train-1m.yaml"}
# More than 10,000 K3 training layouts of the 32K scenario (its global batch of 2,048 sequences fixed: the sweep
# derives the micro-batch size from dp x micro-batches); data-parallel groups at most 64 wide (bench_planner.py:
# the collective model builds a ring per wide group). The first --points are timed.
GRID = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16, 32], "virtual_stages": [1, 2, 3], "ep": [8, 16, 32, 64, 128],
        "cp": [1, 2, 4], "dp": [8, 16, 32, 64], "num_micro_batches": [8, 16, 32, 64]}
CHILD = """
import json, sys, time
from k3sim.planner.inputs import load
from k3sim.planner.sweep import grid, run_points
path, n, workers, grid_spec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
pts = grid(load(path), grid_spec)[:n]
t = time.perf_counter()
rows = run_points(path, pts, workers=workers)
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "points": len(pts), "ok": sum(r["status"] == "ok" for r in rows)}))
"""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_layouts(path: Path, n: int, workers: int) -> dict:
    """One cold run of `n` layouts in a fresh process: wall inside it, CPU of it and its workers."""
    cpu0 = _children_cpu()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(n), str(workers), json.dumps(GRID)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["cpu_s"] = _children_cpu() - cpu0
    return out


def uniform_copy(path: Path, d: Path) -> Path:
    """The scenario with `training.stage_split: uniform` (model path made absolute), for the baseline."""
    text = path.read_text().replace("model: ../models/", f"model: {ROOT / 'models'}/")
    assert "training:" not in text, "the scenario already has a training section: merge stage_split into it"
    out = d / path.name.replace(".yaml", "-uniform.yaml")
    out.write_text(text + "training:\n  stage_split: uniform\n")
    return out


def median_runs(path: Path, n: int, workers: int, repeats: int) -> dict:
    runs = [run_layouts(path, n, workers) for _ in range(repeats)]
    assert len({(r["points"], r["ok"]) for r in runs}) == 1
    return {"points": runs[0]["points"], "ok": runs[0]["ok"], "repeats": repeats,
            "wall_s": statistics.median(r["wall_s"] for r in runs), "cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "wall_s_all": [r["wall_s"] for r in runs], "cpu_s_all": [r["cpu_s"] for r in runs]}


def bench_plan(name: str, path: Path, repeats: int) -> dict:
    walls, cpus = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            t, cpu0 = time.perf_counter(), _children_cpu()
            proc = subprocess.run([sys.executable, "-m", "k3sim", "plan", str(path), "--out", str(Path(d) / "r")],
                                  cwd=ROOT, capture_output=True, text=True)
            walls.append(time.perf_counter() - t)
            cpus.append(_children_cpu() - cpu0)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return {"scenario": str(path.relative_to(ROOT)), "wall_s": statistics.median(walls), "wall_s_all": walls,
            "cpu_s": statistics.median(cpus), "cpu_s_all": cpus, "goal_s": 10.0,
            "meets_goal": statistics.median(walls) < 10.0}


def layer_seconds(path: Path) -> tuple[list[float], int, int]:
    """The per-layer seconds the step hands to `balanced_split` for the scenario's own layout."""
    from k3sim.planner.inputs import load
    from k3sim.training import partition, train_step

    seen = {}
    real = partition.balanced_split

    def spy(costs, pp, v, first_extra=0.0, last_extra=0.0):
        seen["costs"] = [float(c) for c in costs]
        return real(costs, pp, v, first_extra, last_extra)

    partition.balanced_split = spy
    try:
        inp = load(path)
        sc, w = inp.scenario, inp.scenario.workload
        train_step(inp.model, inp.hw, sc.parallelism, seq_len=w.context_tokens, micro_batch_size=w.micro_batch_size,
                   num_micro_batches=w.num_micro_batches, activation_checkpointing=w.activation_checkpointing,
                   options=inp.training.options(False), with_memory=False)
    finally:
        partition.balanced_split = real
    return seen["costs"], sc.parallelism.pp, sc.parallelism.virtual_stages


def bench_split(name: str, path: Path) -> list[dict]:
    """`balanced_split` alone on the scenario's per-layer seconds, every (pp, v) of the grid: median of 5 calls
    (CPU seconds of this process), the slowest rank against the uniform split and the lower bound T / pp."""
    from k3sim.memory.layout import chunk_layers
    from k3sim.training.partition import balanced_split, rank_seconds

    costs, _, _ = layer_seconds(path)
    rows = []
    for pp in GRID["pp"][1:]:
        for v in GRID["virtual_stages"]:
            if pp * v > len(costs):
                continue
            times = []
            for _ in range(5):
                t = time.process_time()
                chunks = balanced_split(costs, pp, v)
                times.append(time.process_time() - t)
            rows.append({"scenario": name, "pp": pp, "v": v, "ms": 1e3 * statistics.median(times),
                         "balanced_s": max(rank_seconds(chunks, costs, pp)),
                         "uniform_s": max(rank_seconds(chunk_layers(len(costs), pp * v), costs, pp)),
                         "lower_bound_s": sum(costs) / pp})
    return rows


def write(out: Path, res: dict) -> None:
    from k3sim.files import atomic_write_text

    atomic_write_text(out / "benchmark.json", json.dumps(res, indent=2) + "\n")
    lay = res["layouts"]
    lines = ["# Balanced pipeline stages: benchmark", "",
             f"Machine: {res['machine']['cpus']} CPUs, Python {res['machine']['python']}, 1-min load average "
             f"{res['machine']['load_average_1min_at_start']:.1f} at start, {res['machine']['load_average_1min_at_end']:.1f} "
             "at the end (other work shares the machine: wall clock includes waiting for a core; CPU seconds do "
             "not). Medians of the repeats; each layout run a fresh process (cold caches).", "",
             "| what | wall (s) | CPU (s) | goal |", "|---|---|---|---|"]
    for key, label in (("balanced_1", "balanced, serial"), ("balanced_2", "balanced, 2 worker processes"),
                       ("uniform_1", "uniform (baseline), serial"), ("uniform_2", "uniform (baseline), 2 workers")):
        if key in lay:
            r = lay[key]
            goal = "< 60 s" if key.startswith("balanced") else ""
            lines.append(f"| {r['points']:,} K3 32K layouts ({r['ok']:,} priced, the rest refused), {label}, "
                         f"{r['repeats']} run(s) | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {goal} |")
    for name, p in res["plan"].items():
        lines.append(f"| `k3sim plan {p['scenario']}` (report written), {len(p['wall_s_all'])} run(s) | "
                     f"{p['wall_s']:.1f} | {p['cpu_s']:.1f} | < 10 s |")
    lines += ["", "`balanced_split` alone on the per-layer seconds the step hands it (its scenario's micro-batch), "
              "median of 5 calls:", "", "| scenario | pp | v | ms | slowest rank, balanced (s) | uniform (s) | "
              "T / pp (s) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['scenario']} | {r['pp']} | {r['v']} | {r['ms']:.2f} | {r['balanced_s']:.3f} | "
              f"{r['uniform_s']:.3f} | {r['lower_bound_s']:.3f} |" for r in res["split"]]
    atomic_write_text(out / "benchmark.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path("k3sim-out") / "bench_train_layouts"))
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-repeats", type=int, default=1)
    ap.add_argument("--plan-repeats", type=int, default=3)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                       "load_average_1min_at_start": os.getloadavg()[0]}, "grid": GRID, "layouts": {}}
    res["split"] = [r for name, path in SCENARIOS.items() for r in bench_split(name, path)]
    res["plan"] = {name: bench_plan(name, path, a.plan_repeats) for name, path in SCENARIOS.items()}
    print("plan:", res["plan"], flush=True)
    with tempfile.TemporaryDirectory() as d:
        uniform = uniform_copy(SCENARIOS["32k"], Path(d))
        for workers in (1, 2):
            res["layouts"][f"balanced_{workers}"] = median_runs(SCENARIOS["32k"], a.points, workers, a.repeats)
            print(f"balanced, {workers} worker(s):", res["layouts"][f"balanced_{workers}"], flush=True)
            if a.baseline_repeats:
                res["layouts"][f"uniform_{workers}"] = median_runs(uniform, a.points, workers, a.baseline_repeats)
                print(f"uniform, {workers} worker(s):", res["layouts"][f"uniform_{workers}"], flush=True)
    res["machine"]["load_average_1min_at_end"] = os.getloadavg()[0]
    write(out, res)


if __name__ == "__main__":
    main()
