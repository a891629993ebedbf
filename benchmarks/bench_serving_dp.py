"""Attention-DP serving benchmark: the 12,031-request conversation trace through one attention-DP replica.

    python benchmarks/bench_serving_dp.py [--model kimi-k2] [--dp 32] [--repeats 3] [--limit N]

The replica is TP1 x attention-DP `dp` with the routed experts EP `dp` over its GPUs (DeepSeek's prefill unit
layout, deployed-systems.md sec. 2) on H200, the scenario's defaults otherwise (vLLM scheduler, 8192-token
budget, the memory planner's pool per rank, the full-attention cache of an MLA-only model). Goal (issue 21):
under 60 s on 2 cores with dp 32. Each repeat runs in a fresh interpreter (the step-cost tables are built
inside the run, as a `k3sim serve` call builds them; the kernel predictor's disk cache is whatever the machine
holds). Prints one JSON object per repeat, then the median wall time.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "conversation_trace.jsonl"
sys.path.insert(0, str(ROOT))  # this checkout's k3sim, installed or not


def scenario_yaml(model: str, dp: int) -> str:
    return (f"name: bench-{model}-dp{dp}\n"
            f"model: {ROOT / 'models' / (model + '.yaml')}\n"
            "hardware: h200\n"
            f"cluster: {{num_gpus: {dp}, gpus_per_node: 8}}\n"
            f"parallelism: {{tp: 1, dp: {dp}, ep: {dp}}}\n"
            "workload: {mode: serve, context_tokens: 131072}\n")


def cpu_s() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def one(model: str, dp: int, limit: int | None) -> dict:
    from k3sim.serving.run import ServeSetup, simulate
    from k3sim.workloads.mooncake import read_mooncake

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "scenario.yaml"
        path.write_text(scenario_yaml(model, dp))
        t0, c0 = time.perf_counter(), cpu_s()
        setup = ServeSetup.from_scenario(path)
        res = simulate(setup, read_mooncake(TRACE, strict=True, limit=limit))
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    s = res.summary
    return {"model": model, "dp": dp, "wall_s": wall, "cpu_s": cpu, "requests": s["requests"], "steps": s["steps"],
            "sim_seconds": s["sim_seconds"], "step_model_evaluations": res.step_time_evaluations,
            "ttft_p50_s": s["ttft_p50_s"], "tpot_p50_s": s["tpot_p50_s"],
            "throughput_output_tokens_per_s_per_gpu": s["throughput_output_tokens_per_s_per_gpu"],
            "token_hit_rate": s["token_hit_rate"], "preemptions": s["preemptions"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="kimi-k2", help="a file of models/ without .yaml (an MLA-only model fits TP1)")
    ap.add_argument("--dp", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a repeat, in its own interpreter
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.model, a.dp, a.limit)))
        return
    walls = []
    for _ in range(a.repeats):
        cmd = [sys.executable, __file__, "--one", "--model", a.model, "--dp", str(a.dp)]
        if a.limit:
            cmd += ["--limit", str(a.limit)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
        row = json.loads(out.strip().splitlines()[-1])
        print(json.dumps(row))
        walls.append(row["wall_s"])
    print(json.dumps({"median_wall_s": statistics.median(walls), "repeats": len(walls), "goal_s": 60.0}))


if __name__ == "__main__":
    main()
