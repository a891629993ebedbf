"""What `k3sim prefix-cache` runs: one replay of a trace file or a synthetic workload through the cache
(`simulate`), or a sweep of cache configurations on several processes that writes a table and plots
(`sweep_report`, `run_sweep`).

The trace is parsed once in the parent and inherited by forked workers (`k3sim.procs.ProcessPool`: they
ignore Ctrl-C and SIGTERM, the parent stops them); each worker replays whole configurations (the replay
itself is sequential: steps depend on the previous step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from k3sim.errors import DoesNotFit, InputError
from k3sim.files import atomic_write_text, output_dir, safe_name
from k3sim.prefix_cache.config import POLICIES, CacheConfig
from k3sim.prefix_cache.setup import SWEEP_OPTIONS, check_trace_granularity, grid, named_options
from k3sim.procs import ProcessPool, worker_count
from k3sim.serving.replay import NOT_IN_SWEEP_ROWS, ReplayResult, SchedulerConfig, StepCost, replay
from k3sim.workloads.mooncake import TraceStats, read_mooncake
from k3sim.workloads.request import TraceRequest

_REQUESTS: list[TraceRequest] = []  # set in the parent before forking


def _check_some_requests(trace: str | Path, stats: TraceStats) -> None:
    """A trace with no valid request is refused, naming its first problem."""
    if stats.requests == 0:
        first = f"; first: line {stats.problems[0][0]}: {stats.problems[0][1]}" if stats.problems else ""
        raise InputError(f"no valid request in the trace ({stats.skipped} malformed lines skipped{first})",
                         source=str(trace))


def _counted(requests, progress, total: int | None, every: int = 256):
    """Yield `requests` unchanged, reporting the count to `progress` every `every` requests and at the end."""
    if progress is None:
        yield from requests
        return
    n = 0
    for r in requests:
        yield r
        n += 1
        if n % every == 0:
            progress(n, total)
    progress(n, total if total is not None else n)


def simulate(trace: str | Path | None, cfg: CacheConfig, *, strict: bool = False, limit: int | None = None,
             sched: SchedulerConfig = SchedulerConfig(), cost: StepCost = StepCost(),
             workload: str | None = None, seed: int = 0, requests: int = 1000, progress=None) -> ReplayResult:
    """Stream a Mooncake trace (malformed lines skipped and listed unless `strict`) or a named synthetic
    token-level workload through the cache. `progress(requests_read, total_or_None)` is called as requests
    are handed to the replay (the CLI's stderr progress bar); the trace is never held in memory."""
    cfg.check_capacity()
    if workload is not None:
        from k3sim.workloads.synthetic import synthetic_workload

        reqs = synthetic_workload(workload, seed, requests)
        res = replay(_counted(reqs, progress, len(reqs)), cfg, sched, cost)
        res.extra["workload"] = {"name": workload, "seed": seed, "requests": requests}
        return res
    if trace is None:
        raise InputError("give a trace file or a synthetic workload", source="--trace/--workload")
    if not cfg.policy.startswith("vllm-"):  # a vLLM block is the rule's: keys.block_keys matches it conservatively
        check_trace_granularity(cfg.effective_hash_block_tokens,
                                "--physical-block" if cfg.policy == "coarse" else "--hash-block")
    stats = TraceStats()
    res = replay(_counted(read_mooncake(trace, strict=strict, stats=stats, limit=limit), progress, limit),
                 cfg, sched, cost)
    _check_some_requests(trace, stats)
    if res.requests == 0 and res.requests_rejected:
        raise DoesNotFit(
            f"capacity {cfg.capacity_bytes:.4g} B ({cfg.num_pages} pages of {cfg.page_bytes} B) is too small for "
            f"any of the trace's {res.requests_rejected} requests", source="--capacity-bytes", field="capacity_bytes")
    res.trace_lines_skipped = stats.skipped
    res.extra["trace"] = str(trace)
    res.extra["trace_problems"] = [{"line": ln, "reason": why} for ln, why in stats.problems]
    return res


@dataclass
class SweepReport:
    table: "object"  # pandas DataFrame, one row per configuration
    files: dict[str, str] = field(default_factory=dict)
    trace_lines_skipped: int = 0
    wall_s: float = 0.0


KIND = "prefix-cache-sweep"  # the output kind of `prefix-cache --sweep` (k3sim.files manifest)
WALL_CLOCK = ("wall_s",)  # machine timings: in the returned table and --json, never in a file (same inputs,
# same bytes)


def _results(df):
    """The sweep table without its wall-clock columns."""
    return df.drop(columns=[c for c in WALL_CLOCK if c in df.columns])


TABLE_COLUMNS = ["policy", "hash_block_tokens", "physical_block_tokens", "capacity_bytes", "token_hit_rate",
                 "request_hit_rate", "prefill_tokens_saved", "prefill_flop_saved_fraction", "checkpoint_bytes_peak",
                 "eviction", "evictions", "requests_rejected", "wall_s", "note"]  # note: a row not replayed


def sweep_report(trace: str | Path | None, base: CacheConfig, *, policies: Sequence[str], hash_blocks: Sequence[int],
                 physical_blocks: Sequence[int], capacities: Sequence[float | None], out_dir: str | Path,
                 name: str | None = None, strict: bool = False, limit: int | None = None,
                 sched: SchedulerConfig = SchedulerConfig(), cost: StepCost = StepCost(),
                 processes: int | None = None, workload: str | None = None, seed: int = 0,
                 n_requests: int = 1000, progress=None, engine=None) -> SweepReport:
    """Replay every valid configuration of the grid (`engine(policy, hash_block, physical_block, capacity)`
    builds an engine policy's configuration by its rules, `setup.grid`); write `<name>_sweep.csv`, `<name>_sweep.md` and the two
    plots (hit rate vs granularity per policy; hit rate vs capacity at the base physical/hash block) into
    `out_dir` through `k3sim.files.output_dir` (kind `prefix-cache-sweep`, one part per name; wall-clock
    seconds stay in the returned table, not in the files).

    `name` defaults to the trace's stem without a `_trace` suffix (`conversation_trace.jsonl` ->
    `conversation`); a name must be one file-name component (`k3sim.files.safe_name`)."""
    import time

    from k3sim.prefix_cache.plots import plot_capacity, plot_granularity

    for opt, values in (("--policies", policies), ("--hash-blocks", hash_blocks),
                        ("--physical-blocks", physical_blocks), ("--capacities", capacities)):
        if not values:
            raise InputError("needs at least one value", source=opt)
    for p in policies:
        if p not in POLICIES:
            raise InputError(f"unknown policy '{p}' (choose {', '.join(POLICIES)})", source="--policies")
    for opt, values in (("--physical-blocks", physical_blocks), ("--hash-blocks", hash_blocks)):
        for v in values:
            if v <= 0:
                raise InputError(f"must be positive (got {v})", source=opt)
    if name is not None:
        safe_name(name, source="--name")
    t0 = time.perf_counter()
    stats = TraceStats()
    if workload is not None:
        from k3sim.workloads.synthetic import synthetic_workload

        requests = synthetic_workload(workload, seed, n_requests)
        label = f"synthetic {workload} (seed {seed})"
        name = name or f"synthetic_{workload}"
    elif trace is not None:
        for hb in hash_blocks:
            check_trace_granularity(hb, "--hash-blocks")
        if "coarse" in policies:  # coarse hashes whole physical blocks
            for pb in physical_blocks:
                check_trace_granularity(pb, "--physical-blocks")
        requests = list(read_mooncake(trace, strict=strict, stats=stats, limit=limit))
        _check_some_requests(trace, stats)
        label = Path(trace).name
        name = name or safe_name(Path(trace).stem.removesuffix("_trace"), source=f"--trace {trace}",
                                 field="file name (the sweep's file prefix; or give --name)")
    else:
        raise InputError("give a trace file or a synthetic workload", source="--trace/--workload")
    with named_options(SWEEP_OPTIONS):
        configs = grid(base, policies, hash_blocks, physical_blocks, capacities, engine=engine)
    if not configs:
        raise InputError("no valid configuration: every hash block fails to divide every physical block",
                         source="--hash-blocks")
    df = run_sweep(requests, configs, sched, cost, processes, progress)
    if "token_hit_rate" not in df:  # every row is a "capacity below one request" note
        raise InputError("every capacity is below what one request needs (1 KV page + one state slot per KDA "
                         "group) at every physical block", source="--capacities")
    df["capacity_bytes"] = df["capacity_bytes"].astype(float)  # unbounded = NaN, also when no row is bounded
    replayed = df[df["token_hit_rate"].notna()]  # note rows have no hit rate to plot
    out = Path(out_dir)
    files = {"csv": str(out / f"{name}_sweep.csv"), "table": str(out / f"{name}_sweep.md"),
             "granularity_plot": str(out / f"{name}_hit_vs_granularity.png"),
             "capacity_plot": str(out / f"{name}_hit_vs_capacity.png")}
    cols = [c for c in TABLE_COLUMNS if c in df and c not in WALL_CLOCK]
    md = df[cols].copy()
    for c in ("token_hit_rate", "request_hit_rate", "prefill_flop_saved_fraction"):
        if c in md:
            md[c] = (100 * md[c]).round(2)
    if "note" in md:
        md["note"] = md["note"].fillna("")
    md["capacity_bytes"] = md["capacity_bytes"].map(lambda v: "unbounded" if v != v or v is None else f"{v:.3g}")
    header = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in md.itertuples(index=False))
    pb = base.physical_block_tokens if base.physical_block_tokens in physical_blocks else max(physical_blocks)
    hb = base.hash_block_tokens if base.hash_block_tokens in hash_blocks else min(hash_blocks)
    # one part per name: a directory holds the sweeps of several traces (reports/prefix_cache)
    with output_dir(out, kind=KIND, part=name, source="--out"):
        atomic_write_text(files["csv"], _results(df).to_csv(index=False))
        atomic_write_text(files["table"], f"Sweep on `{label}` (hit rates in %, bytes SI)\n\n" + header + body)
        plot_granularity(replayed, Path(files["granularity_plot"]), f"{label}: token hit rate vs granularity")
        plot_capacity(replayed, Path(files["capacity_plot"]), label, pb, hb)
    return SweepReport(df, files, stats.skipped, time.perf_counter() - t0)


def _one(args: tuple[int, CacheConfig, SchedulerConfig, StepCost]) -> tuple[int, dict]:
    i, cfg, sched, cost = args
    try:
        cfg.check_capacity()
    except InputError:
        return i, {"policy": cfg.policy, "hash_block_tokens": cfg.effective_hash_block_tokens,
                   "physical_block_tokens": cfg.physical_block_tokens, "capacity_bytes": cfg.capacity_bytes,
                   "note": "capacity below one request"}
    res = replay(_REQUESTS, cfg, sched, cost)
    row = dataclasses.asdict(res)
    for key in ("extra", *NOT_IN_SWEEP_ROWS):
        row.pop(key, None)
    return i, row


def run_sweep(
    requests: Sequence[TraceRequest],
    configs: Sequence[CacheConfig],
    sched: SchedulerConfig = SchedulerConfig(),
    cost: StepCost | Sequence[StepCost] = StepCost(),
    processes: int | None = None,
    progress: Callable[[int, int], None] | None = None,
):
    """One row per configuration (a pandas DataFrame, SI units), in the order of `configs`, on `processes`
    workers (default one per core; never more than configurations). `cost`: one step clock, or one per
    configuration (configurations of several models).

    `progress(done, total)` is called after each configuration (the CLI draws a bar on stderr with it)."""
    import pandas as pd

    global _REQUESTS
    _REQUESTS = list(requests)
    processes = worker_count(processes, len(configs))
    # slowest first so the last worker does not finish alone: small blocks and coarse policies cost most
    order = sorted(range(len(configs)), key=lambda i: (configs[i].physical_block_tokens, configs[i].policy != "coarse"))
    costs = list(cost) if isinstance(cost, (list, tuple)) else [cost] * len(configs)
    tasks = [(i, configs[i], sched, costs[i]) for i in order]
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
