"""Contract benchmark (issue 19): the documented maxima answer, or are refused, in bounded time.

    python3 benchmarks/bench_contract.py [--repeats 3] [--json]

Cases (median of `--repeats` runs, each listed):
- kernel-time all_gather at 65,536 GPUs (the bounds table's `collective_gpus` maximum) on the default
  placement, and at 4,096 GPUs: each run a fresh `python -m k3sim` process, so the time includes the
  interpreter's start, the imports and loading the h200 profile (the `k3sim version` row is that start alone);
- `collective_time` at 65,536 GPUs in-process: timed inside a fresh interpreter, its first call (imports the
  model, loads the profile's measurements) and its second (warm: the placement is closed form and not
  cached, so that call does all of its work);
- `k3sim sweep` of a training grid one step past the bounds table's `sweep_points_train`: the refusal's
  time, a fresh process (exit 2 expected).
A case is a function returning one run's seconds, registered in `CASES`; add one with `case(name, how)`.
Nothing is written (the sweep's --out is a temporary directory, refused before anything is written)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from k3sim.configs.bounds import BOUNDS

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "scenarios" / "k3-h200-train-32k.yaml"
SHARD_BYTES = 2 ** 20  # one all_gather shard per rank (1 MiB)
MAX_GPUS = int(BOUNDS["collective_gpus"].hi)  # the documented maximum of a collective

CASES: list[tuple[str, str, Callable[[], float]]] = []


def case(name: str, how: str):
    """Register `fn() -> seconds of one run` as a benchmark case."""
    def register(fn: Callable[[], float]) -> Callable[[], float]:
        CASES.append((name, how, fn))
        return fn
    return register


def k3sim_run(*args: str, expect: int = 0, needle: str | None = None) -> float:
    """Wall seconds of one fresh `python -m k3sim ...`; its exit code (and stderr text) checked."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "k3sim", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    dt = time.perf_counter() - t0
    if proc.returncode != expect or (needle and needle not in proc.stderr):
        raise SystemExit(f"k3sim {' '.join(a[:40] for a in args)}: exit {proc.returncode}, expected {expect}: "
                         f"{proc.stderr.strip()[:300]}")
    return dt


@case("k3sim version", "fresh process: interpreter start and CLI imports only")
def bench_startup() -> float:
    return k3sim_run("version")


@case(f"kernel-time all_gather, {MAX_GPUS:,} GPUs", "fresh process, default placement")
def bench_kernel_time_max() -> float:
    return k3sim_run("kernel-time", "all_gather", "--set", f"gpus={MAX_GPUS}", "--set", f"bytes={SHARD_BYTES}",
                     "--json")


@case("kernel-time all_gather, 4,096 GPUs", "fresh process, default placement")
def bench_kernel_time_4096() -> float:
    return k3sim_run("kernel-time", "all_gather", "--set", "gpus=4096", "--set", f"bytes={SHARD_BYTES}", "--json")


_COLLECTIVE = """
import time
t0 = time.perf_counter()
from k3sim.comm import collective_time
collective_time("all_gather", {nbytes}, {gpus}, "h200", convention="barrier")
t1 = time.perf_counter()
collective_time("all_gather", {nbytes}, {gpus}, "h200", convention="barrier")
print(t1 - t0, time.perf_counter() - t1)
"""


def collective_in_process() -> tuple[float, float]:
    """(first call, second call) seconds of `collective_time` in a fresh interpreter, timed inside it: the
    first imports the model and loads the h200 profile's measurements, the second is warm (the placement
    is closed form and not cached, so it does all of its work again)."""
    code = _COLLECTIVE.format(nbytes=SHARD_BYTES, gpus=MAX_GPUS)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         check=True).stdout.split()
    return float(out[0]), float(out[1])


@case(f"collective_time all_gather, {MAX_GPUS:,} GPUs, first call", "in-process (fresh interpreter, timed "
      "inside): imports + h200 profile load")
def bench_collective_first() -> float:
    return collective_in_process()[0]


@case(f"collective_time all_gather, {MAX_GPUS:,} GPUs, warm", "in-process, second call of that interpreter")
def bench_collective_warm() -> float:
    return collective_in_process()[1]


def sweep_over_bound_args() -> list[str] | None:
    """`k3sim sweep` arguments of a training grid one step past `sweep_points_train` (two swept dimensions,
    every other one a single value), or None when this checkout has no grid bound."""
    if "sweep_points_train" not in BOUNDS:
        return None
    cap = int(BOUNDS["sweep_points_train"].hi)
    a = math.isqrt(cap) + 1
    b = cap // a + 1  # a x b > cap, the smallest such product of two lists near sqrt(cap)
    return [str(TRAIN), "--tp", "8", "--pp", "4", "--virtual", "1", "--ep", "8", "--cp", "1",
            "--dp", ",".join(map(str, range(1, a + 1))), "--micro-batches", ",".join(map(str, range(1, b + 1)))]


@case("sweep refusal, largest grid + 1 step", "fresh process, exit 2 before any point is built")
def bench_sweep_refusal() -> float:
    args = sweep_over_bound_args()
    if args is None:
        return float("nan")  # reported as missing: no sweep grid bound in k3sim/configs/bounds.py
    with tempfile.TemporaryDirectory() as d:
        return k3sim_run("sweep", *args, "--out", str(Path(d) / "out"), expect=2, needle="more than")


def run(repeats: int) -> list[dict]:
    rows = []
    for name, how, fn in CASES:
        runs = [fn() for _ in range(repeats)]
        med = statistics.median(runs)
        rows.append({"case": name, "how": how, "median_s": med, "runs_s": runs,
                     "note": "missing: no sweep grid bound" if math.isnan(med) else ""})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (median reported)")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of the table")
    args = ap.parse_args(argv)
    rows = run(max(1, args.repeats))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':<{width}}  {'median s':>9}  runs s                 how")
    for r in rows:
        runs = ", ".join(f"{x:.3f}" for x in r["runs_s"])
        print(f"{r['case']:<{width}}  {r['median_s']:>9.3f}  {runs:<22} {r['how']} {r['note']}".rstrip())


if __name__ == "__main__":
    main()
