"""Benchmark the prefix-cache replay and sweep (not a test: figures go to reports/prefix_cache/).

    python3 benchmarks/bench_prefix_cache.py [--trace FILE] [--runs 3] [--out reports/prefix_cache/benchmark.json]
        [--only all|study|engines]

Replay: the whole trace, read streaming from disk, one policy/config, median of --runs runs.
Sweep: 5 physical blocks x 4 capacities (one policy, then all three) on all cores, median of --sweep-runs.
Engines: every engine policy (`prefix_cache.engines`) on Qwen3-Next, Nemotron-H and K3, unbounded and at a
1 TB pool, the whole trace each, median of --runs runs: wall seconds and this process's CPU seconds (the
machine is shared: CPU time is the steadier figure), and the slowest median against the 5 s target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from k3sim.configs import load_model
from k3sim.prefix_cache import config_from_model
from k3sim.prefix_cache.setup import grid
from k3sim.serving.replay import replay
from k3sim.serving.prefix_cache_run import run_sweep
from k3sim.workloads import prefix_keys, read_mooncake

ROOT = Path(__file__).resolve().parents[1]


def bench_replay(trace: Path, model, policy: str, pb: int, cap: float | None, runs: int) -> dict:
    cfg = config_from_model(model, policy, 512, pb, cap)
    walls, res = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        res = replay(read_mooncake(trace), cfg)
        walls.append(time.perf_counter() - t0)
    w = statistics.median(walls)
    return {"policy": policy, "physical_block_tokens": pb, "capacity_bytes": cap, "replay_s_median": w,
            "replay_s_all": walls, "requests": res.requests, "requests_per_s": res.requests / w,
            "lookups_per_s": res.lookups / w, "lookup_probes_per_s": res.lookup_probes / w,
            "token_hit_rate": res.token_hit_rate}


def bench_lookup(trace: Path, model, runs: int) -> dict:
    """The two-level lookup alone: every request of the trace looked up again in the cache a full
    (unbounded, decoupled 512/6144) replay left behind. Read-only apart from counters."""
    reqs = list(read_mooncake(trace))
    res = replay(reqs, config_from_model(model, "decoupled", 512, 6144), keep_cache=True)
    cache = res.extra.pop("cache")
    keys = [(prefix_keys(r, 512), r.input_tokens) for r in reqs]
    cache.step += 1  # everything has landed
    walls = []
    for _ in range(runs):
        p0 = cache.stats.lookup_probes
        t0 = time.perf_counter()
        for k, L in keys:
            cache.lookup(k, L)
        walls.append(time.perf_counter() - t0)
        probes = cache.stats.lookup_probes - p0
    w = statistics.median(walls)
    return {"lookups": len(keys), "lookup_s_median": w, "lookups_per_s": len(keys) / w, "probes_per_s": probes / w}


def bench_sweep(trace: Path, model, policies: list[str], runs: int) -> dict:
    reqs = list(read_mooncake(trace))
    base = config_from_model(model, "decoupled", 512, 6144)
    cfgs = grid(base, policies, [512], [512, 1024, 2048, 4096, 6144], [None, 64e9, 256e9, 1e12])
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        df = run_sweep(reqs, cfgs)
        walls.append(time.perf_counter() - t0)
    return {"policies": policies, "configs": len(cfgs), "processes": os.cpu_count(),
            "sweep_s_median": statistics.median(walls), "sweep_s_all": walls,
            "replays_per_s": len(cfgs) / statistics.median(walls),
            "slowest_config_s": float(df["wall_s"].max())}


ENGINE_MODELS = ("models/qwen3-next-80b-a3b.yaml", "models/nemotron-h-56b.yaml", "models/kimi-k3.yaml")


def bench_engines(trace: Path, models: list[str], runs: int, caps=(None, 1e12)) -> list[dict]:
    """Each engine policy's replay of the whole trace (unit step clock: the replay's own cost is measured)."""
    from k3sim.errors import InputError
    from k3sim.prefix_cache.engines import ENGINE_POLICIES, engine_config

    out = []
    for path in models:
        model = load_model(str(ROOT / path))
        for policy in ENGINE_POLICIES:
            for cap in caps:
                try:
                    cfg = engine_config(model, policy, capacity_bytes=cap)
                except InputError:
                    continue
                walls, cpus, res = [], [], None
                for _ in range(runs):
                    t0, c0 = time.perf_counter(), time.process_time()
                    res = replay(read_mooncake(trace), cfg)
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
                r = {"model": model.name, "policy": policy, "capacity_bytes": cap,
                     "replay_s_median": statistics.median(walls), "cpu_s_median": statistics.median(cpus),
                     "replay_s_all": walls, "requests": res.requests, "token_hit_rate": res.token_hit_rate,
                     "evictions": res.evictions}
                out.append(r)
                print(f"engines {model.name:20s} {policy:20s} cap {cap!s:8s}: {r['replay_s_median']:.2f} s wall, "
                      f"{r['cpu_s_median']:.2f} s cpu, hit {100 * res.token_hit_rate:.2f} %", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(Path(__file__).resolve().parents[1] / "data/traces/conversation_trace.jsonl"))
    ap.add_argument("--model", default=str(ROOT / "models/kimi-k3.yaml"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sweep-runs", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "reports/prefix_cache/benchmark.json"))
    ap.add_argument("--only", choices=("all", "study", "engines"), default="all")
    a = ap.parse_args()
    trace, model = Path(a.trace), load_model(a.model)
    out = {"trace": trace.name, "cpu_count": os.cpu_count(), "replay": [], "sweep": []}
    if a.out and Path(a.out).exists() and a.only != "all":  # keep the other half of a previous run
        out = {**out, **json.loads(Path(a.out).read_text())}
    if a.only in ("all", "engines"):
        eng = bench_engines(trace, list(ENGINE_MODELS), a.runs)
        slowest = max(eng, key=lambda r: r["replay_s_median"])
        out["engines"] = {"replays": eng, "runs": a.runs, "target_s": 5.0,
                          "slowest": {k: slowest[k] for k in ("model", "policy", "capacity_bytes",
                                                              "replay_s_median", "cpu_s_median")},
                          "load_average_1min_start": os.getloadavg()[0]}
        print(f"engines: slowest median {slowest['replay_s_median']:.2f} s ({slowest['model']}, "
              f"{slowest['policy']}, cap {slowest['capacity_bytes']})")
    if a.only == "engines":
        _write(a.out, out)
        return
    for policy, pb, cap in [("decoupled", 6144, None), ("decoupled", 6144, 64e9), ("coarse", 6144, 64e9),
                            ("full-attention", 6144, 64e9), ("decoupled", 512, 64e9),
                            ("coarse", 512, 64e9), ("coarse", 512, None)]:
        r = bench_replay(trace, model, policy, pb, cap, a.runs)
        out["replay"].append(r)
        print(f"replay {policy:15s} block {pb:5d} cap {cap!s:8s}: {r['replay_s_median']:.2f} s, "
              f"{r['requests_per_s']:,.0f} req/s, {r['lookups_per_s']:,.0f} lookups/s, "
              f"{r['lookup_probes_per_s']:,.0f} probes/s")
    lk = bench_lookup(trace, model, a.runs)
    out["lookup"] = lk
    print(f"lookup alone: {lk['lookups_per_s']:,.0f} lookups/s, {lk['probes_per_s']:,.0f} probes/s")
    for pols in (["decoupled"], ["coarse", "decoupled", "full-attention"]):
        s = bench_sweep(trace, model, pols, a.sweep_runs)
        out["sweep"].append(s)
        print(f"sweep {','.join(pols)}: {s['configs']} configs in {s['sweep_s_median']:.1f} s on {s['processes']} cores")
    _write(a.out, out)


def _write(path: str, out: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
