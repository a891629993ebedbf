"""`sweep`: a grid of layouts through the analytic models, in local processes or on a Dask cluster.

Training: every (tp, pp, virtual_stages, ep, cp, dp, micro-batches) point runs the training step model
(closed-form pipeline: the analytic path) and the memory planner; by default dp fills the cluster and the
micro-batch count keeps the scenario's global batch (sequences per step), so every point trains the same
tokens per step. Serving: every (batch limit, prefill:decode replica split) point runs the serving
simulation (k3sim.serving, the same run as `k3sim serve --workload chat`) on a seeded request sample:
goodput per GPU against p99 TTFT.

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
    mode: str
    table: Any                  # pandas DataFrame, one row per point
    front: Any                  # the Pareto rows
    x: str                      # Pareto axes: x minimised, y maximised
    y: str
    wall_s: float
    workers: int
    scheduler: str
    files: list[str]


# ------------------------------------------------------------------------------------------ the grid
def _divisors_in(n: int, cands) -> list[int]:
    return [c for c in cands if n % c == 0]


def training_grid(inp, given: dict[str, list[int] | None]) -> list[dict]:
    """Cartesian product of the given values (defaults derived from the scenario); dp None = fill the
    cluster, micro-batches None = keep the scenario's global batch."""
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
    m0 = w.num_micro_batches or par.pp * par.virtual_stages
    global_seqs = m0 * par.dp * w.micro_batch_size
    points = []
    for tp, pp, v, ep, cp in itertools.product(tps, pps, vs, eps, cps):
        if pp == 1 and v > 1:
            continue
        for dp in (dps or [sc.cluster.num_gpus // (tp * pp * cp)] if (tp * pp * cp) <= sc.cluster.num_gpus else []):
            if dp < 1:
                continue
            if dps is None and tp * pp * cp * dp != sc.cluster.num_gpus:
                continue
            for m in (mbs or [max(1, global_seqs // (dp * w.micro_batch_size))]):
                points.append({"tp": tp, "pp": pp, "virtual_stages": v, "ep": ep, "cp": cp, "dp": dp,
                               "num_micro_batches": m})
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
                         "(only 0: the scenario's own fleet)", source="--prefill-replicas")
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


def run_points(path: str | Path, points: list[dict], *, workers: int = 1, scheduler: str | None = None,
               chunk_size: int | None = None, kernel_key: str | None = None,
               progress: Callable[[int, int], None] | None = None,
               serving_requests: int = SERVING_REQUESTS) -> list[dict]:
    """Evaluate `points`: in this process (workers 1), local processes through Dask's multiprocessing
    scheduler (workers > 1), or on a Dask distributed cluster (`scheduler` = tcp://HOST:PORT)."""
    path = str(path)
    n = len(points)
    if chunk_size is None:
        parallel = max(workers, 1) * 4
        chunk_size = max(1, math.ceil(n / parallel))
    chunks = [(path, c, kernel_key, serving_requests) for c in _chunks(points, chunk_size)]
    results: list[list[dict]] = []
    if scheduler:
        results = _run_distributed(scheduler, chunks, progress, n)
    elif workers <= 1:
        done = 0
        for c in chunks:
            results.append(evaluate_chunk(c))
            done += len(c[1])
            if progress:
                progress(done, n)
    else:
        import dask
        import dask.bag as db

        # fork: workers inherit the imported modules (spawn re-imports numpy, pandas, k3sim per worker,
        # seconds each on a small machine); nothing in the parent holds a lock a child could inherit.
        import multiprocessing as mp

        ctx = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with dask.config.set({"multiprocessing.context": ctx}):
            results = db.from_sequence(chunks, npartitions=len(chunks)).map(evaluate_chunk).compute(
                scheduler="processes", num_workers=workers)
        if progress:
            progress(n, n)
    rows = [r for part in results for r in part]
    return sorted(rows, key=lambda r: r["index"])


def _run_distributed(address: str, chunks: list, progress, n: int) -> list[list[dict]]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise InputError("dask[distributed] is not installed", source="--scheduler") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as err:
        raise InputError(f"cannot reach the Dask scheduler ({err.__class__.__name__}: {err})",
                         source=f"--scheduler {address}") from None
    try:
        futures = client.map(evaluate_chunk, chunks, pure=False)
        done = 0
        out = []
        for fut in as_completed(futures):
            part = fut.result()
            out.append(part)
            done += len(part)
            if progress:
                progress(done, n)
        return out
    finally:
        client.close()


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


def sweep(path: str | Path, out: str | Path, *, given: dict[str, list[int] | None] | None = None,
          workers: int = 1, scheduler: str | None = None, chunk_size: int | None = None,
          kernel_key: str | None = None, progress: Callable | None = None,
          serving_requests: int = SERVING_REQUESTS) -> SweepResult:
    """Grid -> rows -> Parquet, Pareto front listed (CSV, Markdown) and plotted; written atomically."""
    import pandas as pd

    from k3sim.planner.inputs import load
    from k3sim.report import atomic_dir
    from k3sim.report.figures import pareto_figure

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
    with atomic_dir(out) as tmp:
        from k3sim.output import to_jsonable

        df.to_parquet(tmp / "sweep.parquet", index=False)
        front.to_csv(tmp / "pareto.csv", index=False)
        (tmp / "pareto.md").write_text(_front_md(inp, front, df, x, y))
        if len(ok):
            pareto_figure(ok, x, y, front, f"{inp.scenario.name}: {len(ok)} of {len(df)} layouts fit", tmp / "pareto.png",
                          xl, yl)
        import json

        (tmp / "sweep.json").write_text(json.dumps(to_jsonable({
            "scenario": inp.scenario.name, "mode": inp.mode, "points": len(df), "ok": int((df["status"] == "ok").sum()),
            "fit": len(ok), "errors": int((df["status"] == "error").sum()), "wall_s": wall, "workers": workers,
            "scheduler": scheduler or ("serial" if workers == 1 else "dask-processes"), "pareto_x": x, "pareto_y": y,
            "pareto": front.to_dict(orient="records")}), indent=2) + "\n")
        files = sorted(str(Path(out) / p.name) for p in tmp.iterdir())
    return SweepResult(inp.mode, df, front, x, y, wall, workers,
                       scheduler or ("serial" if workers == 1 else "dask-processes"), files)


def _front_md(inp, front, df, x, y) -> str:
    dims = list(TRAIN_DIMS if inp.mode == "train" else SERVE_DIMS)
    head = dims + [x, y] + (["mfu", "memory_per_gpu_bytes"] if inp.mode == "train" else ["tpot_p99_s"])
    lines = [f"# Sweep of {inp.scenario.name}: Pareto front ({y} up, {x} down)", "",
             f"{len(df)} points, {int((df['status'] == 'ok').sum())} evaluated, "
             f"{int((df['status'] == 'error').sum())} refused with their error (see sweep.parquet).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in front.itertuples():
        vals = []
        for h in head:
            v = getattr(r, h)
            vals.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"
