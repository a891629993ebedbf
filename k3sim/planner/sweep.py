"""`sweep`: a grid of layouts through the analytic models, in local processes or on a Dask cluster.

Training: every (tp, pp, virtual_stages, ep, cp, dp, micro-batches) point runs the training step model
(closed-form pipeline: the analytic path) and the memory planner; by default dp fills the cluster and the
micro-batch count keeps the scenario's global batch (sequences per step), so every point trains the same
tokens per step. Serving: every (batch limit, prefill:decode replica split) point runs the serving
simulation (k3sim.serving, the same run as `k3sim serve --workload chat`) on a seeded request sample:
goodput per GPU against p99 TTFT.

The grid is bounded before it is built (`check_grid_size`: the product of the list lengths against the bounds
table's `sweep_points_train` / `sweep_points_serve`); a layout that needs more GPUs than the cluster has is not
a point, and a given value that ends up in no point is refused with the reason (never silently dropped).

Points are split into chunks; a chunk runs in one process, which loads the scenario once and shares the
memoised kernel times across its points. Results are sorted by point index, and every random choice is
seeded, so a sweep gives identical rows however it is run (serial, local processes, a Dask cluster). A
point that fails (a layout the model refuses, a kernel outside its range) is a row with status "error"
and its one-line reason; it never stops the sweep.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from k3sim.errors import InputError

TRAIN_DIMS = ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "num_micro_batches")
SERVE_DIMS = ("max_batch", "prefill_replicas")
TRAIN_COLUMNS = ["index", *TRAIN_DIMS, "gpus", "status", "error", "step_time_s", "tokens_per_step", "tokens_per_s",
                 "tokens_per_s_per_gpu", "mfu", "fits", "memory_per_gpu_bytes", "bubble_ratio", "ep_imbalance",
                 "compute_s", "exposed_tp_s", "exposed_ep_s", "exposed_cp_s", "exposed_pp_s", "exposed_dp_s",
                 "bubble_s"]
SERVE_COLUMNS = ["index", *SERVE_DIMS, "decode_replicas", "gpus", "status", "error", "fits", "ttft_p50_s",
                 "ttft_p99_s", "tpot_p99_s", "goodput_requests_per_s", "goodput_requests_per_s_per_gpu",
                 "throughput_output_tokens_per_s_per_gpu", "token_hit_rate", "requests"]
# Serving points: a seeded synthetic chat sample per point (a modelling choice: enough requests to load the
# fleet, few enough that a point takes seconds); `sweep(..., serving_requests=)` changes it.
SERVING_REQUESTS = 200


@dataclass
class SweepResult:
    """A sweep as data; `k3sim.report.sweep.write_sweep` writes its files (the planner writes none)."""

    scenario: str               # the scenario's name
    mode: str
    table: Any                  # pandas DataFrame, one row per point
    fitting: Any                # the rows evaluated without error that fit in memory: the Pareto candidates
    front: Any                  # the Pareto rows
    x: str                      # Pareto axes: x minimised, y maximised
    y: str
    xlabel: str                 # the axes in words (figure labels)
    ylabel: str
    wall_s: float
    workers: int
    scheduler: str


# ------------------------------------------------------------------------------------------ the grid
# Each dimension as the user writes it: the option of `k3sim sweep` (the scenario field is sweep.<dim>).
DIM_OPTIONS = {"tp": "--tp", "pp": "--pp", "virtual_stages": "--virtual", "ep": "--ep", "cp": "--cp",
               "dp": "--dp", "num_micro_batches": "--micro-batches", "max_batch": "--max-batch",
               "prefill_replicas": "--prefill-replicas"}


def _divisors_in(n: int, cands) -> list[int]:
    return [c for c in cands if n % c == 0]


def written_as(inp, dim: str, values) -> str:
    """What the user wrote a dimension's values under: the scenario's `sweep.<dim>` when they are its values,
    else the command-line option (also for a default list, which the option replaces)."""
    section = getattr(inp.sweep, dim, None)
    return f"sweep.{dim}" if section is not None and list(section) == list(values) else DIM_OPTIONS[dim]


def check_grid_size(inp, lists: dict[str, list], given: dict[str, list[int] | None]) -> int:
    """The grid's size from its list lengths alone, refused above the bounds table's `sweep_points_<mode>`
    before any point is built: a 10^7-point grid costs one multiplication here, not 10^7 dicts. The size is
    that of the full product (layouts that do not fit the cluster are dropped later, so the grid may end
    smaller, never larger)."""
    from k3sim.configs.bounds import BOUNDS

    n = math.prod(len(v) for v in lists.values())
    kind = "sweep_points_train" if inp.mode == "train" else "sweep_points_serve"
    cap = int(BOUNDS[kind].hi)
    if n > cap:
        longest = max(lists, key=lambda d: len(lists[d]))
        sizes = " x ".join(f"{len(v):,} {d}" + ("" if given.get(d) else " (default)")
                           for d, v in lists.items() if len(v) > 1)
        what = "training layouts" if inp.mode == "train" else "serving points"
        raise InputError(f"the grid has {n:,} points ({sizes}), more than the {cap:,} {what} one sweep runs "
                         f"(k3sim/configs/bounds.py: {kind}); give fewer values",
                         source=written_as(inp, longest, lists[longest]))
    return n


BLAME_ORDER = ("dp", "num_micro_batches", "virtual_stages", "cp", "ep", "pp", "tp")


def _refuse_unused(inp, given: dict[str, list[int] | None], used: dict[str, set], why: dict, *,
                   empty: bool = False) -> None:
    """A value the user gave that no point of the grid uses would be an ignored input: refused, with the
    reason its layouts were dropped (`why[(dim, value)]`, the first one met). Dimensions that scale a layout
    up (dp, micro-batches, virtual stages) are blamed before those it is built on (tp, pp)."""
    for dim in BLAME_ORDER:
        values = given.get(dim)
        if not values or dim not in used:
            continue
        for v in values:
            if v not in used[dim]:
                reason = why.get((dim, v), "no layout of the other lists takes it")
                lead = "the sweep grid is empty: " if empty else ""
                raise InputError(f"{lead}{v:,} is in no point of the grid: {reason}; remove it, or change the "
                                 "other lists", source=written_as(inp, dim, values))


def training_grid(inp, given: dict[str, list[int] | None]) -> list[dict]:
    """Cartesian product of the given values (defaults derived from the scenario); dp None = fill the
    cluster, micro-batches None = keep the scenario's global batch. A layout that needs more GPUs than the
    cluster has (tp*pp*cp*dp > cluster.num_gpus) or has virtual stages without a pipeline is not a point;
    a given value left in no point at all is refused with the reason (`_refuse_unused`), never dropped
    silently."""
    sc, model = inp.scenario, inp.model
    par, w = sc.parallelism, sc.workload
    heads = math.gcd(*(c.num_heads for c in (model.kda, model.mla) if c is not None)) if (model.kda or model.mla) else 1
    domain = int(inp.hw.scaleup_domain_gpus)
    tps = given.get("tp") or _divisors_in(heads, [t for t in (1, 2, 4, 8) if t <= domain])
    pps = given.get("pp") or [p for p in (1, 2, 4, 8, 16, 32) if p <= model.num_layers]
    vs = given.get("virtual_stages") or [1, 2]
    experts = model.moe.num_routed_experts if model.moe else 1
    eps = given.get("ep") or ([e for e in (1, 8, 16, 32, 64, 128) if experts % e == 0] if model.moe else [1])
    cps = given.get("cp") or [c for c in (1, 2, 4, 8) if w.context_tokens % (2 * c) == 0]
    dps = given.get("dp")
    mbs = given.get("num_micro_batches")
    check_grid_size(inp, {"tp": tps, "pp": pps, "virtual_stages": vs, "ep": eps, "cp": cps, "dp": dps or [0],
                          "num_micro_batches": mbs or [0]}, given)
    m0 = w.num_micro_batches or par.pp * par.virtual_stages
    global_seqs = m0 * par.dp * w.micro_batch_size
    gpus = sc.cluster.num_gpus
    used: dict[str, set] = {d: set() for d in TRAIN_DIMS}
    why: dict = {}

    def drop(reason: str, **combo) -> None:
        for d, v in combo.items():
            why.setdefault((d, v), reason)

    points = []
    for tp, pp, v, ep, cp in itertools.product(tps, pps, vs, eps, cps):
        combo = dict(tp=tp, pp=pp, virtual_stages=v, ep=ep, cp=cp)
        if pp == 1 and v > 1:
            drop("virtual stages need a pipeline (pp > 1)", **combo)
            continue
        base = tp * pp * cp
        if base > gpus:
            drop(f"tp*pp*cp={base:,} GPUs exceed the cluster's {gpus:,} (cluster.num_gpus)", **combo)
            continue
        if dps is None and gpus % base:
            drop(f"tp*pp*cp={base:,} does not divide the cluster's {gpus:,} GPUs (dp fills the cluster)", **combo)
            continue
        for dp in (dps or [gpus // base]):
            if base * dp > gpus:
                drop(f"tp*pp*cp*dp={base * dp:,} GPUs exceed the cluster's {gpus:,} (cluster.num_gpus)",
                     **combo, dp=dp)
                continue
            for m in (mbs or [max(1, global_seqs // (dp * w.micro_batch_size))]):
                p = {**combo, "dp": dp, "num_micro_batches": m}
                points.append(p)
                for d, x in p.items():
                    used[d].add(x)
    if not points:
        _refuse_unused(inp, given, used, why, empty=True)  # names the value the user gave, when there is one
        first = next(iter(why.values()), "no layout")
        raise InputError(f"the sweep grid is empty: every layout of the given values is dropped (the first: "
                         f"{first}); change --tp/--pp/--cp/--dp or the sweep: section", source=str(inp.path),
                         field="sweep")
    _refuse_unused(inp, given, used, why)
    return [{"index": i, **p} for i, p in enumerate(points)]


def serving_grid(inp, given: dict[str, list[int] | None]) -> list[dict]:
    """Batch limits x prefill replicas (0: the scenario's own fleet, mixed or as its serving section
    splits it; p >= 1: p prefill and R - p decode replicas of the scenario's layout)."""
    sc = inp.scenario
    sv = sc.serving
    R = (sv.replicas if sv is not None and sv.replicas else None) or sc.replicas
    batches = given.get("max_batch") or [16, 64, 256]   # modelling choice: small, medium, large batch limits
    splits = given.get("prefill_replicas") or ([0] + list(range(1, R)) if R > 1 else [0])
    bad = [p for p in splits if p >= R]
    if bad:
        raise InputError(f"{bad[0]} prefill replica(s) leave no decode replica: the fleet has {R} replica(s), so "
                         f"a P:D split takes 1 to {R - 1} (0: the scenario's own fleet)"
                         if R > 1 else f"{bad[0]} prefill replica(s): the fleet has one replica, no P:D split "
                         "(only 0: the scenario's own fleet)", source=written_as(inp, "prefill_replicas", splits))
    check_grid_size(inp, {"max_batch": batches, "prefill_replicas": splits}, given)
    pts = []
    for b, p in itertools.product(batches, splits):
        pts.append({"max_batch": b, "prefill_replicas": p, "decode_replicas": (R - p) if p else 0})
    return [{"index": i, **q} for i, q in enumerate(pts)]


def grid(inp, given: dict[str, list[int] | None]) -> list[dict]:
    """The points of a sweep; an empty grid is refused (nothing to run is bad input, not an empty result)."""
    pts = training_grid(inp, given) if inp.mode == "train" else serving_grid(inp, given)
    if not pts:
        raise InputError("the sweep grid is empty: no layout of the given values uses the cluster's "
                         f"{inp.scenario.cluster.num_gpus} GPUs (check --tp/--pp/--cp/--dp or the sweep: section)",
                         source=str(inp.path), field="sweep")
    return pts


# ------------------------------------------------------------------------------------------ evaluation
@lru_cache(maxsize=8)
def _worker_state(path: str, kernel_key: str | None):
    """Per process: the scenario, and one TrainingContext whose memoised kernel times all points share."""
    from k3sim.planner.inputs import load
    from k3sim.training import TrainingContext

    inp = load(path)
    kt = _KERNELS.get(kernel_key) if kernel_key else None
    ctx = TrainingContext(inp.model, inp.hw, kernel_time=kt) if inp.mode == "train" else None
    return inp, ctx, kt


# Named kernel-time functions a sweep may use instead of the predictor (picklable by name: tests, benches).
_KERNELS: dict[str, Callable] = {}


def register_kernel_time(name: str, fn: Callable) -> None:
    _KERNELS[name] = fn


def _train_point(inp, ctx, p: dict) -> dict:
    from k3sim.configs.parallel import Parallelism
    from k3sim.training import train_step

    w = inp.scenario.workload
    par = Parallelism(tp=p["tp"], pp=p["pp"], virtual_stages=p["virtual_stages"], ep=p["ep"], cp=p["cp"],
                      dp=p["dp"], zero_stage=inp.scenario.parallelism.zero_stage)
    r = train_step(inp.model, inp.hw, par, seq_len=w.context_tokens, micro_batch_size=w.micro_batch_size,
                   num_micro_batches=p["num_micro_batches"], activation_checkpointing=w.activation_checkpointing,
                   workspace_fraction=w.workspace_fraction, options=inp.training.options(False), context=ctx,
                   source="sweep point")
    e = r.exposed_comm_s
    return {"gpus": par.gpus, "step_time_s": r.step_time_s, "tokens_per_step": r.tokens_per_step,
            "tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "mfu": r.mfu,
            "fits": bool(r.fits), "memory_per_gpu_bytes": float(r.memory.per_gpu_bytes["total"]),
            "bubble_ratio": r.bubble_ratio, "ep_imbalance": r.ep_imbalance, "compute_s": r.compute_s,
            **{f"exposed_{k}_s": e[k] for k in ("tp", "ep", "cp", "pp", "dp")}, "bubble_s": r.bubble_s}


def _serve_point(inp, kt, p: dict, requests: int) -> dict:
    from k3sim.planner.plan import serving_sample
    from k3sim.serving.run import ServeSetup, simulate

    split = f"{p['prefill_replicas']}:{p['decode_replicas']}" if p["prefill_replicas"] else None
    setup = ServeSetup.from_scenario(inp.path, disaggregate=split)
    sv = setup.serving
    setup.serving = sv.model_copy(update={"engine": sv.engine.model_copy(update={"max_batch": p["max_batch"]})})
    s = simulate(setup, serving_sample(setup, requests)).summary
    return {"gpus": setup.gpus, "fits": True, "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
            "tpot_p99_s": s["tpot_p99_s"], "goodput_requests_per_s": s["goodput_requests_per_s"],
            "goodput_requests_per_s_per_gpu": s["goodput_requests_per_s"] / setup.gpus,
            "throughput_output_tokens_per_s_per_gpu": s["throughput_output_tokens_per_s_per_gpu"],
            "token_hit_rate": s["token_hit_rate"], "requests": s["requests"]}


def evaluate_chunk(args: tuple) -> list[dict]:
    """Run one chunk of points (top-level: picklable for process pools and Dask)."""
    path, points, kernel_key, requests = (*args, SERVING_REQUESTS)[:4]
    inp, ctx, kt = _worker_state(path, kernel_key)
    out = []
    for p in points:
        row = dict(p)
        try:
            row.update(_train_point(inp, ctx, p) if inp.mode == "train" else _serve_point(inp, kt, p, requests))
            row["status"], row["error"] = "ok", ""
        except InputError as err:
            row["status"], row["error"] = "error", str(err)
        except (ValueError, ArithmeticError, KeyError, RuntimeError) as err:  # a model refusing: recorded, not fatal
            row["status"], row["error"] = "error", f"{type(err).__name__}: {err}"
        out.append(row)
    return out


def _chunks(points: list[dict], size: int) -> list[list[dict]]:
    return [points[i:i + size] for i in range(0, len(points), size)]


# Chunks per worker when --chunk-size is not given: a modelling choice, enough that a slow chunk does not
# leave the other workers idle at the end, few enough that each loads the scenario once.
CHUNKS_PER_WORKER = 4


def chunking(n: int, workers: int = 1, chunk_size: int | None = None) -> tuple[int, int]:
    """(points per chunk, local processes) for `n` points: never more processes than chunks (a 2-point grid
    on `--workers 64` starts 2), and 1 means this process, no fork."""
    from k3sim.procs import worker_count

    if chunk_size is None:
        chunk_size = max(1, math.ceil(n / (max(workers, 1) * CHUNKS_PER_WORKER)))
    return chunk_size, worker_count(max(workers, 1), math.ceil(n / chunk_size) if n else 1)


def run_points(path: str | Path, points: list[dict], *, workers: int = 1, scheduler: str | None = None,
               chunk_size: int | None = None, kernel_key: str | None = None,
               progress: Callable[[int, int], None] | None = None,
               serving_requests: int = SERVING_REQUESTS) -> list[dict]:
    """Evaluate `points`: in this process (workers 1), on forked local processes (workers > 1; at most one
    per chunk, `k3sim.procs.ProcessPool`), or on a Dask distributed cluster (`scheduler` = tcp://HOST:PORT).
    Ctrl-C or SIGTERM stops every way promptly: local workers are killed, a cluster's futures cancelled."""
    path = str(path)
    n = len(points)
    chunk_size, processes = chunking(n, workers, chunk_size)
    chunks = [(path, c, kernel_key, serving_requests) for c in _chunks(points, chunk_size)]
    results: list[list[dict]] = []
    done = 0

    def record(part: list[dict]) -> None:
        nonlocal done
        results.append(part)
        done += len(part)
        if progress:
            progress(done, n)

    if scheduler:
        _run_distributed(scheduler, chunks, record)
    elif processes <= 1:
        for c in chunks:
            record(evaluate_chunk(c))
    else:
        from k3sim.procs import ProcessPool

        # forked: workers inherit the imported modules (spawn re-imports numpy, pandas, k3sim per worker,
        # seconds each on a small machine) and each loads the scenario once per chunk (`_worker_state`)
        with ProcessPool(processes) as pool:
            for part in pool.imap_unordered(evaluate_chunk, chunks):
                record(part)
    rows = [r for part in results for r in part]
    return sorted(rows, key=lambda r: r["index"])


# Seconds the Dask client may take to close when a sweep stops: bounded, so Ctrl-C ends the command within the
# CLI contract's 2 s even when the scheduler is slow to answer.
CLIENT_CLOSE_S = 1.0


def _run_distributed(address: str, chunks: list, record: Callable[[list[dict]], None]) -> None:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise InputError("dask[distributed] is not installed", source="--scheduler") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as err:
        raise InputError(f"cannot reach the Dask scheduler ({err.__class__.__name__}: {err})",
                         source=f"--scheduler {address}") from None
    futures = []
    try:
        futures = client.map(evaluate_chunk, chunks, pure=False)
        for fut in as_completed(futures):
            record(fut.result())
    finally:
        # Ctrl-C, SIGTERM or an error: the cluster must not keep computing chunks nobody collects
        pending = [f for f in futures if not f.done()]
        try:
            if pending:
                client.cancel(pending, force=True)
        except Exception:  # noqa: BLE001 - the scheduler may be gone; closing is what matters
            pass
        finally:
            client.close(timeout=CLIENT_CLOSE_S)


# ------------------------------------------------------------------------------------------ Pareto
def pareto_front(df, minimize: str, maximize: str):
    """Rows no other row beats on both axes (lower `minimize`, higher `maximize`)."""
    d = df.sort_values([minimize, maximize], ascending=[True, False])
    keep, best = [], -math.inf
    for idx, y in zip(d.index, d[maximize]):
        if y > best:
            keep.append(idx)
            best = y
    return d.loc[keep]


def sweep(path: str | Path, *, given: dict[str, list[int] | None] | None = None,
          workers: int = 1, scheduler: str | None = None, chunk_size: int | None = None,
          kernel_key: str | None = None, progress: Callable | None = None,
          serving_requests: int = SERVING_REQUESTS) -> SweepResult:
    """Grid -> rows -> the table and its Pareto front, as data (`k3sim.report.sweep.write_sweep` writes them)."""
    import pandas as pd

    from k3sim.planner.inputs import load

    inp = load(path)
    merged = {k: v for k, v in inp.sweep.model_dump().items() if v is not None}
    merged.update({k: v for k, v in (given or {}).items() if v})
    if workers < 1:
        raise InputError(f"must be >= 1 (got {workers})", source="--workers")
    points = grid(inp, merged)
    t0 = time.perf_counter()
    rows = run_points(path, points, workers=workers, scheduler=scheduler, chunk_size=chunk_size,
                      kernel_key=kernel_key, progress=progress, serving_requests=serving_requests)
    wall = time.perf_counter() - t0
    used = workers if scheduler else chunking(len(points), workers, chunk_size)[1]  # processes that ran
    label = scheduler or ("serial" if used == 1 else "processes")
    cols = TRAIN_COLUMNS if inp.mode == "train" else SERVE_COLUMNS
    df = pd.DataFrame(rows)
    for c in cols:
        if c not in df.columns:
            df[c] = None
    df = df[cols]
    if inp.mode == "train":
        x, y = "step_time_s", "tokens_per_s_per_gpu"
        xl, yl = "step time (s)", "tokens/s per GPU"
    else:
        x, y = "ttft_p99_s", "goodput_requests_per_s_per_gpu"
        xl, yl = "p99 TTFT (s)", "goodput (requests/s) per GPU"
    ok = df[(df["status"] == "ok") & (df["fits"] == True)]  # noqa: E712 (pandas mask)
    front = pareto_front(ok, x, y) if len(ok) else ok
    return SweepResult(inp.scenario.name, inp.mode, df, ok, front, x, y, xl, yl, wall, used, label)
