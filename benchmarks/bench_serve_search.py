"""How fast the serving search answers: `k3sim plan --trace conversation --arrival-rate 1 --slo-ttft 5 --slo-tpot
0.05` on 32 H200 (Kimi K3), with 1 and 2 local workers, and what a cluster of W workers would take.

    python3 benchmarks/bench_serve_search.py [--workers 1,2] [--screen-requests 600] [--json]

Each run is the search function itself in this process (the CLI adds the report of the answer's layout, a few
seconds). Per stage: candidates, pruned by reason, simulated, wall seconds of the bounds, the screen and the
whole-traffic finalists. The projection to W workers: the bounds pass (serial) plus the screen's and the finals'
CPU seconds per task spread over W workers, assuming the cluster's tasks run as fast as this machine's (a lower
bound on wall time when a task is the unit: the longest task bounds it; printed beside). The issue's goal: over
200 candidates under 5 minutes on 2 cores, near-linear in workers. The load average is printed: on a shared
machine the wall seconds move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = """name: k3-h200-32-search
description: Kimi K3 on up to 32 H200 (the serving search benchmark)
model: {root}/models/kimi-k3.yaml
hardware: h200
cluster: {{num_gpus: 32, gpus_per_node: 8}}
parallelism: {{tp: 8, pp: 2, ep: 8}}
workload: {{mode: serve, context_tokens: 131072, prefill_chunk_tokens: 8192, workspace_fraction: 0.10}}
"""


def run(workers: int, screen: int, path: Path) -> dict:
    from k3sim.planner.serve_search import load_traffic, search

    stages: dict[str, float] = {}
    marks = {"t": time.perf_counter()}

    def progress(stage: str, done: int, total: int) -> None:
        if done == total:
            now = time.perf_counter()
            stages[stage] = now - marks["t"]
            marks["t"] = now

    t0 = time.perf_counter()
    traffic = load_traffic(trace=ROOT / "data/traces/conversation_trace.jsonl", workload=None, arrival_rate=1.0,
                           seed=0, n_requests=0, limit=None)
    load_s = time.perf_counter() - t0
    marks["t"] = time.perf_counter()
    res = search(str(path), traffic, slo_ttft_s=5.0, slo_tpot_s=0.05, workers=workers, screen_requests=screen,
                 progress=progress)
    return {"workers": workers, "candidates": res.candidates, "pruned": res.pruned, "simulated": len(res.screened),
            "finalists": len(res.finals), "traffic_load_s": load_s, "stages_s": stages, "wall_s": res.wall_s,
            "verdict": res.verdict()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--screen-requests", type=int, default=600)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k3-32.yaml"
        path.write_text(SCENARIO.format(root=ROOT))
        load0 = os.getloadavg()
        rows = [run(int(w), a.screen_requests, path) for w in a.workers.split(",")]
        load1 = os.getloadavg()
    if a.json:
        print(json.dumps({"rows": rows, "load_before": load0, "load_after": load1}, indent=2))
        return
    print(f"load average {load0[0]:.2f} before, {load1[0]:.2f} after; {os.cpu_count()} CPUs")
    base = rows[0]
    for r in rows:
        st = ", ".join(f"{k} {v:.1f} s" for k, v in r["stages_s"].items())
        print(f"workers {r['workers']}: {r['candidates']:,} candidates, pruned {r['pruned']}, {r['simulated']} "
              f"simulated, {r['finalists']} finalists; wall {r['wall_s']:.1f} s ({st}); speed-up "
              f"{base['wall_s'] / r['wall_s']:.2f}x")
    serial = base["stages_s"]
    sim = sum(v for k, v in serial.items() if k != "bounds") * base["workers"]
    for w in (8, 32, 128):
        print(f"projected on {w} workers: {serial.get('bounds', 0.0) + sim / w:.1f} s "
              f"(bounds {serial.get('bounds', 0.0):.1f} s serial + {sim:.0f} CPU s of simulation / {w})")
    print("answer:", base["verdict"])


if __name__ == "__main__":
    main()
