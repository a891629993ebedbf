"""`sweep`: a grid of layouts through the analytic models, in local processes or on a Dask cluster.

Training: every (tp, pp, virtual_stages, ep, cp, dp, micro-batches, global batch) point runs the training
step model (closed-form pipeline: the analytic path) and the memory planner. The global batch (sequences per
step, `global_batch`) is the scenario's own (its layout's dp x micro-batches x micro_batch_size) unless the grid
names one (`sweep.global_batch_sequences`, `--global-batch`), so every point of a sweep trains the same tokens
per step: a layout's micro-batch count is derived, global batch / (dp x micro_batch_size); a grid that names
micro-batch counts (`--micro-batches`) keeps the global batch too and sets the micro-batch size instead,
global batch / (dp x micro-batches), as Megatron-LM's --global-batch-size / --micro-batch-size do. A point
where that does not divide, or leaves fewer micro-batches than the pipeline needs (`pipeline_shortfall`), is
skipped and counted by reason (`SweepResult.skipped`). By default dp fills the cluster. When the grid names
several global batches the Pareto front is taken per global batch (a different batch is a different training
run, not a faster layout). Serving: every (batch limit, prefill:decode replica split) point runs the serving
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
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from k3sim.errors import InputError

TRAIN_DIMS = ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "num_micro_batches", "global_batch_sequences")
SERVE_DIMS = ("max_batch", "prefill_replicas")
TRAIN_COLUMNS = ["index", *TRAIN_DIMS, "micro_batch_size", "gpus", "status", "error", "step_time_s",
                 "tokens_per_step", "tokens_per_s",
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
    skipped: dict = field(default_factory=dict)   # reason -> grid points skipped for it (training grids)


# ------------------------------------------------------------------------------------------ the grid
# Each dimension as the user writes it: the option of `k3sim sweep` (the scenario field is sweep.<dim>).
DIM_OPTIONS = {"tp": "--tp", "pp": "--pp", "virtual_stages": "--virtual", "ep": "--ep", "cp": "--cp",
               "dp": "--dp", "num_micro_batches": "--micro-batches", "global_batch_sequences": "--global-batch",
               "max_batch": "--max-batch",
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


BLAME_ORDER = ("global_batch_sequences", "dp", "num_micro_batches", "virtual_stages", "cp", "ep", "pp", "tp")


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


def global_batch(inp) -> int:
    """Sequences per step of the scenario's own layout: its dp x micro-batches x micro_batch_size, the
    micro-batch count defaulting as the step model's does (one per virtual pipeline stage)."""
    par, w = inp.scenario.parallelism, inp.scenario.workload
    return par.dp * (w.num_micro_batches or par.pp * par.virtual_stages) * w.micro_batch_size


def pipeline_shortfall(pp: int, v: int, m: int, schedule: str = "auto") -> str | None:
    """Why `m` micro-batches per step cannot fill a pipeline of `pp` ranks with `v` virtual stages each under
    the training schedule (None: they can). 1F1B's steady state holds one micro-batch on every rank, so fewer
    than pp leave ranks idle for the whole step (the bubble, (pp - 1) / m of the ideal step: Narayanan et
    al., SC'21, sec. 2.2, exceeds the step itself); the interleaved schedule needs a multiple of pp (the step
    model refuses others, as Megatron-LM's interleaved schedule does); the schedule's own rules (DualPipe's
    even pp and micro-batch count) are `k3sim.training.schedule.check_schedule`'s."""
    from k3sim.training.schedule import check_schedule

    if m < pp:
        return f"{m:,} micro-batches are fewer than the pp={pp} pipeline ranks 1F1B keeps busy"
    if v > 1 and m % pp:
        return f"interleaved 1F1B needs the micro-batches ({m:,}) in multiples of pp={pp}"
    try:
        check_schedule(schedule, pp, v, m)
    except InputError as err:
        return err.reason
    return None


# Why grid points are skipped (`SweepResult.skipped` keys): stable labels, the detail goes to the refusal of
# a value no point uses.
SKIP_VIRTUAL = "virtual stages without a pipeline"
SKIP_GPUS = "more GPUs than the cluster"
SKIP_FILL = "tp*pp*cp does not divide the cluster (dp fills it)"
SKIP_DIVIDE = "global batch not divisible by dp x micro-batches x micro_batch_size"
SKIP_PIPELINE = "micro-batches the pipeline schedule cannot run"


def _train_lists(inp, given: dict[str, list[int] | None]) -> dict[str, list[int] | None]:
    """Each training dimension's values: the given ones, else derived from the scenario (powers of two the
    model and the hardware allow, plus the scenario's own degree, so its layout is a point); dp None: fill the
    cluster; micro-batches None: derived from the global batch."""
    model, w, par = inp.model, inp.scenario.workload, inp.scenario.parallelism
    heads = math.gcd(*(c.num_heads for c in (model.kda, model.mla) if c is not None)) if (model.kda or model.mla) else 1
    domain = int(inp.hw.scaleup_domain_gpus)
    experts = model.moe.num_routed_experts if model.moe else 1

    def derived(dim: str, values: list[int]) -> list[int]:
        return given.get(dim) or sorted(set(values) | {getattr(par, dim)})

    return {"tp": derived("tp", _divisors_in(heads, [t for t in (1, 2, 4, 8) if t <= domain])),
            "pp": derived("pp", [p for p in (1, 2, 4, 8, 16, 32) if p <= model.num_layers]),
            "virtual_stages": derived("virtual_stages", [1, 2]),
            "ep": derived("ep", [e for e in (1, 8, 16, 32, 64, 128) if experts % e == 0] if model.moe else [1]),
            "cp": derived("cp", [c for c in (1, 2, 4, 8) if w.context_tokens % (2 * c) == 0]),
            "dp": given.get("dp"), "num_micro_batches": given.get("num_micro_batches"),
            "global_batch_sequences": given.get("global_batch_sequences") or [global_batch(inp)]}


def _batch_shapes(lists: dict, pp: int, v: int, dp: int, size: int, skip,
                  schedule: str = "auto") -> list[tuple[int, int, int]]:
    """(global batch, micro-batches, micro-batch size) of one layout at one dp: the micro-batches derived from
    each global batch at the scenario's micro-batch size, or (micro-batches named) the micro-batch size
    derived; a shape that does not divide or starves the pipeline is skipped (`skip(kind, reason, **dims)`)."""
    out = []
    for b in lists["global_batch_sequences"]:
        for m_given in (lists["num_micro_batches"] or [None]):
            per_rank = dp * (m_given if m_given is not None else size)
            if b % per_rank:
                what = f"dp x micro-batches = {dp:,} x {m_given:,}" if m_given else \
                    f"dp x micro_batch_size = {dp:,} x {size:,}"
                skip(SKIP_DIVIDE, f"a global batch of {b:,} sequences is not divisible by {what}",
                     global_batch_sequences=b, dp=dp, **({"num_micro_batches": m_given} if m_given else {}))
                continue
            m, s = (m_given, b // per_rank) if m_given is not None else (b // per_rank, size)
            short = pipeline_shortfall(pp, v, m, schedule)
            if short:
                skip(SKIP_PIPELINE, f"{short} (global batch {b:,} over dp={dp:,})", global_batch_sequences=b,
                     dp=dp, pp=pp, virtual_stages=v, **({"num_micro_batches": m_given} if m_given else {}))
                continue
            out.append((b, m, s))
    return out


def training_points(inp, lists: dict, gpus: int, skipped: Counter, why: dict, used: dict) -> list[dict]:
    """The points of the training lists on a cluster of `gpus` GPUs (no index, no refusal): every skipped
    point counted in `skipped` by kind (the full product's points: skipped + points = the product of the
    list lengths, dp and micro-batches counting one when derived), the first detailed reason per (dimension,
    value) in `why`, the values the points use in `used`."""
    size, schedule = inp.scenario.workload.micro_batch_size, inp.training.pipeline_schedule
    seq = inp.scenario.workload.context_tokens
    dps = lists["dp"]
    inner = len(dps or [0]) * len(lists["global_batch_sequences"]) * len(lists["num_micro_batches"] or [0])
    per_dp = inner // len(dps or [0])

    def skip(kind: str, reason: str, n: int = 1, **combo) -> None:
        skipped[kind] += n
        for d, v in combo.items():
            why.setdefault((d, v), reason)

    points = []
    for tp, pp, v, ep, cp in itertools.product(*(lists[d] for d in ("tp", "pp", "virtual_stages", "ep", "cp"))):
        combo = dict(tp=tp, pp=pp, virtual_stages=v, ep=ep, cp=cp)
        base = tp * pp * cp
        if pp == 1 and v > 1:
            skip(SKIP_VIRTUAL, "virtual stages need a pipeline (pp > 1)", inner, **combo)
        elif base > gpus:
            skip(SKIP_GPUS, f"tp*pp*cp={base:,} GPUs exceed the cluster's {gpus:,} (cluster.num_gpus)", inner, **combo)
        elif dps is None and gpus % base:
            skip(SKIP_FILL, f"tp*pp*cp={base:,} does not divide the cluster's {gpus:,} GPUs (dp fills the cluster)",
                 inner, **combo)
        else:
            for dp in (dps or [gpus // base]):
                if base * dp > gpus:
                    skip(SKIP_GPUS, f"tp*pp*cp*dp={base * dp:,} GPUs exceed the cluster's {gpus:,} "
                         "(cluster.num_gpus)", per_dp, **combo, dp=dp)
                    continue
                for b, m, s in _batch_shapes(lists, pp, v, dp, size, skip, schedule):
                    p = {**combo, "dp": dp, "num_micro_batches": m, "global_batch_sequences": b, "micro_batch_size": s,
                         "tokens_per_step": b * seq}   # known before the step runs: in a refused point's row too
                    points.append(p)
                    for d in TRAIN_DIMS:
                        used[d].add(p[d])
    return points


def training_grid(inp, given: dict[str, list[int] | None], skipped: Counter | None = None) -> list[dict]:
    """Cartesian product of the given values (defaults derived from the scenario: `_train_lists`) on the
    scenario's cluster. A layout that needs more GPUs than the cluster has (tp*pp*cp*dp > cluster.num_gpus),
    has virtual stages without a pipeline, or whose batch shape does not divide or starves the pipeline is
    not a point (counted in `skipped` by reason); a given value left in no point at all is refused with the
    reason (`_refuse_unused`), never dropped silently."""
    lists = _train_lists(inp, given)
    check_grid_size(inp, {d: lists[d] or [0] for d in TRAIN_DIMS}, given)
    used: dict[str, set] = {d: set() for d in TRAIN_DIMS}
    why: dict = {}
    skipped = Counter() if skipped is None else skipped
    points = training_points(inp, lists, inp.scenario.cluster.num_gpus, skipped, why, used)
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


def grid(inp, given: dict[str, list[int] | None], skipped: Counter | None = None) -> list[dict]:
    """The points of a sweep; an empty grid is refused (nothing to run is bad input, not an empty result).
    `skipped`: filled with the training grid's skipped points by reason."""
    pts = training_grid(inp, given, skipped) if inp.mode == "train" else serving_grid(inp, given)
    if not pts:
        raise InputError("the sweep grid is empty: no layout of the given values uses the cluster's "
                         f"{inp.scenario.cluster.num_gpus} GPUs (check --tp/--pp/--cp/--dp or the sweep: section)",
                         source=str(inp.path), field="sweep")
    return pts


# ------------------------------------------------------------------------------------------ evaluation
def _worker_state(path: str, kernel_key: str | None):
    """Per process: the scenario, and one TrainingContext whose memoised kernel times all points share; memoised
    per scenario path and the model what-ifs in force (`configs.overrides.current`: a `--set` run never reuses a
    model loaded under other overrides)."""
    from k3sim.configs.overrides import current

    return _worker_state_for(path, kernel_key, tuple(o.text for o in current()))


@lru_cache(maxsize=8)
def _worker_state_for(path: str, kernel_key: str | None, overrides: tuple[str, ...]):
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


def _train_point(inp, ctx, p: dict, *, engine: bool | None = False, with_memory: bool = True) -> dict:
    """One training point through the step model: the analytic path (`engine` False: closed-form pipeline) or
    the scenario's pipeline clock (None: the event engine, as `k3sim plan`); `with_memory` False skips the
    memory plan (`fits` and `memory_per_gpu_bytes` None: not known)."""
    from k3sim.configs.parallel import Parallelism
    from k3sim.training import train_step

    w = inp.scenario.workload
    par = Parallelism(tp=p["tp"], pp=p["pp"], virtual_stages=p["virtual_stages"], ep=p["ep"], cp=p["cp"],
                      dp=p["dp"], zero_stage=inp.scenario.parallelism.zero_stage)
    size = p.get("micro_batch_size") or w.micro_batch_size  # a point built by hand: the scenario's
    r = train_step(inp.model, inp.hw, par, seq_len=w.context_tokens, micro_batch_size=size,
                   num_micro_batches=p["num_micro_batches"], activation_checkpointing=w.activation_checkpointing,
                   workspace_fraction=w.workspace_fraction, options=inp.training.options(engine), context=ctx,
                   source="sweep point", with_memory=with_memory)
    e = r.exposed_comm_s
    return {"gpus": par.gpus, "micro_batch_size": size, "global_batch_sequences": par.dp * p["num_micro_batches"] * size,
            "step_time_s": r.step_time_s, "tokens_per_step": r.tokens_per_step,
            "tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "mfu": r.mfu,
            "fits": bool(r.fits) if with_memory else None,
            "memory_per_gpu_bytes": float(r.memory.per_gpu_bytes["total"]) if with_memory else None,
            "bubble_ratio": r.bubble_ratio, "ep_imbalance": r.ep_imbalance, "compute_s": r.compute_s,
            **{f"exposed_{k}_s": e[k] for k in ("tp", "ep", "cp", "pp", "dp")}, "bubble_s": r.bubble_s,
            "pipeline_source": r.pipeline_source}


def _serve_point(inp, kt, p: dict, requests: int) -> dict:
    from k3sim.planner.plan import serving_sample
    from k3sim.serving.run import ServeSetup, simulate

    split = f"{p['prefill_replicas']}:{p['decode_replicas']}" if p["prefill_replicas"] else None
    setup = ServeSetup.from_scenario(inp.path, disaggregate=split)
    sv = setup.serving
    setup.serving = sv.model_copy(update={"engine": sv.engine.model_copy(update={"max_batch": p["max_batch"]})})
    # `requests`: a count (the seeded synthetic sample) or the user's trace (`serving.run.TraceSample`)
    s = simulate(setup, requests.stream() if hasattr(requests, "stream") else serving_sample(setup, requests)).summary
    return {"gpus": setup.gpus, "fits": True, "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
            "tpot_p99_s": s["tpot_p99_s"], "goodput_requests_per_s": s["goodput_requests_per_s"],
            "goodput_requests_per_s_per_gpu": s["goodput_requests_per_s"] / setup.gpus,
            "throughput_output_tokens_per_s_per_gpu": s["throughput_output_tokens_per_s_per_gpu"],
            "token_hit_rate": s["token_hit_rate"], "requests": s["requests"]}


def evaluate(inp, ctx, kt, p: dict, requests: int = SERVING_REQUESTS, **train: Any) -> dict:
    """One point's row: its dimensions, the model's answer and status "ok", or status "error" with the
    one-line reason a model refusing gave (recorded, never fatal to a sweep). `train`: `_train_point`'s
    keywords (the pipeline clock, the memory plan)."""
    row = dict(p)
    try:
        row.update(_train_point(inp, ctx, p, **train) if inp.mode == "train" else _serve_point(inp, kt, p, requests))
        row["status"], row["error"] = "ok", ""
    except InputError as err:
        row["status"], row["error"] = "error", str(err)
    except (ValueError, ArithmeticError, KeyError, RuntimeError) as err:  # a model refusing: recorded, not fatal
        row["status"], row["error"] = "error", f"{type(err).__name__}: {err}"
    return row


def evaluate_chunk(args: tuple) -> list[dict]:
    """Run one chunk of points (top-level: picklable for process pools and Dask)."""
    path, points, kernel_key, requests = (*args, SERVING_REQUESTS)[:4]
    inp, ctx, kt = _worker_state(path, kernel_key)
    return [evaluate(inp, ctx, kt, p, requests) for p in points]


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
    """Evaluate `points` in chunks (`map_tasks`: this process, forked local processes or a Dask cluster)."""
    path = str(path)
    n = len(points)
    chunk_size, processes = chunking(n, workers, chunk_size)
    chunks = [(path, c, kernel_key, serving_requests) for c in _chunks(points, chunk_size)]
    parts = map_tasks(evaluate_chunk, chunks, workers=processes, scheduler=scheduler, progress=progress,
                      size=lambda task: len(task[1]))
    rows = [r for part in parts for r in part]
    return sorted(rows, key=lambda r: r["index"])


def map_tasks(fn: Callable, tasks: list, *, workers: int = 1, scheduler: str | None = None,
              progress: Callable[[int, int], None] | None = None,
              size: Callable[[Any], int] = lambda task: 1) -> list:
    """fn over `tasks` (top-level fn, picklable tasks): in this process (workers 1), on forked local processes
    (workers > 1, at most one per task, `k3sim.procs.ProcessPool`), or on a Dask distributed cluster
    (`scheduler` = tcp://HOST:PORT). Results in completion order; `progress(done, total)` counts `size` units
    of the finished tasks. Ctrl-C or SIGTERM stops every way promptly: local workers are killed, a cluster's
    futures cancelled. The one runner of the planner's sweeps and searches."""
    from k3sim.procs import worker_count

    total = sum(size(t) for t in tasks)
    results: list = []
    done = 0

    def record(task_size: int, out: Any) -> None:
        nonlocal done
        results.append(out)
        done += task_size
        if progress:
            progress(done, total)

    processes = worker_count(max(workers, 1), max(len(tasks), 1))
    if scheduler:
        _run_distributed(scheduler, fn, tasks, lambda i, out: record(size(tasks[i]), out))
    elif processes <= 1:
        for t in tasks:
            record(size(t), fn(t))
    else:
        from k3sim.procs import ProcessPool

        # forked: workers inherit the imported modules (spawn re-imports numpy, pandas, k3sim per worker,
        # seconds each on a small machine) and each loads the scenario once (`_worker_state`)
        with ProcessPool(processes) as pool:
            for i, out in pool.imap_unordered(_indexed, [(fn, i, t) for i, t in enumerate(tasks)]):
                record(size(tasks[i]), out)
    return results


def _indexed(args: tuple) -> tuple[int, Any]:
    fn, i, task = args
    return i, fn(task)


# Seconds the Dask client may take to close when a sweep stops: bounded, so Ctrl-C ends the command within the
# CLI contract's 2 s even when the scheduler is slow to answer.
CLIENT_CLOSE_S = 1.0


def _run_distributed(address: str, fn: Callable, tasks: list, record: Callable[[int, Any], None]) -> None:
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
        futures = client.map(_indexed, [(fn, i, t) for i, t in enumerate(tasks)], pure=False)
        for fut in as_completed(futures):
            record(*fut.result())
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


def training_front(ok, x: str, y: str):
    """The Pareto front of fitting training rows, taken per global batch: a layout trained at another batch
    is another training run (another optimisation), so it never beats one at this batch on the front."""
    import pandas as pd

    if not len(ok) or ok["global_batch_sequences"].nunique() <= 1:
        return pareto_front(ok, x, y) if len(ok) else ok
    return pd.concat([pareto_front(g, x, y) for _, g in ok.groupby("global_batch_sequences", sort=True)])


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
    skipped: Counter = Counter()
    points = grid(inp, merged, skipped)
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
    if inp.mode == "train":
        front = training_front(ok, x, y)
    else:
        front = pareto_front(ok, x, y) if len(ok) else ok
    return SweepResult(inp.scenario.name, inp.mode, df, ok, front, x, y, xl, yl, wall, used, label,
                       dict(sorted(skipped.items())))
