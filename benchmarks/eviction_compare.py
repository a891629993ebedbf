"""LRU vs flop-aware (Marconi-style) eviction on the Mooncake traces at tight capacities (not a test).

    python3 benchmarks/eviction_compare.py [--out reports/prefix_cache/eviction.csv]

Decoupled policy (hash block 512, physical block 6144), K3 at TP 1; both cores.
"""

from __future__ import annotations

import argparse
import csv
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = {"conversation": ROOT / "data/traces/conversation_trace.jsonl",
          "synthetic": ROOT / "data/traces/synthetic_trace.jsonl"}
CAPACITIES = (32e9, 64e9, 128e9, 256e9)
SETTINGS = (("lru", 0.0), ("flop-aware", 0.5), ("flop-aware", 1.0), ("flop-aware", 2.0))


def one(job: tuple[str, float, str, float]) -> dict:
    from k3sim.prefix_cache.setup import make_config
    from k3sim.serving.prefix_cache_run import simulate

    trace, cap, eviction, alpha = job
    cfg = make_config(ROOT / "models/kimi-k3.yaml", "decoupled", 512, 6144, cap, eviction=eviction,
                      eviction_alpha=alpha or None)
    r = simulate(TRACES[trace], cfg)
    return {"trace": trace, "capacity_bytes": cap, "eviction": eviction, "alpha": alpha if alpha else "",
            "token_hit_rate": round(r.token_hit_rate, 5),
            "prefill_flop_saved_fraction": round(r.prefill_flop_saved_fraction, 5),
            "evictions": r.evictions, "wall_s": round(r.wall_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "reports/prefix_cache/eviction.csv")
    a = ap.parse_args()
    jobs = [(t, c, e, al) for t in TRACES for c in CAPACITIES for e, al in SETTINGS]
    with ProcessPoolExecutor(2) as ex:
        rows = list(ex.map(one, jobs))
    tmp = a.out.with_suffix(".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    tmp.replace(a.out)
    for r in rows:
        print(f"{r['trace']:12s} {r['capacity_bytes']:.0e} {r['eviction']:10s} {str(r['alpha']):4s} "
              f"token hit {100 * r['token_hit_rate']:6.2f} %  FLOP saved {100 * r['prefill_flop_saved_fraction']:6.2f} %")


if __name__ == "__main__":
    main()
