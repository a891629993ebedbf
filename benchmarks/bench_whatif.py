"""How fast a what-if answers: medians of fresh `python -m k3sim` processes, cold and warm kernel cache.

    python3 benchmarks/bench_whatif.py [--repeat 5] [--json] [--root DIR] [--baseline DIR [--queries a,b]]

Each query runs `--repeat` times in a new process (the interpreter, typer, pydantic and the command's imports
every time, as a user pays them). "cold": every run gets an empty `K3SIM_CACHE_DIR`, so the kernel predictor
parses and validates the measured CSVs; "warm": the runs share a directory one untimed run has filled. One
untimed run of every query first compiles the .pyc files (into a directory of the benchmark's, whatever
PYTHONDONTWRITEBYTECODE says), so neither column pays for compiling. The heavy
imports column names which of pandas, scipy and matplotlib a warm run imported (`python -X importtime`).
`--root` runs another checkout (e.g. an unpacked `git archive` of an older commit) for a before/after table.
`--baseline DIR` compares warm runs of `--root` against DIR back to back instead (the two alternate, run by run,
so a shared machine's load moves both alike): each side's median wall and CPU seconds and their ratio, and
whether the two printed the same bytes.
The load average is printed with the table: on a shared machine the medians move with it. The start-up floor
line times what every query pays before k3sim's own code: the interpreter, typer, a one-option typer command
(pydantic: typer coerces options through it), that plus numpy, and the same with the library settings k3sim's
CLI gives itself (one OpenBLAS thread, no pydantic plugin scan: `k3sim.cli._start_up_env`), and that with the
entry point's deferred start-up collections (`k3sim.procs.defer_start_up_collections`), the floor a query
of k3sim stands on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "models/kimi-k3.yaml"
QUERIES = {
    "--help": ["--help"],
    "model-info": ["model-info", "--model", MODEL],
    "memory": ["memory", "--model", MODEL, "--hardware", "h200", "--mode", "serve", "--tp", "8", "--pp", "2",
               "--ep", "8", "--context", "131072"],
    "kernel-time": ["kernel-time", "chunk_kda_fwd", "--set", "T=32768", "--set", "H=12"],
    "decode": ["decode", "--model", MODEL, "--hardware", "h200", "--batch", "64", "--tp", "8", "--pp", "2",
               "--ep", "8", "--context", "32768"],
    "cp": ["cp", "--model", MODEL, "--hardware", "h200", "--seq-len", "1048576", "--cp", "8", "--strategy", "kcp"],
    "prefill": ["prefill", "--model", MODEL, "--hardware", "h200", "--prompt", "32768", "--cached", "8192",
                "--chunk", "8192", "--tp", "8", "--pp", "2", "--ep", "8"],
}
HEAVY = ("pandas", "scipy", "matplotlib", "yaml", "rich")  # yaml, rich: a warm query takes neither (disk cache,
# k3sim.output's plain tables)
# The goals (wall seconds): --help and model-info under 0.2 s; a point under 0.3 s warm and 3 s cold.
GOALS = {"--help": (0.2, 0.2), "model-info": (0.2, 0.2), "memory": (0.3, 3.0), "kernel-time": (0.3, 3.0),
         "decode": (0.3, 3.0), "cp": (0.3, 3.0), "prefill": (1.0, 3.0)}  # issue 24: a prefill point under 1 s


# Compiled bytecode for the runs, in a directory of the benchmark's (PYTHONPYCACHEPREFIX): written by the
# untimed first run and read by the timed ones, as an installed k3sim's .pyc files are, even where the
# environment sets PYTHONDONTWRITEBYTECODE (then every run would compile k3sim's sources again, ~0.1 s).
_PYC: list[str] = []


def run_once(args: list[str], root: Path, cache: str, importtime: bool = False) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stderr text) of one `python -m k3sim ARGS` in `root` with
    `K3SIM_CACHE_DIR=cache`. CPU time (user + system of the child) moves less than wall time on a busy machine."""
    env = dict(os.environ, K3SIM_CACHE_DIR=cache, **({"PYTHONPYCACHEPREFIX": _PYC[0]} if _PYC else {}))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "k3sim", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"k3sim {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stderr


def heavy_imports(args: list[str], root: Path, cache: str) -> list[str]:
    """Which of `HEAVY` a (warm) run imports, from `-X importtime`'s top-level package lines."""
    _, _, err = run_once(args, root, cache, importtime=True)
    names = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    return [h for h in HEAVY if h in names]


# The start-up floor a query stands on, each in a fresh process: the interpreter; typer; a one-option typer
# command (typer 0.29 coerces every option through a pydantic TypeAdapter, so this imports pydantic too);
# the same plus numpy, which every kernel-time answer needs.
FLOOR_APP = """import typer
app = typer.Typer(add_completion=False)
@app.command()
def main(model: str = typer.Option(..., "--model"), as_json: bool = typer.Option(False, "--json")):
    {body}
app()
"""
FLOOR = {"python -c pass": ["-c", "pass"], "import typer": ["-c", "import typer"],
         "typer command": [FLOOR_APP.format(body="pass"), "--model", "x"],
         "typer command + numpy": [FLOOR_APP.format(body="import numpy"), "--model", "x"],
         # what k3sim's CLI runs with (k3sim.cli: one OpenBLAS thread, no pydantic plugin scan)
         "same, k3sim's settings": [FLOOR_APP.format(body="import numpy"), "--model", "x"],
         # and k3sim's entry point's collector setting (k3sim.procs.defer_start_up_collections, the one copy)
         "same, collections deferred": ["from k3sim import procs\nprocs.defer_start_up_collections()\n"
                                        + FLOOR_APP.format(body="import numpy"), "--model", "x"]}
_SETTINGS = {"OPENBLAS_NUM_THREADS": "1", "PYDANTIC_DISABLE_PLUGINS": "__all__"}
FLOOR_ENV = {"same, k3sim's settings": _SETTINGS, "same, collections deferred": _SETTINGS}


def floor(repeat: int, tmp: Path) -> dict:
    """Median wall seconds of each `FLOOR` process (a script body is written to a file and run)."""
    out = {}
    for name, args in FLOOR.items():
        if args[0] != "-c":
            script = tmp / f"floor-{len(out)}.py"
            script.write_text(args[0])
            args = [str(script), *args[1:]]
        times = []
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(FLOOR_ENV.get(name, {}))
        for _ in range(repeat + 1):  # the first compiles
            t0 = time.perf_counter()
            subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=env, check=True, timeout=120)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times[1:])
    return out


def bench(root: Path, repeat: int) -> dict:
    """Per query: cold and warm medians (s), every run's time, and the heavy imports of a warm run."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="k3sim-bench-") as tmp:
        _PYC[:] = [str(Path(tmp) / "pyc")]
        for args in QUERIES.values():  # compile the .pyc files (untimed)
            run_once(args, root, str(Path(tmp) / "compile"))
        for name, args in QUERIES.items():
            cold = [run_once(args, root, str(Path(tmp) / f"cold-{name}-{i}"))[:2] for i in range(repeat)]
            warm_dir = str(Path(tmp) / f"warm-{name}")
            run_once(args, root, warm_dir)  # fills the cache
            warm = [run_once(args, root, warm_dir)[:2] for _ in range(repeat)]
            out[name] = {"cold_median_s": statistics.median(w for w, _ in cold),
                         "warm_median_s": statistics.median(w for w, _ in warm),
                         "cold_cpu_median_s": statistics.median(c for _, c in cold),
                         "warm_cpu_median_s": statistics.median(c for _, c in warm),
                         "cold_s": [w for w, _ in cold], "warm_s": [w for w, _ in warm],
                         "heavy_imports_warm": heavy_imports(args, root, warm_dir),
                         "goal_warm_s": GOALS[name][0], "goal_cold_s": GOALS[name][1]}
        out["floor"] = floor(repeat, Path(tmp))
    return out


def compare(root: Path, baseline: Path, repeat: int, names: list[str]) -> dict:
    """Per query: warm medians (wall, CPU) of `baseline` and `root`, run alternately (baseline first on even runs),
    their ratios root / baseline, and whether both printed the same stdout."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="k3sim-bench-") as tmp:
        _PYC[:] = [str(Path(tmp) / "pyc")]
        for name in names:
            args = QUERIES[name]
            dirs = {side: str(Path(tmp) / f"warm-{side}-{name}") for side in ("baseline", "root")}
            roots = {"baseline": baseline, "root": root}
            printed = {side: _stdout(args, roots[side], dirs[side]) for side in roots}  # compiles, fills the cache
            runs: dict[str, list] = {"baseline": [], "root": []}
            for i in range(repeat):
                for side in (("baseline", "root") if i % 2 == 0 else ("root", "baseline")):
                    runs[side].append(run_once(args, roots[side], dirs[side])[:2])
            med = {side: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
                   for side, r in runs.items()}
            out[name] = {"baseline_warm_median_s": med["baseline"][0], "warm_median_s": med["root"][0],
                         "baseline_warm_cpu_median_s": med["baseline"][1], "warm_cpu_median_s": med["root"][1],
                         "wall_ratio": med["root"][0] / med["baseline"][0],
                         "cpu_ratio": med["root"][1] / med["baseline"][1],
                         "same_stdout": printed["baseline"] == printed["root"], "goal_warm_s": GOALS[name][0]}
    return out


def _stdout(args: list[str], root: Path, cache: str) -> bytes:
    """What one `python -m k3sim ARGS` prints (untimed)."""
    env = dict(os.environ, K3SIM_CACHE_DIR=cache, **({"PYTHONPYCACHEPREFIX": _PYC[0]} if _PYC else {}))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return subprocess.run([sys.executable, "-m", "k3sim", *args], cwd=root, env=env, capture_output=True,
                          timeout=600).stdout


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per query and cache state")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to run (default: this one)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout: warm runs of both, alternating, with the ratio (no cold runs)")
    ap.add_argument("--queries", default=",".join(QUERIES), help="with --baseline: which queries (comma-separated)")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    if a.baseline is not None:
        names = [q for q in a.queries.split(",") if q]
        unknown = [q for q in names if q not in QUERIES]
        if unknown:
            ap.error(f"unknown query {unknown[0]!r} (known: {', '.join(QUERIES)})")
        _print_compare(a, names)
        return
    load_before = os.getloadavg()
    results = bench(a.root.resolve(), a.repeat)
    doc = {"root": str(a.root.resolve()), "python": sys.version.split()[0], "cpus": os.cpu_count(),
           "repeat": a.repeat, "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "floor_median_s": results.pop("floor"), "queries": results}
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    loads = [" ".join(f"{x:.2f}" for x in load) for load in (load_before, doc["load_average_after"])]
    print(f"{a.root.resolve()}  python {doc['python']}, {doc['cpus']} CPUs, {a.repeat} runs each; load average "
          f"{loads[0]} before, {loads[1]} after")
    print(f"{'query':12s} {'cold s':>8s} {'warm s':>8s} {'cold cpu':>9s} {'warm cpu':>9s}  {'goal cold/warm':>14s}  "
          "heavy imports (warm)")
    for name, r in results.items():
        goal = f"{r['goal_cold_s']:g}/{r['goal_warm_s']:g}"
        print(f"{name:12s} {r['cold_median_s']:8.3f} {r['warm_median_s']:8.3f} {r['cold_cpu_median_s']:9.3f} "
              f"{r['warm_cpu_median_s']:9.3f}  {goal:>14s}  {', '.join(r['heavy_imports_warm']) or '-'}")
    print("start-up floor (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in doc["floor_median_s"].items()))


def _print_compare(a, names: list[str]) -> None:
    """`--baseline`: the back-to-back table (or JSON), with the load average before and after."""
    load_before = os.getloadavg()
    results = compare(a.root.resolve(), a.baseline.resolve(), a.repeat, names)
    doc = {"root": str(a.root.resolve()), "baseline": str(a.baseline.resolve()), "cpus": os.cpu_count(),
           "repeat": a.repeat, "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "queries": results}
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    loads = [" ".join(f"{x:.2f}" for x in load) for load in (load_before, doc["load_average_after"])]
    print(f"{doc['root']} against {doc['baseline']}, {doc['cpus']} CPUs, {a.repeat} warm runs each, alternating; "
          f"load average {loads[0]} before, {loads[1]} after")
    print(f"{'query':12s} {'base s':>8s} {'warm s':>8s} {'ratio':>6s} {'base cpu':>9s} {'warm cpu':>9s} {'ratio':>6s}"
          f"  {'goal':>5s}  same output")
    for name, r in results.items():
        print(f"{name:12s} {r['baseline_warm_median_s']:8.3f} {r['warm_median_s']:8.3f} {r['wall_ratio']:6.2f} "
              f"{r['baseline_warm_cpu_median_s']:9.3f} {r['warm_cpu_median_s']:9.3f} {r['cpu_ratio']:6.2f}  "
              f"{r['goal_warm_s']:5g}  {'yes' if r['same_stdout'] else 'NO'}")


if __name__ == "__main__":
    main()
