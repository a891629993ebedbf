"""Sweep the cache over policy x hash block x physical block x capacity, on several processes.

The trace is parsed once in the parent and inherited by forked workers (`k3sim.procs.ProcessPool`: they
ignore Ctrl-C and SIGTERM, the parent stops them); each worker replays whole configurations (the replay
itself is sequential: steps depend on the previous step).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence

from k3sim.prefix_cache.config import CacheConfig
from k3sim.procs import ProcessPool, worker_count
from k3sim.prefix_cache.serving import SchedulerConfig, StepCost, replay
from k3sim.workloads.request import TraceRequest

_REQUESTS: list[TraceRequest] = []  # set in the parent before forking


def grid(
    base: CacheConfig,
    policies: Sequence[str],
    hash_blocks: Sequence[int],
    physical_blocks: Sequence[int],
    capacities: Sequence[float | None],
) -> list[CacheConfig]:
    """Valid configurations only: a hash block must divide the physical block; `coarse` ignores the hash block
    (it hashes whole physical blocks), `full-attention` needs no KDA state."""
    out: list[CacheConfig] = []
    seen = set()
    for pol, hb, pb, cap in itertools.product(policies, hash_blocks, physical_blocks, capacities):
        if pol == "coarse":
            hb = pb
        if pb % hb:
            continue
        key = (pol, hb, pb, cap)
        if key in seen:
            continue
        seen.add(key)
        out.append(dataclasses.replace(base, policy=pol, hash_block_tokens=hb, physical_block_tokens=pb,
                                       capacity_bytes=cap))
    return out


def _one(args: tuple[int, CacheConfig, SchedulerConfig, StepCost]) -> tuple[int, dict]:
    i, cfg, sched, cost = args
    n_pages = cfg.num_pages
    if n_pages is not None and n_pages < cfg.min_pages_one_request():
        return i, {"policy": cfg.policy, "hash_block_tokens": cfg.effective_hash_block_tokens,
                   "physical_block_tokens": cfg.physical_block_tokens, "capacity_bytes": cfg.capacity_bytes,
                   "note": "capacity below one request"}
    res = replay(_REQUESTS, cfg, sched, cost)
    row = dataclasses.asdict(res)
    row.pop("extra", None)
    return i, row


def run_sweep(
    requests: Sequence[TraceRequest],
    configs: Sequence[CacheConfig],
    sched: SchedulerConfig = SchedulerConfig(),
    cost: StepCost = StepCost(),
    processes: int | None = None,
    progress: Callable[[int, int], None] | None = None,
):
    """One row per configuration (a pandas DataFrame, SI units), in the order of `configs`, on `processes`
    workers (default one per core; never more than configurations).

    `progress(done, total)` is called after each configuration (the CLI draws a bar on stderr with it)."""
    import pandas as pd

    global _REQUESTS
    _REQUESTS = list(requests)
    processes = worker_count(processes, len(configs))
    # slowest first so the last worker does not finish alone: small blocks and coarse policies cost most
    order = sorted(range(len(configs)), key=lambda i: (configs[i].physical_block_tokens, configs[i].policy != "coarse"))
    tasks = [(i, configs[i], sched, cost) for i in order]
    rows: list[dict | None] = [None] * len(configs)
    done = 0

    def record(i: int, row: dict) -> None:
        nonlocal done
        rows[i] = row
        done += 1
        if progress is not None:
            progress(done, len(tasks))

    if processes <= 1:
        for t in tasks:
            record(*_one(t))
    else:
        with ProcessPool(processes) as pool:  # Ctrl-C, SIGTERM or an error: the workers are killed on the way out
            for i, row in pool.imap_unordered(_one, tasks):
                record(i, row)
    return pd.DataFrame(rows)
