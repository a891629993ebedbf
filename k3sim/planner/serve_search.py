"""The serving search: the cheapest fleet layout that meets the user's SLOs on the user's traffic.

`k3sim plan SCENARIO --trace T --arrival-rate R --slo-ttft S --slo-tpot S` asks what every planner user asks first
("which layout, how many GPUs"): AIConfigurator's SLA-driven search and Vidur-Search answer the same question.
The search is three passes over one candidate list, each cheaper than the next is expensive:

1. **Candidates** (`candidates`): for every GPU count of the budget (multiples of a node up to the budget),
   every replica layout (TP, PP, attention-DP ranks, EP over the attention ranks of a stage or none), replica
   count, P:D split (colocated, or prefill:decode replicas), batch limit and scheduler. PP runs its
   micro-batches in flight (pp engines per replica, what vLLM's and SGLang's pipeline engines do); two-batch
   overlap is on where attention DP meets EP (SGLang's `--enable-two-batch-overlap` deployments).
2. **Bounds** (`prune`): a layout whose weights and one request's pages do not fit is out (the memory planner,
   through the serving setup's own check); a layout whose decode step at batch 1 is over the TPOT SLO can never
   meet it (every decode step of a running request takes at least that long); a fleet whose busiest pool cannot
   keep up with the traffic's tokens at its best batch (decode tokens/s at the batch its pool holds, prefill
   tokens/s at the token budget, each the step model's, against the trace's output tokens and its prompt tokens
   not already in an unbounded cache) queues without bound. Each is a necessary condition, so nothing pruned
   could have met the SLOs.
3. **Simulation**: the survivors run the serving DES (`k3sim.serving.run.simulate`) on the first
   `screen_requests` requests of the traffic, in local processes or on a Dask cluster; the best `finalists` of
   the screen (those meeting the SLOs first, then by GPUs and goodput per GPU) run the whole traffic, and the
   answer is read from those full runs.

The answer: the cheapest candidate meeting both SLOs at the chosen percentile (fewest GPUs, then the highest
goodput per GPU), or, if none does, the closest (smallest worst SLO ratio) with the SLO it misses and by how
much; the Pareto front of goodput per GPU against p99 TTFT over everything simulated; the top 10. Every random
choice is seeded (arrivals, the synthetic sample): the same inputs give the same answer however it runs.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

from k3sim.errors import InputError

PERCENTILES = (50, 90, 99)  # the TTFT / TPOT percentiles the serving summary carries (serving.metrics)
# modelling choices of the grid (each a value engines ship or a round step of it): batch limits around vLLM's
# max_num_seqs 256 default; TP / PP / attention-DP degrees that tile an 8-GPU node
TP_DEGREES = (1, 2, 4, 8)
PP_DEGREES = (1, 2, 4)
DP_DEGREES = (1, 2, 4, 8)
MAX_BATCHES = (64, 256)
SCHEDULERS = ("vllm", "sarathi")
SCREEN_REQUESTS = 600  # modelling choice: ~10 min of traffic at 1 req/s, enough to load a fleet; --screen-requests
FINALISTS = 6          # modelling choice: full-traffic runs of the screen's best; --finalists
TOP = 10


@dataclass(frozen=True)
class Traffic:
    """The user's traffic as the search reads it: requests (arrival order) and the figures the bounds use."""

    requests: tuple
    label: str
    rate_per_s: float            # requests per second over the traffic's span
    mean_output_tokens: float
    mean_new_prompt_tokens: float  # prompt tokens not in an unbounded prefix cache (the least prefill work)
    median_context_tokens: float   # prompt + half the output: the context of a typical decode

    @staticmethod
    def of(requests: list, label: str, hash_block_tokens: int = 512) -> "Traffic":
        """The figures of a request list; the unbounded-cache prompt work walks the prefix keys once."""
        from k3sim.workloads.request import prefix_keys

        if not requests:
            raise InputError("the traffic has no request", source=label)
        seen: set = set()
        new = 0
        for r in requests:
            keys = prefix_keys(r, hash_block_tokens)
            hit = 0
            for k in keys:
                if k not in seen:
                    break
                hit += 1
            seen.update(keys)
            new += r.input_tokens - hit * hash_block_tokens
        n = len(requests)
        span = max(requests[-1].arrival_s - requests[0].arrival_s, 1e-9)
        ctx = sorted(r.input_tokens + r.output_tokens / 2 for r in requests)
        return Traffic(tuple(requests), label, (n - 1) / span if n > 1 else 0.0,
                       sum(r.output_tokens for r in requests) / n, new / n, ctx[n // 2])


def load_traffic(*, trace: str | Path | None, workload: str | None, arrival_rate: float | None, seed: int,
                 n_requests: int, limit: int | None, time_scale: float | None = None) -> Traffic:
    """The requests of a trace (its own timing, scaled by `time_scale`, or Poisson at `arrival_rate`) or of a
    seeded synthetic workload, held in memory: every candidate replays the same list."""
    from k3sim.serving.arrivals import retime

    if (trace is None) == (workload is None):
        raise InputError("give exactly one of --trace FILE or --workload NAME for a serving search", source="--trace")
    if trace is not None:
        from k3sim.workloads.mooncake import read_mooncake

        reqs: Iterable = read_mooncake(trace, strict=True, limit=limit, require_requests=True)
        label = f"{Path(trace).name} ({{n}} requests)"
    else:
        from k3sim.workloads.synthetic import synthetic_workload

        reqs = synthetic_workload(workload, seed, n_requests)
        label = f"synthetic {workload} ({{n}} requests)"
    if arrival_rate is not None:
        reqs = retime(reqs, "poisson", arrival_rate, seed=seed)
        label += f", Poisson {arrival_rate:g} req/s"
    reqs = list(reqs)
    label = label.replace("{n}", f"{len(reqs):,}")
    if time_scale is not None:
        from k3sim.serving.arrivals import time_scaled

        reqs = list(time_scaled(reqs, time_scale))
        label += f", time x{time_scale:g}"
    return Traffic.of(reqs, label)


# ------------------------------------------------------------------------------------------ candidates
@dataclass(frozen=True)
class SearchSpace:
    """What the search varies; every list is a modelling choice a user may narrow (tests do)."""

    gpu_counts: tuple[int, ...]
    tp: tuple[int, ...] = TP_DEGREES
    pp: tuple[int, ...] = PP_DEGREES
    dp: tuple[int, ...] = DP_DEGREES
    max_batch: tuple[int, ...] = MAX_BATCHES
    schedulers: tuple[str, ...] = SCHEDULERS
    disaggregate: bool = True


def gpu_counts(budget: int, gpus_per_node: int, smallest: int = 1) -> tuple[int, ...]:
    """The fleet sizes a budget allows: 1, 2, 4 GPUs below a node, then whole nodes up to the budget."""
    sizes = [g for g in (1, 2, 4) if g < gpus_per_node and g <= budget]
    sizes += list(range(gpus_per_node, budget + 1, gpus_per_node))
    if budget not in sizes:
        sizes.append(budget)
    return tuple(sorted(g for g in set(sizes) if g >= smallest))


def _expert_degrees(model, tp: int, dp: int) -> list[int]:
    """EP over a stage's attention ranks (tp x dp GPUs: every expert GPU also runs attention, as the
    deployed attention-DP stacks do), or none (experts TP-sharded); a dense model has no EP."""
    if model.moe is None:
        return [1]
    return sorted({tp * dp, 1} if tp * dp > 1 else {1})


def candidates(model, space: SearchSpace) -> list[dict]:
    """Every point of the space, numbered; each is a whole fleet (its GPUs = replicas x replica GPUs)."""
    pts: list[dict] = []
    for g in space.gpu_counts:
        for tp, pp, dp in itertools.product(space.tp, space.pp, space.dp):
            per = tp * pp * dp
            if per > g or g % per:
                continue
            reps = g // per
            splits = [0] + ([p for p in sorted({1, reps // 2}) if 0 < p < reps] if space.disaggregate else [])
            for ep, split, b, sch in itertools.product(_expert_degrees(model, tp, dp), splits, space.max_batch,
                                                       space.schedulers):
                pts.append({"gpus": g, "tp": tp, "pp": pp, "dp": dp, "ep": ep, "replicas": reps,
                            "prefill_replicas": split, "max_batch": b, "scheduler": sch})
    return [{"index": i, **p} for i, p in enumerate(pts)]


def layout_of(p: dict) -> dict:
    """The `Parallelism` fields a candidate sets (two-batch overlap where attention DP meets EP)."""
    lay = {"tp": p["tp"], "pp": p["pp"], "dp": p["dp"], "ep": p["ep"], "cp": 1}
    if p["dp"] > 1 and p["ep"] > 1:
        lay["tbo"] = True
    return lay


def describe(p: dict) -> str:
    """A candidate in the field's words: `4 x (TP8 PP1 DP1 EP8), 1 prefill : 3 decode, batch 256, sarathi`."""
    parts = [f"TP{p['tp']}"] + [f"{k.upper()}{p[k]}" for k in ("pp", "dp", "ep") if p[k] > 1]
    fleet = (f"{p['prefill_replicas']} prefill : {p['replicas'] - p['prefill_replicas']} decode"
             if p["prefill_replicas"] else "colocated")
    return f"{p['replicas']} x ({' '.join(parts)}), {fleet}, batch {p['max_batch']}, {p['scheduler']}"


# ------------------------------------------------------------------------------------------ one candidate
def _resolved(path: str):
    """The scenario, model and hardware, memoised per path and the model what-ifs in force (`--set`)."""
    from k3sim.configs.overrides import current

    return _resolved_for(path, tuple(o.text for o in current()))


@lru_cache(maxsize=4)
def _resolved_for(path: str, overrides: tuple[str, ...]):
    from k3sim.configs import resolve_scenario

    return resolve_scenario(path)


def setup_of(path: str, p: dict, slo_ttft_s: float, slo_tpot_s: float):
    """The serving setup of a candidate: the scenario's model, hardware and serving section with the candidate's
    layout, fleet, batch limit and scheduler (the memory check of `ServeSetup.from_scenario` included)."""
    from k3sim.serving.run import ServeSetup

    split = f"{p['prefill_replicas']}:{p['replicas'] - p['prefill_replicas']}" if p["prefill_replicas"] else None
    setup = ServeSetup.from_scenario(path, layout=layout_of(p), replicas=p["replicas"], disaggregate=split,
                                     scheduler=p["scheduler"], slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s,
                                     pp_microbatches=p["pp"] > 1 and p["dp"] == 1, resolved=_resolved(path))
    sv = setup.serving
    setup.serving = sv.model_copy(update={"engine": sv.engine.model_copy(update={"max_batch": p["max_batch"]})})
    return setup


def bounds(setup, traffic: Traffic, slo_tpot_s: float) -> tuple[str | None, dict]:
    """(why the candidate cannot meet the SLOs, or None; the bound figures). Necessary conditions only:
    the TPOT floor (a decode step at batch 1) and each pool's token throughput at its best batch."""
    from k3sim.serving.run import _step_fn, mtp_options

    advance = mtp_options(setup.serving)[1]
    ctx = int(traffic.median_context_tokens)
    eng = setup.serving.engine
    rate = traffic.rate_per_s
    need_out, need_in = rate * traffic.mean_output_tokens, rate * traffic.mean_new_prompt_tokens
    figs: dict[str, float] = {}
    busy = []  # (pool role, fraction of its time the traffic needs at the best batch)
    for pool in setup.pools:
        fn = _step_fn(setup, pool)
        floor = fn(1, ctx, ()) / advance
        figs.setdefault("tpot_floor_s", floor)
        b = max(1, min(eng.max_batch, requests_held(setup.model, pool, ctx)))
        decode_tps = pool.replicas * b * advance / fn(b, b * ctx, ())
        chunk = eng.chunk_tokens or eng.token_budget
        prefill_tps = pool.replicas * chunk / fn(0, 0, ((chunk, 0),))
        if pool.role == "mixed":
            busy.append((pool.role, max(need_out / decode_tps, need_in / prefill_tps)))
        elif pool.role == "decode":
            busy.append((pool.role, need_out / decode_tps))
            if floor > slo_tpot_s:
                return f"TPOT floor {floor * 1e3:.0f} ms (decode step at batch 1) over the {slo_tpot_s * 1e3:.0f} ms " \
                       "SLO", figs
        else:
            busy.append((pool.role, need_in / prefill_tps))
    if setup.pools[0].role == "mixed" and figs["tpot_floor_s"] > slo_tpot_s:
        return (f"TPOT floor {figs['tpot_floor_s'] * 1e3:.0f} ms (decode step at batch 1) over the "
                f"{slo_tpot_s * 1e3:.0f} ms SLO"), figs
    role, worst = max(busy, key=lambda x: x[1])
    figs["utilisation_bound"] = worst
    if worst > 1:
        return f"the {role} pool needs {worst:.2f}x its best throughput for this traffic", figs
    return None, figs


def requests_held(model, pool, context_tokens: int) -> int:
    """Requests of `context_tokens` the pool's cache holds at once (its capacity over one request's KV and
    recurrent state per TP rank, `k3sim.memory.sizes`; unbounded: no limit from memory)."""
    from k3sim.memory.sizes import all_conv_state_bytes_per_request, kv_bytes_per_request, \
        recurrent_state_bytes_per_request

    cap = pool.cache.capacity_bytes
    if cap is None:
        return 2 ** 31
    tp = pool.parallelism.tp
    one = (kv_bytes_per_request(model, context_tokens, tp) + recurrent_state_bytes_per_request(model, tp)
           + all_conv_state_bytes_per_request(model, tp))
    return int(cap // max(one, 1))


def _row(p: dict, s: dict, gpus: int, percentile: int, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    ttft, tpot = s[f"ttft_p{percentile}_s"], s[f"tpot_p{percentile}_s"]
    return {**p, "status": "ok", "error": "", "ttft_s": ttft, "tpot_s": tpot,
            "ttft_p99_s": s["ttft_p99_s"], "tpot_p99_s": s["tpot_p99_s"], "ttft_p50_s": s["ttft_p50_s"],
            "meets_slo": ttft <= slo_ttft_s and tpot <= slo_tpot_s,
            "slo_ratio": max(ttft / slo_ttft_s, tpot / slo_tpot_s),
            "goodput_requests_per_s": s["goodput_requests_per_s"],
            "goodput_requests_per_s_per_gpu": s["goodput_requests_per_s"] / gpus,
            "throughput_output_tokens_per_s_per_gpu": s["throughput_output_tokens_per_s_per_gpu"],
            "token_hit_rate": s["token_hit_rate"], "requests": s["requests"]}


_TRAFFIC: dict = {}  # the traffic a worker replays, set before local workers fork (Dask: shipped in the task)


def simulate_group(args: tuple) -> list[dict]:
    """Candidates of one replica layout through the serving DES on the first `n` requests (top-level:
    picklable). One layout per task, so its step-cost tables (`serving.stepcost`, seconds to build) are built
    once and shared by the candidates that differ only in fleet split, batch limit or scheduler."""
    path, group, n, slo_ttft_s, slo_tpot_s, percentile, traffic = args
    traffic = traffic or _TRAFFIC["traffic"]
    return [_simulate(path, p, list(traffic.requests[:n]), slo_ttft_s, slo_tpot_s, percentile) for p in group]


def _simulate(path: str, p: dict, requests: list, slo_ttft_s: float, slo_tpot_s: float, percentile: int) -> dict:
    from k3sim.serving.run import simulate

    try:
        setup = setup_of(path, p, slo_ttft_s, slo_tpot_s)
        s = simulate(setup, requests).summary
        return _row(p, s, setup.gpus, percentile, slo_ttft_s, slo_tpot_s)
    except InputError as err:
        return {**p, "status": "error", "error": str(err)}
    except (ValueError, ArithmeticError, KeyError, RuntimeError) as err:  # a model refusing: recorded
        return {**p, "status": "error", "error": f"{type(err).__name__}: {err}"}


# ------------------------------------------------------------------------------------------ the search
@dataclass
class SearchResult:
    """A serving search as data (the planner writes no file; `k3sim.report` renders it)."""

    scenario: str
    traffic: str
    slo_ttft_s: float
    slo_tpot_s: float
    percentile: int
    candidates: int
    pruned: dict[str, int]          # reason class -> candidates
    screened: list[dict]
    finals: list[dict]
    recommendation: dict | None
    closest: dict | None
    front: list[dict]
    top: list[dict]
    wall_s: float
    screen_requests: int
    traffic_requests: int
    examples: dict[str, str] = field(default_factory=dict)  # reason class -> one example line

    @property
    def meets_slo(self) -> bool:
        return self.recommendation is not None

    def verdict(self) -> str:
        """One line: the answer, or the closest and the SLO it misses by how much."""
        pct = f"p{self.percentile}"
        if self.recommendation is not None:
            r = self.recommendation
            return (f"{r['gpus']} GPUs: {describe(r)} meets {pct} TTFT {self.slo_ttft_s:g} s and TPOT "
                    f"{self.slo_tpot_s * 1e3:g} ms ({pct} TTFT {r['ttft_s']:.3g} s, TPOT {r['tpot_s'] * 1e3:.3g} ms, "
                    f"goodput {r['goodput_requests_per_s_per_gpu']:.3g} req/s per GPU)")
        c = self.closest
        if c is None:
            return "no candidate could be simulated: " + "; ".join(f"{k}: {v}" for k, v in self.examples.items())
        return f"no layout meets the SLOs; closest: {c['gpus']} GPUs, {describe(c)}: " + binding(c, self)

    def to_json(self) -> dict:
        keep = ("recommendation", "closest", "front", "top", "pruned", "candidates", "slo_ttft_s", "slo_tpot_s",
                "percentile", "wall_s", "screen_requests", "traffic_requests", "traffic", "scenario", "examples")
        out = {k: getattr(self, k) for k in keep}
        out["meets_slo"] = self.meets_slo
        out["simulated"] = len(self.screened)
        out["verdict"] = self.verdict()
        return out


def binding(r: dict, res: SearchResult) -> str:
    """Which SLO binds a row and by how much (`TTFT p99 7.2 s is 1.44x the 5 s SLO`)."""
    pct = f"p{res.percentile}"
    t, p = r["ttft_s"] / res.slo_ttft_s, r["tpot_s"] / res.slo_tpot_s
    if t >= p:
        return f"{pct} TTFT {r['ttft_s']:.3g} s is {t:.2f}x the {res.slo_ttft_s:g} s SLO"
    return f"{pct} TPOT {r['tpot_s'] * 1e3:.3g} ms is {p:.2f}x the {res.slo_tpot_s * 1e3:g} ms SLO"


def _rank(r: dict) -> tuple:
    """Order of preference: meeting the SLOs, fewer GPUs, more goodput per GPU, then the index (stable)."""
    return (not r["meets_slo"], r["gpus"] if r["meets_slo"] else 0,
            -r["goodput_requests_per_s_per_gpu"] if r["meets_slo"] else r["slo_ratio"], r["index"])


def pareto(rows: list[dict]) -> list[dict]:
    """Rows no other row beats on both goodput per GPU (higher) and p99 TTFT (lower), by p99 TTFT."""
    out, best = [], -math.inf
    for r in sorted(rows, key=lambda r: (r["ttft_p99_s"], -r["goodput_requests_per_s_per_gpu"], r["index"])):
        if r["goodput_requests_per_s_per_gpu"] > best:
            out.append(r)
            best = r["goodput_requests_per_s_per_gpu"]
    return out


def prune(path: str, points: list[dict], traffic: Traffic, slo_ttft_s: float, slo_tpot_s: float,
          progress: Callable[[int, int], None] | None = None) -> tuple[list[dict], Counter, dict]:
    """The candidates that pass the memory check and the analytic bounds, with the others counted by reason."""
    pruned: Counter = Counter()
    examples: dict[str, str] = {}
    keep = []
    for i, p in enumerate(points):
        try:
            setup = setup_of(path, p, slo_ttft_s, slo_tpot_s)
            why, figs = bounds(setup, traffic, slo_tpot_s)
        except InputError as err:
            why, figs, kind = str(err), {}, "does not fit"
        else:
            kind = "TPOT floor" if why and why.startswith("TPOT") else "throughput bound"
        if why:
            pruned[kind] += 1
            examples.setdefault(kind, f"{describe(p)}: {why}")
        else:
            keep.append({**p, **figs})
        if progress:
            progress(i + 1, len(points))
    return keep, pruned, examples


def run_simulations(path: str, points: list[dict], n: int, traffic: Traffic, slos: tuple, *, workers: int = 1,
                    scheduler: str | None = None, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Every point through the DES on the first n requests, one task per replica layout: here, on forked local
    processes (`planner.sweep.map_tasks`), or on a Dask cluster (the traffic shipped in each task)."""
    from k3sim.planner.sweep import map_tasks

    _TRAFFIC["traffic"] = traffic
    ship = traffic if scheduler else None  # forked workers inherit it; a cluster needs it in the task
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault(tuple(layout_of(p).items()), []).append(p)
    # the largest groups first, so the last task a worker takes is a short one
    tasks = [(path, g, n, *slos, ship) for g in sorted(groups.values(), key=lambda g: (-len(g), g[0]["index"]))]
    parts = map_tasks(simulate_group, tasks, workers=workers, scheduler=scheduler, progress=progress,
                      size=lambda task: len(task[1]))
    return sorted((r for part in parts for r in part), key=lambda r: r["index"])


def search(path: str | Path, traffic: Traffic, *, slo_ttft_s: float, slo_tpot_s: float, percentile: int = 99,
           gpus: int | None = None, space: SearchSpace | None = None, screen_requests: int = SCREEN_REQUESTS,
           finalists: int = FINALISTS, workers: int = 1, scheduler: str | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> SearchResult:
    """Search the scenario's serving layouts for the cheapest that meets the SLOs on `traffic`.
    `gpus`: the budget (default the scenario's cluster); `space` replaces the default grid."""
    t0 = time.perf_counter()
    path = str(path)
    if percentile not in PERCENTILES:
        raise InputError(f"the serving summary has percentiles {', '.join(map(str, PERCENTILES))} (got {percentile})",
                         source="--slo-percentile")
    scn, model, hw = _resolved(path)
    budget = gpus or scn.cluster.num_gpus
    space = space or SearchSpace(gpu_counts(budget, scn.cluster.gpus_per_node))
    points = candidates(model, space)
    if not points:
        raise InputError(f"no layout of the search tiles a {budget}-GPU budget", source="--gpus")
    step = (lambda name: (lambda d, n: progress(name, d, n))) if progress else (lambda name: None)
    keep, pruned, examples = prune(path, points, traffic, slo_ttft_s, slo_tpot_s, step("bounds"))
    if not keep and pruned.get("does not fit") == len(points):
        fix = smallest_fit(path, model, space, budget, (slo_ttft_s, slo_tpot_s), scn.cluster.gpus_per_node)
        raise InputError(f"no layout of {budget} GPUs holds the model and one request; {fix}", source="--gpus")
    slos = (slo_ttft_s, slo_tpot_s, percentile)
    n = min(screen_requests, len(traffic.requests))
    screened = run_simulations(path, keep, n, traffic, slos, workers=workers, scheduler=scheduler,
                               progress=step("screen"))
    ok = sorted((r for r in screened if r["status"] == "ok"), key=_rank)
    for r in screened:
        if r["status"] != "ok":
            pruned["simulation error"] += 1
            examples.setdefault("simulation error", f"{describe(r)}: {r['error']}")
    finals = ok[:finalists]
    if n < len(traffic.requests) and finals:
        finals = run_simulations(path, [_dims(r) for r in finals], len(traffic.requests), traffic, slos,
                                 workers=workers, scheduler=scheduler, progress=step("full traffic"))
        finals = [r for r in finals if r["status"] == "ok"]
    from k3sim.planner.bands import with_bands  # the finalists' figures at both ends of the step-error band

    finals = with_bands(path, finals, traffic, slos, workers=workers, scheduler=scheduler, progress=step("error bands"))
    finals.sort(key=_rank)
    meet = [r for r in finals if r["meets_slo"]]
    rec = meet[0] if meet else None
    closest = None if rec else (min(finals, key=lambda r: (r["slo_ratio"], r["index"])) if finals else None)
    front = pareto(finals + [r for r in ok if r["index"] not in {f["index"] for f in finals}])
    return SearchResult(scn.name, traffic.label, slo_ttft_s, slo_tpot_s, percentile, len(points), dict(pruned),
                        screened, finals, rec, closest, front, (finals + ok[len(finals):])[:TOP],
                        time.perf_counter() - t0, n, len(traffic.requests), examples)


def smallest_fit(path: str, model: Any, space: SearchSpace, budget: int, slos: tuple[float, float], node: int,
                 limit: int = 4096) -> str:
    """The fix of a budget no layout fits: the smallest whole-node (`node` GPUs) count above it (up to `limit`) where a
    candidate of the same space holds the model and one request, with that layout."""
    import dataclasses

    # more GPUs than the largest replica only add replicas, which hold no more of the model each
    limit = min(limit, -(-max(space.tp) * max(space.pp) * max(space.dp) // node) * node)
    for g in range(max(node, -(-budget // node) * node + (node if budget % node == 0 else 0)), limit + 1, node):
        for p in candidates(model, dataclasses.replace(space, gpu_counts=(g,))):
            try:
                setup_of(path, p, *slos)
            except InputError:
                continue
            return f"the smallest budget that does: --gpus {g} ({describe(p)})"
    return f"no layout of the search holds it (its largest replica: {limit:,} GPUs)"


DIMS = ("index", "gpus", "tp", "pp", "dp", "ep", "replicas", "prefill_replicas", "max_batch", "scheduler")


def _dims(r: dict) -> dict:
    return {k: r[k] for k in DIMS}
