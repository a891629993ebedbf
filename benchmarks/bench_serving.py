"""Serving simulator benchmark: the conversation trace through the default scenario, a 16-point rate sweep,
and a million-request synthetic stream in bounded memory.

    python benchmarks/bench_serving.py [--part trace|sweep|million|all] [--requests N] [--out DIR]

Goals (issue 14): the 12,031-request conversation trace in < 20 s on a 2-core machine; a 16-point
`--sweep-rate` in < 3 min. Prints one JSON object per part (wall seconds, simulated seconds, steps, peak RSS).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "conversation_trace.jsonl"
SCENARIO = ROOT / "scenarios" / "default.yaml"
SWEEP_RATES = [0.1 * (i + 1) for i in range(16)]  # req/s: from well below to past the default replica's knee


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def cpu_s() -> float:
    """CPU seconds of this process and its finished workers: the wall time on an otherwise idle machine."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def part_trace() -> dict:
    from k3sim.serving.run import ServeSetup, simulate
    from k3sim.workloads.mooncake import read_mooncake

    t0 = time.perf_counter()
    setup = ServeSetup.from_scenario(SCENARIO)
    res = simulate(setup, read_mooncake(TRACE, strict=True))
    s = res.summary
    return {"part": "trace", "wall_s": time.perf_counter() - t0, "simulate_wall_s": s["wall_s"],
            "requests": s["requests"], "steps": s["steps"], "sim_seconds": s["sim_seconds"],
            "step_model_evaluations": res.step_time_evaluations, "ttft_p99_s": s["ttft_p99_s"],
            "token_hit_rate": s["token_hit_rate"], "peak_rss_bytes": rss_bytes()}


def part_sweep(out: Path | None) -> dict:
    import itertools

    from k3sim.serving.run import ServeSetup, request_source, sweep_rates

    t0 = time.perf_counter()
    setup = ServeSetup.from_scenario(SCENARIO)
    src = request_source(trace=TRACE, workload=None, n_requests=0, seed=0, arrival="poisson", cv=1.0, limit=None)
    df = sweep_rates(setup, src, SWEEP_RATES, warm=itertools.islice(src(max(SWEEP_RATES)), 300))
    wall = time.perf_counter() - t0
    knee = None
    if out is not None:
        from k3sim.files import output_dir
        from k3sim.serving.report import write_sweep

        with output_dir(out) as d:
            _, knee = write_sweep(d, df, "k3-h200-serve-128k: conversation trace, Poisson rate sweep")
    return {"part": "sweep", "points": len(SWEEP_RATES), "wall_s": wall, "knee_arrival_rate": knee,
            "slowest_point_wall_s": float(df["wall_s"].max()), "peak_rss_bytes": rss_bytes()}


def part_million(n: int) -> dict:
    from k3sim.serving.arrivals import synthetic_stream
    from k3sim.serving.run import ServeSetup, simulate

    t0 = time.perf_counter()
    setup = ServeSetup.from_scenario(SCENARIO)
    # 0.4 req/s of ~4 K-token prompts and ~200-token outputs: below the default replica's knee
    res = simulate(setup, synthetic_stream(n, seed=0, rate=0.4), sample_interval_s=3600.0)
    s = res.summary
    return {"part": "million", "requests": s["requests"], "wall_s": time.perf_counter() - t0, "steps": s["steps"],
            "sim_seconds": s["sim_seconds"], "record_bytes": sum(a.itemsize * len(a) for a in
                                                                  vars(res.records).values()),
            "peak_rss_bytes": rss_bytes()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all", choices=["trace", "sweep", "million", "all"])
    ap.add_argument("--requests", type=int, default=1_000_000, help="million part: stream size")
    ap.add_argument("--out", type=Path, default=None, help="sweep part: write rate_sweep.csv/png here")
    a = ap.parse_args()
    parts = ["trace", "sweep", "million"] if a.part == "all" else [a.part]
    for p in parts:
        r = part_trace() if p == "trace" else part_sweep(a.out) if p == "sweep" else part_million(a.requests)
        r["cpu_s_cumulative"] = cpu_s()
        r["load_average_1min"] = __import__("os").getloadavg()[0]
        print(json.dumps(r), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
