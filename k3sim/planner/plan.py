"""`plan`: one scenario in, every section of the planning report out, as data (the report renders it).

Training scenarios run the training step model (k3sim.training) with the memory planner's verdict;
serving scenarios run the serving simulator (k3sim.serving) and the decode model (k3sim.decode) where
they are installed, and say "not available" where not. Every scenario also gets the CP crossover
(k3sim.cp), the calibration error table of the kernels it called and its assumptions with sources.
Sections run in order and a section that cannot apply (a decode roofline for a training run) says so.
A training scenario with a token budget (`training.tokens` and `training.days`, or `--tokens` / `--days`) also
gets the smallest cluster and layout that trains it in time (`k3sim.planner.budget`, section `token_budget`).
"""

from __future__ import annotations

import importlib.util
import inspect
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from k3sim.errors import DoesNotFit, InputError

SECTIONS = ("memory", "step", "token_budget", "serving", "decode", "cp", "prefix_cache", "pipeline", "calibration")
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Prefix-cache section: a short seeded synthetic multi-turn chat replay (k3sim.workloads.synthetic)
# through each cache policy, unbounded pool: how much of the traffic's prefix reuse each policy can
# catch. Request count is a modelling choice keeping the section under a few seconds.
PREFIX_CACHE_REQUESTS = 200
PREFIX_CACHE_WORKLOAD = "chat"
# Serving section: the same seeded workload through k3sim.serving's fleet simulation; 200 requests keep the
# plan of the default scenario well under 30 s on 2 cores (a modelling choice: a sample, not a full trace).
SERVING_REQUESTS = 200
SERVING_WORKLOAD = "chat"


class RecordingKernelTime:
    """Wraps the kernel-time function and counts calls by (op, source): the report's calibration table
    lists the kernels the plan used and how each time was obtained (measured, interpolated, model)."""

    def __init__(self, inner: Callable | None = None):
        if inner is None:
            from k3sim.predict import predict_kernel_time as inner
        self.inner = inner
        try:
            self._conv = "convention" in inspect.signature(inner).parameters
        except (TypeError, ValueError):
            self._conv = False
        self.calls: Counter = Counter()
        if self._conv:
            self.__call__ = self._call_conv  # type: ignore[method-assign]

    def __call__(self, op, params, hardware=None):
        r = self.inner(op, params, hardware=hardware)
        self.calls[(op, str(r.source))] += 1
        return r

    def _call_conv(self, op, params, hardware=None, convention="graph"):
        r = self.inner(op, params, hardware=hardware, convention=convention)
        self.calls[(op, str(r.source))] += 1
        return r

    def ops(self) -> list[str]:
        return sorted({op for op, _ in self.calls})


@dataclass
class PlanResult:
    scenario: str
    scenario_file: str
    description: str
    mode: str
    model: str
    hardware: str
    cluster: dict
    parallelism: dict
    replicas: int
    fits: bool
    verdict: str
    memory: Any = None                 # ServePlan | TrainPlan | None (does not fit a serving plan)
    memory_rows: list | None = None    # a serving misfit: what one GPU would need, (component, bytes, source)
    training: Any = None               # TrainStepResult
    serving: dict | None = None
    serving_frame: Any = field(default=None, repr=False)   # per-request table of the serving sample
    decode: Any = None                 # pandas DataFrame (k3sim.decode.sweep.sweep_table)
    decode_layout: dict | None = None
    cp_rows: list[dict] | None = None
    cp_degree: int = 0
    cp_crossovers: dict | None = None
    cp_geometry: Any = None
    cp_kinds: list[dict] | None = None  # a model with kinds beyond KDA/MLA: CP step per kind and length
    token_budget: Any = None           # planner.budget.TokenBudget: the smallest cluster for the token budget
    prefix_cache: list[dict] | None = None
    calibration: list[dict] = field(default_factory=list)
    kernel_calls: list[dict] = field(default_factory=list)
    assumptions: list[dict] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)   # section -> why it is absent / what it sampled
    timings_s: dict[str, float] = field(default_factory=dict)
    hw: Any = field(default=None, repr=False)
    model_path: str = ""
    serving_search: Any = None         # planner.serve_search.SearchResult: the layout this plan is the answer of

    def to_json(self) -> dict:
        """Stable keys, SI units: for training `step_time_s`, `tokens_per_s`, `mfu`, the breakdown and the
        memory plan; for serving the keys of `k3sim serve` (when available) and the memory plan."""
        from k3sim.output import to_jsonable

        out: dict = {"scenario": self.scenario, "scenario_file": self.scenario_file, "mode": self.mode,
                     "model": self.model, "hardware": self.hardware, "cluster": self.cluster,
                     "parallelism": self.parallelism, "replicas": self.replicas, "fits": self.fits,
                     "verdict": self.verdict}
        if self.training is not None:
            t = self.training
            out.update({"step_time_s": t.step_time_s, "tokens_per_s": t.tokens_per_s,
                        "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu, "mfu": t.mfu,
                        "hfu": t.hfu, "model_flop_per_step": t.model_flop_per_step,
                        "hardware_flop_per_step": t.hardware_flop_per_step,
                        "tokens_per_step": t.tokens_per_step, "num_micro_batches": t.num_micro_batches,
                        "bubble_ratio": t.bubble_ratio, "ep_imbalance": t.ep_imbalance,
                        "compute_s": t.compute_s, "exposed_comm_s": t.exposed_comm_s, "bubble_s": t.bubble_s,
                        "breakdown": [{"component": r.component, "seconds": r.seconds, "source": r.source,
                                       "kind": r.kind} for r in t.breakdown],
                        "stages": t.stages, "stage_split": t.stage_split, "pipeline_source": t.pipeline_source})
            from k3sim.planner.bands import plan_training_band  # *_low / *_high from the whole-step checks

            out.update(plan_training_band(self))
        if self.serving is not None:
            out.update({k: v for k, v in self.serving.items() if k not in out})
        if self.decode is not None:
            out["decode"] = self.decode.to_dict(orient="records")
        if self.token_budget is not None:
            out["token_budget"] = self.token_budget.to_json()
        if self.serving_search is not None:
            out["search"] = self.serving_search.to_json()
            out["meets_slo"] = self.serving_search.meets_slo
        out["memory"] = self.memory
        out["notes"] = self.notes
        out["kernel_calls"] = self.kernel_calls
        return to_jsonable(out)


def _section(res: PlanResult, name: str, fn: Callable[[], None], progress: Callable | None) -> None:
    t = time.perf_counter()
    if progress:
        progress(name)
    fn()
    res.timings_s[name] = time.perf_counter() - t


def plan(path: str | Path, *, kernel_time: Callable | None = None, progress: Callable | None = None,
         sections: tuple[str, ...] = SECTIONS, serving_requests: int | None = None, inputs=None,
         tokens: float | None = None, days: float | None = None, max_gpus: int | None = None) -> PlanResult:
    """Every section of the report for the scenario at `path` (bad input raises InputError). `inputs`: the
    `planner.inputs.load(path, own_layout=True)` the caller already made (the scenario is read once: it may
    be a pipe). `tokens`, `days`: the token budget (None: the scenario's training.tokens / training.days);
    `max_gpus`: the largest cluster its sweep may use (None: the bounds table's maximum)."""
    from k3sim.planner.inputs import load

    inp = inputs if inputs is not None else load(path, own_layout=True)  # the plan runs the scenario's own layout: a knob idle there is refused
    sc, model, hw = inp.scenario, inp.model, inp.hw
    kt = RecordingKernelTime(kernel_time)
    res = PlanResult(scenario=sc.name, scenario_file=str(path), description=sc.description or "", mode=inp.mode,
                     model=model.name, hardware=hw.name, cluster=sc.cluster.model_dump(),
                     parallelism=sc.parallelism.model_dump(), replicas=sc.replicas, fits=True, verdict="", hw=hw)
    from k3sim.configs.loaders import resolve_relative

    res.model_path = str(resolve_relative(sc.model, Path(path).resolve().parent))
    if "memory" in sections:
        _section(res, "memory", lambda: _memory(res, inp), progress)
    budget = budget_inputs(inp, tokens, days)
    if inp.mode == "train":
        if "step" in sections:
            _section(res, "step", lambda: _training(res, inp, kt), progress)
        if "token_budget" in sections and budget is not None:
            _section(res, "token_budget", lambda: _token_budget(res, inp, budget, max_gpus, kt.inner), progress)
        for s in ("serving", "decode", "prefix_cache"):
            res.notes[s] = "not applicable to a training scenario"
        if "pipeline" in sections and sc.parallelism.pp == 1:
            res.notes["pipeline"] = "pp=1: no pipeline"
    else:
        res.notes["step"] = "serving scenario: see the serving-latency breakdown"
        res.notes["pipeline"] = ("not applicable to a serving scenario (serving stages run micro-batches in "
                                 "sequence, not a 1F1B schedule)")
        if "serving" in sections:
            _section(res, "serving", lambda: _serving(res, inp, kt, serving_requests), progress)
        if "decode" in sections:
            _section(res, "decode", lambda: _decode(res, inp, kt), progress)
        if "prefix_cache" in sections and res.fits:
            _section(res, "prefix_cache", lambda: _prefix_cache(res, inp), progress)
        elif "prefix_cache" in sections:
            res.notes["prefix_cache"] = f"not computed: {res.verdict}"
    if "cp" in sections and not (inp.mode == "serve" and not res.fits):
        _section(res, "cp", lambda: _cp(res, inp, kt), progress)
    elif "cp" in sections:
        res.notes["cp"] = f"not computed: {res.verdict}"
    if "calibration" in sections:
        _section(res, "calibration", lambda: _calibration(res, inp, kt), progress)
    res.assumptions = _assumptions(res, inp)
    return res


def searched_scenario(scenario: Any, row: dict) -> Any:
    """The scenario with a search row's fleet: its layout, GPUs, replicas, P:D split, batch limit, scheduler."""
    from k3sim.configs.parallel import Cluster
    from k3sim.configs.parallelism import Parallelism
    from k3sim.configs.serving import DisaggregationConfig, PoolConfig, ServingConfig
    from k3sim.planner.serve_search import layout_of

    base = {k: getattr(scenario.parallelism, k) for k in scenario.parallelism.model_fields_set}
    par = Parallelism(**{**base, **layout_of(row)})
    sv = scenario.serving or ServingConfig()
    eng = sv.engine.model_copy(update={"max_batch": row["max_batch"], "scheduler": row["scheduler"],
                                       "pp_microbatches": row["pp"] > 1 and row["dp"] == 1})
    split = None
    if row["prefill_replicas"]:
        split = DisaggregationConfig(prefill=PoolConfig(replicas=row["prefill_replicas"]),
                                     decode=PoolConfig(replicas=row["replicas"] - row["prefill_replicas"]))
    sv = sv.model_copy(update={"engine": eng, "replicas": row["replicas"], "disaggregation": split})
    cluster = Cluster(num_gpus=row["gpus"], gpus_per_node=scenario.cluster.gpus_per_node)
    return scenario.model_copy(update={"parallelism": par, "cluster": cluster, "serving": sv})


def plan_searched(path: str | Path, inp, result) -> PlanResult:
    """The planning report of a serving search's answer (the recommendation, or the closest layout): every
    section on that layout, its serving figures the search's whole-traffic run (not a synthetic sample)."""
    import dataclasses

    row = result.recommendation or result.closest
    if row is None:
        res = PlanResult(scenario=inp.scenario.name, scenario_file=str(path), description=inp.scenario.description or "",
                         mode=inp.mode, model=inp.model.name, hardware=inp.hw.name,
                         cluster=inp.scenario.cluster.model_dump(), parallelism=inp.scenario.parallelism.model_dump(),
                         replicas=inp.scenario.replicas, fits=False, verdict=result.verdict(), hw=inp.hw)
        res.serving_search = result
        return res
    chosen = dataclasses.replace(inp, scenario=searched_scenario(inp.scenario, row))
    res = plan(path, inputs=chosen, sections=tuple(s for s in SECTIONS if s != "serving"))
    res.serving = {k: row[k] for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "goodput_requests_per_s",
                                       "throughput_output_tokens_per_s_per_gpu", "token_hit_rate", "requests")}
    res.notes["serving"] = (f"the serving search's whole-traffic run of this layout ({result.traffic}, "
                            f"{result.traffic_requests:,} requests)")
    res.serving_search = result
    res.verdict = result.verdict()
    return res


# ------------------------------------------------------------------------------------------ sections
def _memory(res: PlanResult, inp) -> None:
    from k3sim.memory.plan import serve_plan, train_plan

    sc, w = inp.scenario, inp.scenario.workload
    src = str(inp.path)
    if inp.mode == "serve":
        try:
            res.memory = serve_plan(inp.model, inp.hw, sc.parallelism, w.context_tokens,
                                    prefill_chunk_tokens=w.prefill_chunk_tokens,
                                    workspace_fraction=w.workspace_fraction, source=src)
        except DoesNotFit as err:
            res.fits, res.verdict = False, err.reason
            res.memory_rows = _serve_misfit_rows(inp)
            return
        p = res.memory
        res.verdict = (f"fits: {p.max_concurrent_requests} concurrent {w.context_tokens:,}-token requests per "
                       f"replica (pipeline stage {p.worst_stage} is the fullest: {p.per_gpu_bytes['total'] / 2 ** 30:.1f}"
                       f" of {p.hbm_bytes / 2 ** 30:.1f} GiB = {p.hbm_bytes / 1e9:.1f} GB per GPU)")
    else:
        from k3sim.training import memory_verdict

        res.memory = train_plan(inp.model, inp.hw, sc.parallelism, w.context_tokens,
                                micro_batch_size=w.micro_batch_size,
                                activation_checkpointing=w.activation_checkpointing,
                                num_micro_batches=w.num_micro_batches or sc.parallelism.pp * sc.parallelism.virtual_stages,
                                workspace_fraction=w.workspace_fraction, source=src, allow_overflow=True,
                                recompute=inp.training.recompute, recompute_modules=inp.training.recompute_modules,
                                precision=inp.training.precision)
        res.fits, res.verdict = res.memory.fits, memory_verdict(res.memory)


def _serve_misfit_rows(inp) -> list:
    """What the fullest GPU of a serving layout that does not fit would need: the memory planner's weight
    rows (computed against an unbounded HBM, so it does not refuse), the workspace reserve of the real HBM
    and one request's KV cache and state."""
    from k3sim.memory.plan import Row, serve_plan

    sc, w = inp.scenario, inp.scenario.workload
    unbounded = inp.hw.model_copy(update={"hbm_bytes": 1e18})
    p = serve_plan(inp.model, unbounded, sc.parallelism, w.context_tokens,
                   prefill_chunk_tokens=w.prefill_chunk_tokens, workspace_fraction=0.0)
    rows = [r for r in p.breakdown if r.component.startswith("weights_") or r.component == "attn_res_blocks"]
    rows.append(Row("workspace_reserve", int(w.workspace_fraction * inp.hw.hbm_bytes),
                    f"{w.workspace_fraction:g} x HBM"))
    rows.append(Row("one_request_kv_and_state", p.per_request_bytes_per_gpu,
                    f"one {w.context_tokens}-token request"))
    return rows


def _training(res: PlanResult, inp, kt) -> None:
    from k3sim.training import train_step

    sc, w = inp.scenario, inp.scenario.workload
    res.training = train_step(inp.model, inp.hw, sc.parallelism, seq_len=w.context_tokens,
                              micro_batch_size=w.micro_batch_size, num_micro_batches=w.num_micro_batches,
                              activation_checkpointing=w.activation_checkpointing,
                              workspace_fraction=w.workspace_fraction, options=inp.training.options(None),
                              kernel_time=kt, source=str(inp.path))
    if res.memory is None or res.training.stage_split == "balanced":   # the memory of the step's own split
        res.memory = res.training.memory
        res.fits, res.verdict = res.training.fits, res.training.verdict
    if not res.fits:
        res.notes["step"] = ("the layout does not fit in memory: the step time below is what it would take if "
                             "it did, not a runnable configuration")


def budget_inputs(inp, tokens: float | None, days: float | None) -> tuple[float, float] | None:
    """(tokens, days) of the token budget: the arguments (the command's --tokens / --days), else the scenario's
    training.tokens / training.days; None without one. Half a budget is refused naming what is missing."""
    tokens = inp.training.tokens if tokens is None else tokens
    days = inp.training.days if days is None else days
    if tokens is None and days is None:
        return None
    if inp.mode != "train":
        raise InputError("a token budget sizes a training cluster and the scenario's workload.mode is serve; "
                         "remove it, or plan a train scenario", source="--tokens" if tokens is not None else "--days")
    if days is None:
        raise InputError("a token budget needs the wall-clock days too: add training.days or --days, or remove "
                         "training.tokens", source=str(inp.path), field="training.tokens")
    if tokens is None:
        raise InputError("a token budget needs the tokens to train too: add training.tokens or --tokens, or remove "
                         "training.days", source=str(inp.path), field="training.days")
    return float(tokens), float(days)


def _token_budget(res: PlanResult, inp, budget: tuple[float, float], max_gpus: int | None, kernel_time) -> None:
    """The smallest cluster and layout that trains the token budget in time (`k3sim.planner.budget`)."""
    from k3sim.planner.budget import token_budget

    b = token_budget(inp, *budget, max_gpus=max_gpus, kernel_time=kernel_time)
    res.token_budget = b
    res.notes["token_budget"] = (
        f"Candidates: clusters of {inp.scenario.cluster.num_gpus:,} x 2^k GPUs up to {b.max_gpus:,} (none below the "
        f"{b.ideal_gpus:,.0f} GPUs the rate needs at 100 % MFU), each with the sweep grid (the scenario's sweep: "
        f"lists, else k3sim sweep's), dp filling it, at {', '.join(f'{t:,}' for t in b.global_batch_sequences)} "
        "sequences per step; the analytic path (closed-form pipeline, as k3sim sweep) decides, k3sim plan's "
        "event engine is shown beside it (k3sim.planner.budget).")


def _serving(res: PlanResult, inp, kt, requests: int | None) -> None:
    """The serving simulator's answer for the scenario (k3sim.serving: the same run as `k3sim serve
    --workload chat --requests N`), on a short seeded sample so the plan stays fast."""
    if not res.fits:
        res.notes["serving"] = f"not simulated: {res.verdict}"
        return
    if importlib.util.find_spec("k3sim.serving.run") is None:
        res.notes["serving"] = "not available: k3sim.serving is not installed in this checkout"
        return
    from k3sim.serving.run import ServeSetup, simulate

    n = requests or SERVING_REQUESTS
    setup = ServeSetup.from_scenario(inp.path, resolved=(inp.scenario, inp.model, inp.hw))
    run = simulate(setup, serving_sample(setup, n))
    # wall_s is this machine's run time, not an answer about the fleet: left out so a report regenerated
    # from the same inputs is byte-identical
    res.serving = {k: v for k, v in run.summary.items() if k != "wall_s"}
    res.serving_frame = run.frame()
    res.notes["serving"] = (f"k3sim.serving on a seeded synthetic '{SERVING_WORKLOAD}' sample of {n} requests at the "
                            "generator's own arrival times (the same run as `k3sim serve --workload "
                            f"{SERVING_WORKLOAD} --requests {n}`): a short sample keeps the plan fast; run "
                            "`k3sim serve` on a full trace for tail latencies")


def serving_sample(setup, n: int):
    """The seeded synthetic request sample the plan and the sweep simulate: `k3sim serve --workload chat
    --requests n` at the generator's own arrival times (no --arrival-rate, so no retiming)."""
    from k3sim.serving.run import request_source

    return request_source(trace=None, workload=SERVING_WORKLOAD, n_requests=n, seed=setup.serving.seed,
                          arrival="poisson", cv=2.0, limit=None)(None)


def _decode(res: PlanResult, inp, kt) -> None:
    if not res.fits:
        res.notes["decode"] = f"not computed: {res.verdict}"
        return
    if importlib.util.find_spec("k3sim.decode.sweep") is None:
        res.notes["decode"] = "not available: k3sim.decode is not installed in this checkout"
        return
    from k3sim.decode.sweep import sweep_batches, sweep_table
    from k3sim.step import StepLayout

    par = inp.scenario.parallelism
    layout = StepLayout(tp=par.tp, pp=par.pp, ep=par.ep, attention_dp=par.dp,
                        gpus_per_node=inp.scenario.cluster.gpus_per_node)
    ctx = inp.scenario.workload.context_tokens
    results = sweep_batches(inp.model, inp.hw, layout, ctx, batches=DECODE_BATCHES, kernel_time=kt)
    res.decode = sweep_table(results, inp.hw)
    res.decode_layout = {"tp": par.tp, "pp": par.pp, "ep": par.ep, "attention_dp": par.dp, "context_tokens": ctx}


def _prefix_cache(res: PlanResult, inp) -> None:
    from k3sim.prefix_cache.setup import make_config
    from k3sim.serving.prefix_cache_run import simulate

    rows = []
    tp = inp.scenario.parallelism.tp
    # Block sizes: 512-token hash blocks and a physical block inside the 1,024-6,144-token range KDA state
    # snapshots force (MISSION sec. 5); 4,096 within that range is a modelling choice. 'full-attention'
    # has no KDA state to snapshot, so its physical block can be the hash block.
    for policy, hb, pb in (("coarse", 512, 4096), ("decoupled", 512, 4096), ("full-attention", 512, 512)):
        try:
            cfg = make_config(res.model_path, policy, hb, pb, None, tp=tp)
            r = simulate(None, cfg, workload=PREFIX_CACHE_WORKLOAD, requests=PREFIX_CACHE_REQUESTS, seed=0)
        except InputError as err:
            rows.append({"policy": policy, "note": err.reason})
            continue
        rows.append({"policy": policy, "hash_block_tokens": r.hash_block_tokens,
                     "physical_block_tokens": r.physical_block_tokens, "token_hit_rate": r.token_hit_rate,
                     "request_hit_rate": r.request_hit_rate, "requests": r.requests, "note": ""})
    res.prefix_cache = rows
    res.notes["prefix_cache"] = (f"seeded synthetic '{PREFIX_CACHE_WORKLOAD}' workload, {PREFIX_CACHE_REQUESTS} "
                                 "requests, unbounded pool (k3sim.prefix_cache): the reuse each policy can catch; "
                                 "'full-attention' is the reference a model without KDA state would get")


def _cp(res: PlanResult, inp, kt) -> None:
    from k3sim.cp import geometry_from_model
    from k3sim.cp.sweep import crossovers, sweep

    model, par = inp.model, inp.scenario.parallelism
    if any(k not in ("kda", "mla") for layer in model.layers for k in layer.mixers):
        _cp_by_kind(res, inp, kt)
        return
    g = geometry_from_model(model, par.tp)
    # Without CP in the scenario, CP is shown at 8 ranks (one 8-GPU NVLink node) and the sequence axis runs
    # 8k tokens to max(context, 1M) in powers of two: modelling choices of what to show, not of the cost.
    P = par.cp if par.cp > 1 else 8
    ctx = inp.scenario.workload.context_tokens
    top = max(ctx, 2 ** 20)
    seq = [2 ** k for k in range(13, 31) if 2 ** k <= top]
    res.cp_rows = sweep(g, inp.hw, seq, [P], kernel_time=kt)
    res.cp_degree, res.cp_geometry = P, g
    res.cp_crossovers = {k: crossovers(res.cp_rows, P, k) for k in ("kda", "mla")}
    if par.cp == 1:
        res.notes["cp"] = f"the scenario uses no CP; shown at P={P} for what CP would cost at long context"


def _cp_by_kind(res: PlanResult, inp, kt) -> None:
    """CP of a model with layer kinds beyond KDA and MLA: `k3sim.cp.model_cp_step` (each kind's default scheme:
    the KCP fold for GDN, the decayed-sum fold for Mamba2 / Mamba / lightning, all-gather KV for GQA, the window
    halo for SWA) at the scenario's CP degree (8 without CP) over the same sequence lengths as the KDA/MLA sweep,
    the step split by kind (`res.cp_kinds`: seq_len, kind, scheme, layers, seconds)."""
    from k3sim.cp import model_cp_step

    model, par = inp.model, inp.scenario.parallelism
    P = par.cp if par.cp > 1 else 8
    top = max(inp.scenario.workload.context_tokens, min(2 ** 20, model.max_context_tokens or 2 ** 20))
    rows = []
    for n in [2 ** k for k in range(13, 31) if 2 ** k <= top]:
        r = model_cp_step(model, inp.hw, n, P, tp=par.tp, kernel_time=kt)
        rows += [{"seq_len": n, "kind": k.title, "scheme": k.scheme_label, "layers": k.layers,
                  "step_time_s": k.step_time_s, "share": k.step_time_s / r.step_attention_time_s if r.step_attention_time_s else 0.0}
                 for k in r.kinds]
    res.cp_kinds, res.cp_degree = rows, P
    res.notes["cp"] = (f"CP at P={P} by layer kind (k3sim cp: each kind's own scheme)"
                       + ("; the scenario uses no CP" if par.cp == 1 else ""))


def _calibration(res: PlanResult, inp, kt: RecordingKernelTime) -> None:
    """Validation error of the ops this plan called (reports/calibration/validation.csv, written by
    `k3sim calibrate validate` for the profile), and how many calls each source answered."""
    import csv

    from k3sim.configs.loaders import REPO_ROOT

    used = kt.ops()
    res.kernel_calls = [{"op": op, "source": src, "calls": n} for (op, src), n in sorted(kt.calls.items())]
    if not getattr(inp.hw, "calibration_dir", None) and getattr(inp.hw, "derived_from", None) is None:
        res.notes["calibration"] = (f"profile {inp.hw.name} is uncalibrated: kernel times are datasheet rooflines "
                                    "(lower bounds); no error table")
        return
    path = REPO_ROOT / "reports" / "calibration" / "validation.csv"
    if inp.hw.name != "h200" or not path.exists():
        res.notes["calibration"] = f"no committed validation table for {inp.hw.name}"
        return
    with open(path) as f:
        table = list(csv.DictReader(f))
    rows = [r for r in table if r["level"] == "op" and r["op"] in used]
    res.calibration = [{"op": r["op"], "family": r["family"], "points": int(r["count"]),
                        "mape": float(r["mape"]), "p90_abs_err": float(r["p90_abs_err"]),
                        "max_abs_err": float(r["max_abs_err"]), "meets_goal": r["meets_goal"] == "True"}
                       for r in rows]
    note = ("leave-one-out error against the H200 measurements (reports/calibration/validation.csv); ops the "
            "plan called without a row are predicted from fits outside their measured range (see kernel calls "
            "by source)")
    stale = validation_staleness(table, inp.hw)
    res.notes["calibration"] = f"{stale}; {note}" if stale else note


STALE_LABEL = "stale: regenerate with scripts/reports.sh calibration"


def validation_staleness(table: list[dict], hw: Any) -> str | None:
    """None when the committed validation table was built from the measurements the profile holds now (its
    `data_fingerprint` column, written by `k3sim calibrate validate`, equals the store's fingerprint); else
    the stale label with both fingerprints. The plan goes on either way: the table is shown, labelled."""
    from k3sim.kernels.validate import data_fingerprint

    built = {r.get("data_fingerprint") or "" for r in table}
    now = data_fingerprint(hw)
    if built == {now}:
        return None
    was = next(iter(built)) if len(built) == 1 and "" not in built else "none"
    return f"{STALE_LABEL} (the table was built from data fingerprint {was}, the measurements now have " \
           f"{now or 'none'})"


def _assumptions(res: PlanResult, inp) -> list[dict]:
    out = []
    hw = inp.hw
    for k, v in (getattr(hw, "sources", None) or {}).items():
        out.append({"assumption": f"{hw.name} {k} = {getattr(hw, k, '')}", "source": v})
    src = getattr(inp.model, "source", None)
    out.append({"assumption": f"model {inp.model.name}", "source": src or res.model_path})
    if res.training is not None:
        out += res.training.assumptions
        o = res.training.options
        out.append({"assumption": f"routing skew {o['routing_skew']}, MoonEP redundant experts {o['redundant_experts']}, "
                                  f"TP overlap {o['tp_overlap']}, EP overlap {o['ep_overlap']}",
                    "source": "scenario training: section (defaults: modelling choices)"})
    mem = res.memory
    if mem is not None:
        doc = "k3sim.memory.plan." + ("serve_plan" if inp.mode == "serve" else "train_plan")
        out.append({"assumption": "sharding, workspace reserve, activation checkpointing as in the memory planner",
                    "source": doc})
    if res.prefix_cache is not None:
        out.append({"assumption": res.notes.get("prefix_cache", ""), "source": "modelling choice (k3sim.planner.plan)"})
    return out
