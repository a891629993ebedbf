"""Build a fleet from a scenario and serve a request stream through it; rate sweeps on several processes.

Entry points: `ServeSetup.from_scenario(...)` (every option of `k3sim serve` resolved and checked, before any
simulation or file), `simulate(setup, requests)` -> `ServeResult`, `sweep_rates(...)`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from k3sim.errors import InputError

# the CacheConfig fields a `serve` user sets through these options
_CACHE_OPTIONS = {"policy": "--cache-policy", "capacity_bytes": "--pool-bytes",
                  "hash_block_tokens": "serving.engine.hash_block_tokens",
                  "physical_block_tokens": "serving.engine.physical_block_tokens"}


@dataclass
class PoolSpec:
    """One kind of replica: role, count, layout, its cache geometry and per-GPU pool."""

    role: str  # mixed | prefill | decode
    replicas: int
    parallelism: object  # configs.Parallelism
    cache: object  # prefix_cache.CacheConfig (pages per TP rank, all layers; capacity in those bytes)
    pool_bytes_per_gpu: float | str | None  # as given: bytes, 'unbounded', or None (the memory planner's free HBM;
    # the figure in whole-model pages is `cache.capacity_bytes`)
    pp_engines: int = 1  # batches in flight per replica: pp with pp micro-batches (`_pp_engines`), else 1
    note: str | None = None  # why a pp > 1 replica keeps one batch in flight, when it does

    @property
    def gpus_per_replica(self) -> int:
        return self.parallelism.gpus


@dataclass
class ServeSetup:
    model: object
    hw: object
    scenario_name: str
    serving: object  # configs.serving.ServingConfig (with the command-line overrides applied)
    pools: list[PoolSpec]
    gpus_per_node: int = 8
    source: str | None = None
    file_serving: object = None  # the scenario file's own serving section, before the overrides

    @property
    def gpus(self) -> int:
        return sum(p.replicas * p.gpus_per_replica for p in self.pools)

    @property
    def disaggregated(self) -> bool:
        return any(p.role == "prefill" for p in self.pools)

    @staticmethod
    def from_scenario(path: str | Path, *, cache_policy: str | None = None, pool_bytes: float | str | None = None,
                      router: str | None = None, disaggregate: str | None = None, slo_ttft_s: float | None = None,
                      slo_tpot_s: float | None = None, replicas: int | None = None, scheduler: str | None = None,
                      seed: int | None = None, pp_microbatches: bool | None = None,
                      resolved: tuple | None = None, layout: dict | None = None, mtp: int | None = None,
                      acceptance: float | None = None, host_pool_bytes: float | None = None) -> "ServeSetup":
        """`resolved`: the (scenario, model, hardware) the caller already loaded from `path`, so a scenario
        given as a pipe is read once (the planner passes its own). `layout`: `Parallelism` fields that replace
        the scenario's (the serving-at-scale what-ifs: dp, ep, ep_kernel, ...); `mtp` / `acceptance`: the
        serving section's MTP drafts and acceptance. `host_pool_bytes`: the per-GPU host-memory tier
        (`serving.engine.host_pool_bytes`; --host-pool-bytes)."""
        from k3sim.configs import resolve_scenario
        from k3sim.configs.serving import DisaggregationConfig, PoolConfig, ServingConfig

        scn, model, hw = resolved if resolved is not None else resolve_scenario(path)
        src = str(path)
        if layout:
            scn = _with_layout(scn, model, hw, layout, replicas, src)
        sv = scn.serving
        if sv is None:
            if scn.workload.mode != "serve":
                raise InputError("the scenario has no serving section and its workload is "
                                 f"'{scn.workload.mode}': add a `serving:` section to serve it", source=src,
                                 field="serving")
            sv = ServingConfig()
        upd: dict = {}
        eng = _engine_updates(model, sv, cache_policy, pool_bytes, scheduler, pp_microbatches)
        if host_pool_bytes is not None:
            from k3sim.prefix_cache.offload import check_tier_bytes

            eng["host_pool_bytes"] = check_tier_bytes(host_pool_bytes, "--host-pool-bytes")
        if eng:
            upd["engine"] = sv.engine.model_copy(update=eng)
        if router is not None:
            from k3sim.configs.serving import ROUTERS

            if router not in ROUTERS:
                raise InputError(f"unknown router '{router}' (choose {', '.join(ROUTERS)})", source="--router")
            upd["router"] = router
        for opt, v, key in (("--slo-ttft", slo_ttft_s, "slo_ttft_s"), ("--slo-tpot", slo_tpot_s, "slo_tpot_s")):
            if v is not None:
                if not (math.isfinite(v) and 0 < v <= 1e9):
                    raise InputError(f"must be a finite positive number of seconds (got {v})", source=opt)
                upd[key] = v
        if replicas is not None:
            from k3sim.configs.serving import MAX_REPLICAS

            if not 1 <= replicas <= MAX_REPLICAS:
                raise InputError(f"must be between 1 and {MAX_REPLICAS} (got {replicas})", source="--replicas")
            upd["replicas"] = replicas
        if seed is not None:
            if not 0 <= seed < 2 ** 63:
                raise InputError(f"must be a non-negative 64-bit integer (got {seed})", source="--seed")
            upd["seed"] = seed
        for key, v in (("mtp", mtp), ("acceptance", acceptance)):
            if v is not None:
                upd[key] = v
        n_rep = upd.get("replicas", sv.replicas) or scn.replicas
        if disaggregate is not None:
            p, d = _split(disaggregate)
            if p + d != n_rep:
                raise InputError(f"{p}:{d} does not add up to the fleet's {n_rep} replicas "
                                 f"(cluster GPUs / GPUs per replica, or serving.replicas)", source="--disaggregate")
            upd["disaggregation"] = DisaggregationConfig(prefill=PoolConfig(replicas=p), decode=PoolConfig(replicas=d))
            upd["replicas"] = n_rep
        if upd:
            try:
                sv = ServingConfig.model_validate({**sv.model_dump(), **{k: (v.model_dump() if hasattr(v, "model_dump")
                                                                           else v) for k, v in upd.items()}})
            except Exception as err:  # pydantic ValidationError: one line
                raise InputError(_first_error(err), source=_option_of(err, upd, src)) from None
        _check_mla_only_policy(model, sv.engine.cache_policy, cache_policy is not None, src)
        pp_explicit = pp_microbatches is not None or (scn.serving is not None and
                                                      "pp_microbatches" in scn.serving.engine.model_fields_set)
        from k3sim.configs.parallel import check_layout

        gpn = scn.cluster.gpus_per_node
        pools = []
        if sv.disaggregation is None:
            check_layout(model, scn.parallelism, mode="serve", source=src, hardware=hw)
            pools.append(_pool("mixed", sv.replicas or scn.replicas, scn.parallelism, model, hw, sv, scn, src,
                               pp_explicit, host_pool_bytes is not None))
        else:
            dz = sv.disaggregation
            if sv.replicas is None and dz.prefill.replicas + dz.decode.replicas != scn.replicas and \
                    dz.prefill.parallelism is None and dz.decode.parallelism is None:
                raise InputError(f"disaggregation {dz.prefill.replicas}:{dz.decode.replicas} does not add up to the "
                                 f"cluster's {scn.replicas} replicas", source=src, field="serving.disaggregation")
            for role, pc in (("prefill", dz.prefill), ("decode", dz.decode)):
                par = pc.parallelism or scn.parallelism
                check_layout(model, par, mode="serve", source=src, hardware=hw)
                pools.append(_pool(role, pc.replicas, par, model, hw, sv, scn, src, pp_explicit,
                                   host_pool_bytes is not None))
        return ServeSetup(model, hw, scn.name, sv, pools, gpn, src, scn.serving)


def _engine_updates(model, sv, cache_policy, pool_bytes, scheduler, pp_microbatches) -> dict:
    """The `serving.engine` fields the options replace, each checked against its choices, and the default
    cache policy of a model without KDA layers."""
    from k3sim.configs.serving import CACHE_POLICIES, SCHEDULERS

    eng: dict = {}
    for key, value, choices, what, option in (("cache_policy", cache_policy, CACHE_POLICIES, "policy", "--cache-policy"),
                                              ("scheduler", scheduler, SCHEDULERS, "scheduler", "--scheduler")):
        if value is not None:
            if value not in choices:
                raise InputError(f"unknown {what} '{value}' (choose {', '.join(choices)})", source=option)
            eng[key] = value
    if pool_bytes is not None:
        eng["pool_bytes"] = pool_bytes
    if pp_microbatches is not None:
        eng["pp_microbatches"] = pp_microbatches
    if cache_policy is None and not model.num_kda_layers and "cache_policy" not in sv.engine.model_fields_set:
        eng["cache_policy"] = "full-attention"  # an MLA-only model: no KDA state to cache beside its KV
    return eng


def _layout_summary(par) -> dict:
    """One pool's replica layout as the serve JSON reports it (attention DP is `dp`)."""
    keys = ("tp", "pp", "ep", "dp", "redundant_experts", "ep_kernel", "dispatch_dtype", "max_nodes_per_token", "tbo",
            "tbo_variant", "routing_zipf", "mla_decode_kernel")
    return {"gpus": par.gpus, **{k: getattr(par, k) for k in keys}}


def _option_of(err, upd: dict, src: str) -> str:
    """The option behind a serving-section refusal of the values the options set, else the scenario."""
    text = str(err)
    for key, option in (("pool_bytes", "--pool-bytes"), ("acceptance", "--acceptance"), ("mtp", "--mtp")):
        if key in text and key in upd:
            return option
    return src


def _with_layout(scn, model, hw, layout: dict, replicas: int | None, src: str):
    """The scenario with its `parallelism` fields replaced by `layout` (what the scenario set stays unless
    replaced) and checked by the one layout check. A layout whose replica no longer tiles the cluster takes
    `replicas` replicas (a what-if fleet, as --replicas is) or is refused with that fix."""
    from k3sim.configs.parallel import Cluster, check_layout
    from k3sim.configs.parallelism import Parallelism

    if scn.serving is not None and scn.serving.disaggregation is not None and any(
            pc.parallelism is not None for pc in (scn.serving.disaggregation.prefill, scn.serving.disaggregation.decode)):
        raise InputError("the scenario's pools set their own layouts (serving.disaggregation.*.parallelism), so a "
                         "layout option would change only some of them: edit the pools' parallelism instead",
                         source=src, field="serving.disaggregation")
    base = {k: getattr(scn.parallelism, k) for k in scn.parallelism.model_fields_set}
    try:
        par = Parallelism(**{**base, **layout})
    except Exception as err:  # pydantic ValidationError: one line naming the field
        raise InputError(_first_error(err), source=src, field=f"parallelism.{_first_loc(err)}") from None
    cluster = scn.cluster
    if cluster.num_gpus % par.gpus:
        if replicas is None:
            raise InputError(f"a replica of this layout has {par.gpus} GPUs, which does not tile the scenario's "
                             f"{cluster.num_gpus}-GPU cluster: give --replicas N for a what-if fleet of N replicas",
                             source=src, field="parallelism." + next(iter(layout)))
        cluster = Cluster(num_gpus=replicas * par.gpus, gpus_per_node=cluster.gpus_per_node)
    check_layout(model, par, mode="serve", source=src, hardware=hw, cluster=cluster)
    return scn.model_copy(update={"parallelism": par, "cluster": cluster})


def _first_loc(err) -> str:
    try:
        return str(err.errors()[0]["loc"][0])
    except Exception:
        return ""


def _check_mla_only_policy(model, policy: str, from_cli: bool, src: str) -> None:
    """A model without KDA layers caches full attention only (the other policies place KDA state)."""
    if model.num_kda_layers or policy == "full-attention":
        return
    raise InputError(f"model '{model.name}' has no KDA layers, so the '{policy}' policy (KDA state cached beside "
                     "the MLA pages) does not apply: use --cache-policy full-attention (serving.engine.cache_policy), "
                     "the default for such a model", source="--cache-policy" if from_cli else src,
                     field=None if from_cli else "serving.engine.cache_policy")


def _first_error(err) -> str:
    try:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e.get("loc", ()))
        msg = str(e.get("msg")).removeprefix("Value error, ")
        return f"{loc}: {msg}" if loc else msg
    except Exception:
        return str(err).splitlines()[0]


def _split(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        p, d = (int(x) for x in parts)
    except ValueError:
        raise InputError(f"expected P:D (prefill:decode replicas, e.g. 1:1), got '{text}'",
                         source="--disaggregate") from None
    if p < 1 or d < 1:
        raise InputError(f"both pools need at least one replica (got {text})", source="--disaggregate")
    return p, d


def pool_capacity_bytes(model, hw, par, pool_bytes_per_gpu: float | None, *, context_tokens: int,
                        prefill_chunk_tokens: int, workspace_fraction: float, source: str | None = None) -> float:
    """The prefix cache's capacity (pages of all layers, per TP rank) that a per-GPU pool means under `par`.

    A stage's GPU holds its own layers' share of every page (MLA KV by its MLA layers, KDA state slots by its
    KDA layers), so the whole-model capacity is min over stages of per-GPU bytes / that stage's share. Without
    an explicit per-GPU pool, each stage's is what the memory planner leaves after weights, AttnRes blocks and
    workspace (`memory.plan.serve_plan`)."""
    from k3sim.memory.plan import serve_plan

    plan = serve_plan(model, hw, par, context_tokens, prefill_chunk_tokens=prefill_chunk_tokens,
                      workspace_fraction=workspace_fraction, source=source)
    best = math.inf
    for st in plan.stages:
        # each mixer kind's pages (KV, or state slots) spread over the stages that hold its layers
        kinds = [k for i in st["layers"] for k in model.layers[i - 1].mixers]
        share = max((kinds.count(k) / model.num_layers_with(k) for k in set(kinds)), default=0.0)
        if share <= 0:
            continue
        per_gpu = pool_bytes_per_gpu if pool_bytes_per_gpu is not None else plan.hbm_bytes - st["fixed_bytes"]
        best = min(best, per_gpu / share)
    return best


def default_physical_block(model, hash_block: int, tp: int, policy: str) -> int:
    """Smallest multiple of the hash block whose page (all MLA layers' KV per TP rank) holds one KDA group's
    state per TP rank, so a state slot is one page (vLLM's hybrid allocator sizes attention pages to the mamba
    state the same way)."""
    from k3sim.memory.sizes import conv_state_bytes_per_request, kda_state_bytes_per_request, mla_kv_bytes_per_token
    from k3sim.prefix_cache.config import kda_groups_for

    if policy == "full-attention" or not model.num_kda_layers:
        return hash_block
    g = kda_groups_for(model.num_kda_layers, model.num_mla_layers)
    state = math.ceil((kda_state_bytes_per_request(model) + conv_state_bytes_per_request(model)) / tp / g)
    tokens = math.ceil(state / max(mla_kv_bytes_per_token(model), 1))
    return max(1, math.ceil(tokens / hash_block)) * hash_block


def _pp_engines(e, par, explicit: bool) -> tuple[int, str | None]:
    """Batches in flight per replica of layout `par` and, when a pp > 1 replica keeps one, why.

    On by default (`serving.engine.pp_microbatches`): engines keep pp batches in flight so no stage idles
    while the others work (vLLM V1: `VllmConfig.max_concurrent_batches` is the pipeline size, "PP requires
    PP-size concurrent batches to fill the pipeline", vllm/config/vllm.py; vLLM V0 ran pp virtual engines,
    one scheduler each, vllm/engine/llm_engine.py; SGLang's `event_loop_pp` keeps pp_size micro-batches,
    python/sglang/srt/managers/scheduler_pp_mixin.py). With attention DP the lockstep ranks are one engine
    here: pp micro-batches are refused when asked for, and off (with the note) by default."""
    if par.pp == 1:
        return 1, None
    if not e.pp_microbatches:
        return 1, (f"pp micro-batches off: one batch at a time passes the {par.pp} pipeline stages, so each "
                   f"stage idles {par.pp - 1}/{par.pp} of the time (engines keep pp batches in flight: "
                   "--pp-microbatches)")
    if par.dp > 1:
        if explicit:
            raise InputError(f"pp micro-batches (virtual engines) with attention DP (dp={par.dp}) are not modelled: "
                             "an attention-DP replica steps its ranks in lockstep; remove one of the two",
                             source="serving.engine.pp_microbatches")
        return 1, (f"pp micro-batches are not modelled with attention DP (dp={par.dp}): one batch at a time passes "
                   f"the {par.pp} pipeline stages, so throughput is a lower bound")
    return par.pp, None


def _host_tier(model, hw, par, e, scn, src: str, from_cli: bool) -> dict:
    """The CacheConfig fields of the per-GPU host tier `e.host_pool_bytes` under `par` (none when 0): a stage's
    GPU holds its layers' share of every entry, as of every page (`pool_capacity_bytes`), so the whole-model
    capacity is per-GPU bytes / the largest share, and a restore moves each stage's share over its own GPUs'
    links at the profile's achieved host-link bandwidth: the largest share sets its time."""
    if not e.host_pool_bytes:
        return {}
    from k3sim.prefix_cache.offload import host_link

    option, field = ("--host-pool-bytes", None) if from_cli else (src, "serving.engine.host_pool_bytes")
    link = host_link(hw, source=option, field=field)
    ctx = scn.workload.context_tokens if scn.workload.mode == "serve" else 131072  # as _pool's
    inv_share = pool_capacity_bytes(model, hw, par, 1.0, context_tokens=ctx, prefill_chunk_tokens=e.token_budget,
                                    workspace_fraction=scn.workload.workspace_fraction, source=src)
    return {"host_capacity_bytes": e.host_pool_bytes * inv_share,
            "host_bandwidth_bytes_per_s": link.achieved_bytes_per_s * inv_share}


def _pool(role, n, par, model, hw, sv, scn, src, pp_explicit: bool = False, host_from_cli: bool = False) -> PoolSpec:
    from k3sim.prefix_cache.config import config_from_model
    from k3sim.prefix_cache.setup import named_options

    e = sv.engine
    pp_engines, note = _pp_engines(e, par, pp_explicit)
    pb = e.physical_block_tokens or default_physical_block(model, e.hash_block_tokens, par.tp, e.cache_policy)
    per_gpu = e.pool_bytes
    if per_gpu == "unbounded":
        cap = None
    else:
        # a train scenario has no serving context; the planner wants one (it checks it against the model), but the
        # pool it leaves (HBM - weights - AttnRes blocks - workspace) does not depend on it: 131072 is a placeholder
        ctx = scn.workload.context_tokens if scn.workload.mode == "serve" else 131072
        cap = pool_capacity_bytes(model, hw, par, per_gpu, context_tokens=ctx,
                                  prefill_chunk_tokens=e.token_budget, workspace_fraction=scn.workload.workspace_fraction,
                                  source=src)
    host = _host_tier(model, hw, par, e, scn, src, host_from_cli)
    if host and cap is None:
        raise InputError("a host tier under an unbounded pool receives nothing (the pool never evicts): give the "
                         "pool a size (--pool-bytes, or leave it to the memory planner)",
                         source="--host-pool-bytes" if host_from_cli else src,
                         field=None if host_from_cli else "serving.engine.host_pool_bytes")
    with named_options(_CACHE_OPTIONS):
        cfg = config_from_model(model, e.cache_policy, e.hash_block_tokens, pb, cap, tp=par.tp, **host)
    pages = cfg.num_pages
    if pages is not None and pages < cfg.min_pages_one_request():
        what = f"{e.pool_bytes:.4g} B per GPU" if e.pool_bytes is not None else "the memory planner's free HBM"
        raise InputError(f"{what} holds {pages} pages of {cfg.page_bytes} B (all layers' share per GPU); one "
                         f"request needs {cfg.min_pages_one_request()} (1 KV page + {cfg.groups} KDA state slots)",
                         source="--pool-bytes" if e.pool_bytes is not None else src)
    return PoolSpec(role, n, par, cfg, per_gpu, pp_engines, note)


@dataclass
class ServeResult:
    summary: dict
    records: object  # entities.RecordBook
    samples: list
    wall_s: float
    steps: int
    step_time_evaluations: int
    transfer_bytes: int = 0
    extra: dict = field(default_factory=dict)

    def frame(self):
        return self.records.frame()


def simulate(setup: ServeSetup, requests: Iterable, *, step_seconds: Callable | None = None,
             sample_interval_s: float = 1.0, progress: Callable[[int], None] | None = None) -> ServeResult:
    """Serve `requests` (TraceRequests in arrival order, streamed) through the fleet of `setup`.

    `step_seconds(role_index) -> fn` may replace the step model (tests: a constant step cost)."""
    import simpy

    from k3sim.serving.engine import Replica, StepTimer
    from k3sim.serving.fleet import Fleet, TransferModel
    from k3sim.serving.metrics import LITTLE_TOLERANCE, summarize
    t0 = time.perf_counter()
    env = simpy.Environment()
    sv = setup.serving
    front = setup.pools[0]
    transfer = None
    if setup.disaggregated:
        pp, dp = setup.pools
        # a request's KV lives on the GPUs of one attention-DP rank (the whole replica without attention DP)
        links = min(pp.gpus_per_replica // pp.parallelism.dp, dp.gpus_per_replica // dp.parallelism.dp)
        same = pp.gpus_per_replica + dp.gpus_per_replica <= setup.hw.scaleup_domain_gpus
        transfer = TransferModel(setup.model, setup.hw, links, same)
    fleet = Fleet(env, router=sv.router, load_cap=sv.router_load_cap, transfer=transfer,
                  sample_interval_s=sample_interval_s, hash_block_tokens=front.cache.effective_hash_block_tokens,
                  progress=progress)
    timers = []
    mtp, advance = mtp_options(sv)
    for i, pool in enumerate(setup.pools):
        fn = step_seconds(i) if step_seconds is not None else _step_fn(setup, pool)
        timer = StepTimer(fn, sv.slo_tpot_s)
        timers.append(timer)
        lst = fleet.decode if pool.role == "decode" else fleet.front
        dp = pool.parallelism.dp
        if dp > 1:  # attention DP: dp rank engines in lockstep behind the DP balancer
            from k3sim.serving.dp import DPReplica, GroupClock

            clock = GroupClock(fn)
            for _ in range(pool.replicas):
                rep = DPReplica(fleet, len(lst), pool.role, pool.cache, sv.engine, timer, pool.gpus_per_replica, dp,
                                clock, mtp=mtp, advance=advance)
                lst.append(rep)
                env.process(rep.run())
            continue
        engines, cache_cfg = _engines_per_replica(pool)
        for _ in range(pool.replicas * engines):
            rep = Replica(fleet, len(lst), pool.role, cache_cfg, sv.engine, timer, pool.gpus_per_replica / engines,
                          mtp=mtp, advance=advance)
            lst.append(rep)
            env.process(rep.run())
    env.process(fleet.arrivals(requests))
    env.run()
    stuck = sum(len(r.running) + len(r.waiting) + len(r.held) + len(r.incoming) for r in fleet.replicas)
    if stuck or fleet.in_system:
        raise RuntimeError(f"{fleet.in_system} requests never finished ({stuck} still queued or running)")
    sim_s = env.now
    summary = summarize(fleet, sim_seconds=sim_s, gpus=setup.gpus, slo_ttft_s=sv.slo_ttft_s, slo_tpot_s=sv.slo_tpot_s)
    if summary["little_law_relative_error"] > LITTLE_TOLERANCE:  # checked on every run: an accounting bug
        raise RuntimeError(f"Little's law off by {100 * summary['little_law_relative_error']:.2f} %: "
                           f"mean in system {summary['mean_requests_in_system']:.6g}")
    wall = time.perf_counter() - t0
    evals = sum(getattr(t.fn, "evaluations", len(t.memo)) for t in timers)
    res = ServeResult(summary, fleet.records, fleet.samples, wall, sum(r.steps for r in fleet.replicas), evals,
                      transfer.total_bytes if transfer else 0)
    res.summary["wall_s"] = wall
    res.summary["steps"] = res.steps
    res.summary["replicas"] = {p.role: p.replicas for p in setup.pools}
    res.summary["layouts"] = {p.role: _layout_summary(p.parallelism) for p in setup.pools}
    res.summary["mtp"] = {"drafts": setup.serving.mtp, "acceptance": setup.serving.acceptance}
    res.summary.update(behaviour_summary(setup, fleet, timers))
    res.summary.update(offload_summary(fleet))
    if transfer is not None:
        res.summary["transfer_bytes"] = transfer.total_bytes
        res.summary["transfers"] = transfer.transfers
    return res


def offload_summary(fleet) -> dict:
    """The hit rate by tier (the GPU share: hits a GPU-only lookup found at first admission; the host share:
    beyond that, restored from host memory) and what the host tiers of all engines moved (bytes; the links'
    seconds, summed over engines); only the GPU share without a tier."""
    inp = fleet.input_tokens
    host, ssd = fleet.lower_hit_tokens
    out = {"token_hit_rate_gpu": (fleet.hit_tokens - host - ssd) / inp if inp else 0.0}
    caches = [r.cache for r in fleet.replicas if r.cache.offload is not None]
    if not caches:
        return out
    levels = [lvl for c in caches for lvl in c.offload.levels if lvl.name == "host"]
    out.update(token_hit_rate_host=host / inp if inp else 0.0,
               host_pool_bytes_per_engine=caches[0].cfg.host_capacity_bytes,
               host_restore_bytes=sum(lvl.restored_bytes for lvl in levels),
               host_restore_s=sum(lvl.restore_s for lvl in levels),
               host_demoted_bytes=sum(lvl.demoted_bytes for lvl in levels),
               host_evicted_bytes=sum(lvl.evicted_bytes for lvl in levels),
               requests_restored=sum(c.stats.restores for c in caches),
               restore_wait_s_total=sum(c.stats.restore_wait_s for c in caches))
    return out


def behaviour_summary(setup: ServeSetup, fleet, timers: list) -> dict:
    """What the fleet did that a reader must know to trust the figures: the router's spread (and the common
    prefix the prefix-aware router ignored), the batches in flight per replica of each pool, Sarathi's budget
    floor, and `warnings` (one sentence each) when pp micro-batches are off or the TPOT target is unreachable."""
    sv = setup.serving
    warnings = [p.note for p in setup.pools if p.note]
    sarathi = None
    if sv.engine.scheduler == "sarathi":
        floors = [t.floor for t in timers]
        sarathi = floors[0].merged(floors[1:]).summary()
        if sarathi["tpot_unreachable"]:
            warnings.append(sarathi_sentence(sarathi))
    return {"router": fleet.router_summary(), "batches_in_flight": {p.role: p.pp_engines for p in setup.pools},
            "sarathi": sarathi, "warnings": warnings}


def sarathi_sentence(s: dict) -> str:
    """The one line that says Sarathi's TPOT target cannot be met (`s`: `SarathiFloor.summary()`)."""
    lo, hi = s["floor_step_s_min"], s["floor_step_s_max"]
    span = f"{lo:.4g} s" if math.isclose(lo, hi, rel_tol=1e-3) else f"{lo:.4g}-{hi:.4g} s"
    return (f"sarathi: the TPOT target {s['slo_tpot_s']:.4g} s is unreachable in {s['floor_steps']:,} of "
            f"{s['budget_decisions']:,} steps with prefill to schedule: the prefill budget fell to its floor of "
            f"{s['floor_budget_tokens']:,} tokens, where a step still takes {span} (raise --slo-tpot, or use a "
            "faster layout)")


def mtp_options(sv) -> tuple[int, float]:
    """(draft tokens per decode step, expected tokens a decode advances per step) of a serving section:
    `k3sim.decode.mtp.accepted_tokens_per_step` (the one formula, shared with `k3sim decode`); (0, 1.0) off."""
    if not sv.mtp:  # the schema requires an acceptance with mtp >= 1 (configs.serving.ServingConfig)
        return 0, 1.0
    from k3sim.decode.mtp import accepted_tokens_per_step

    return sv.mtp, accepted_tokens_per_step(sv.mtp, sv.acceptance)


def _engines_per_replica(pool: PoolSpec):
    """pp engines of 1/pp of the pool when `pool.pp_engines` (each batch still passes every stage, so a step
    lasts the sum of the stages; pp batches in flight keep every stage busy when the stages are balanced,
    the decode model's cycle max(sum, pp x busiest stage)); else one engine with the whole pool."""
    import dataclasses

    pp = pool.pp_engines
    if pp == 1:
        return 1, pool.cache
    cfg = pool.cache
    if cfg.capacity_bytes is not None:
        # the engines share the replica's GPUs: each its 1/pp of the pool, of the host tier and of the host links
        host = {"host_capacity_bytes": cfg.host_capacity_bytes / pp,
                "host_bandwidth_bytes_per_s": cfg.host_bandwidth_bytes_per_s / pp} if cfg.host_capacity_bytes else {}
        cfg = dataclasses.replace(cfg, capacity_bytes=cfg.capacity_bytes / pp, **host)
        if cfg.num_pages < cfg.min_pages_one_request():
            raise InputError(f"a 1/{pp} share of the pool holds {cfg.num_pages} pages; one request needs "
                             f"{cfg.min_pages_one_request()}", source="serving.engine.pp_microbatches")
    return pp, cfg


_STEP_FNS: dict = {}  # (model, hardware, layout) -> fast step cost: shared by runs of one process (and forks)


def _step_fn(setup: ServeSetup, pool: PoolSpec):
    from k3sim.serving.stepcost import step_seconds_for

    mtp = mtp_options(setup.serving)[0]
    key = (id(setup.model), id(setup.hw), pool.parallelism.model_dump_json(), setup.gpus_per_node, mtp)
    fn = _STEP_FNS.get(key)
    if fn is None:
        fn = _STEP_FNS[key] = step_seconds_for(setup.model, setup.hw, pool.parallelism,
                                               gpus_per_node=setup.gpus_per_node, mtp=mtp)
    return fn


_SWEEP: dict = {}  # what sweep workers read (set before the pool forks)


def _sweep_point(rate: float) -> dict:
    st = _SWEEP
    res = simulate(st["setup"], st["requests"](rate), sample_interval_s=st["sample_interval_s"])
    s = res.summary
    sarathi = s["sarathi"] or {}
    return {"arrival_rate": rate, **{k: v for k, v in s.items() if not isinstance(v, (dict, list)) and k != "sarathi"},
            "sarathi_tpot_unreachable": bool(sarathi.get("tpot_unreachable", False))}


def sweep_rates(setup: ServeSetup, requests_at: Callable[[float], Iterable], rates: list[float], *,
                processes: int | None = None, sample_interval_s: float = 10.0, warm: Iterable | None = None,
                progress: Callable[[int, int], None] | None = None):
    """One simulation per arrival rate (`requests_at(rate)` gives the stream), on `processes` forked workers
    (default one per core, never more than rates; `k3sim.procs.ProcessPool`: they ignore Ctrl-C and SIGTERM,
    the parent kills them on any way out). `warm`: a short stream simulated first in this process, so the
    step-cost tables every worker needs are computed once and inherited. `progress(done, total)`: called as
    each rate finishes (the rows do not depend on it). Returns a DataFrame by rate."""
    import pandas as pd

    from k3sim.procs import ProcessPool, worker_count

    if warm is not None:
        simulate(setup, warm, sample_interval_s=sample_interval_s)
    _SWEEP.update(setup=setup, requests=requests_at, sample_interval_s=sample_interval_s)
    procs = worker_count(processes, len(rates))
    rows: list = []
    if procs <= 1:
        for r in rates:
            rows.append(_sweep_point(r))
            if progress is not None:
                progress(len(rows), len(rates))
    else:
        with ProcessPool(procs) as pool:
            for row in pool.imap_unordered(_sweep_point, rates):
                rows.append(row)
                if progress is not None:
                    progress(len(rows), len(rates))
    return pd.DataFrame(rows).sort_values("arrival_rate").reset_index(drop=True)


def check_trace(trace: str | Path, hash_block_tokens: int, *, rereads: bool = False,
                limit: int | None = None) -> None:
    """What can be known of a trace before the run: the cache's hash block fits the trace's ids, and something
    readable is at the path (`k3sim.reader.probe`: a missing file, a directory or a device is one line here).
    A single run validates the trace while it consumes it (`request_source`), in one pass, so a pipe works.
    `rereads` (a rate sweep replays the trace once per rate): a pipe is refused, and a file, read several
    times anyway, is validated here first, so a bad line stops the sweep before any simulation."""
    from k3sim.prefix_cache.setup import check_trace_granularity
    from k3sim.reader import probe
    from k3sim.workloads.mooncake import read_mooncake

    check_trace_granularity(hash_block_tokens, "serving.engine.hash_block_tokens")
    info = probe(trace, source=f"--trace {trace}", what="Mooncake JSONL trace")
    if not rereads:
        return
    if not info.rereadable:
        raise InputError("is a pipe, which can be read only once, and --sweep-rate replays the trace once per "
                         "rate: save it to a file first (e.g. cat ... > trace.jsonl)", source=f"--trace {trace}")
    for _ in read_mooncake(trace, strict=True, limit=limit, require_requests=True):
        pass


def request_source(*, trace: str | Path | None, workload: str | None, n_requests: int, seed: int,
                   arrival: str, cv: float, limit: int | None,
                   time_scale: float | None = None) -> Callable[[float | None], Iterable]:
    """A function of the arrival rate (None: the trace's or generator's own times, multiplied by `time_scale`
    when given) giving a fresh request stream: a Mooncake trace (streamed), a seeded synthetic workload, or
    the streamed synthetic generator. A rate replaces the own times with a Poisson / gamma process."""
    from k3sim.serving.arrivals import check_time_scale, retime, synthetic_stream, time_scaled

    if time_scale is not None:
        check_time_scale(time_scale)

    if (trace is None) == (workload is None):
        raise InputError("give exactly one of --trace FILE or --workload NAME", source="--trace")

    def base(rate: float | None):
        if trace is not None:
            from k3sim.workloads.mooncake import read_mooncake

            # validated while consumed (one pass: a pipe works); no valid request at all is an error at its end
            return read_mooncake(trace, strict=True, limit=limit, require_requests=True)
        if workload == "stream":
            return synthetic_stream(n_requests, seed=seed, rate=rate or 10.0)
        from k3sim.workloads.synthetic import synthetic_workload

        reqs = synthetic_workload(workload, seed, n_requests)
        return reqs[:limit] if limit else reqs

    def at(rate: float | None):
        if rate is None:
            return base(None) if time_scale is None else time_scaled(base(None), time_scale)
        if time_scale is not None:
            raise InputError("keeps the trace's own timing, scaled; an arrival rate replaces that timing with a "
                             "Poisson or gamma process: give one of the two", source="--time-scale")
        kind = "poisson" if arrival == "trace" else arrival
        return retime(base(rate), kind, rate, seed=seed, cv=cv)

    return at


@dataclass(frozen=True)
class TraceSample:
    """The requests a serving sweep point simulates when the user gives a trace: the first `limit` requests of
    the Mooncake trace at `path` (absolute: a worker process or Dask worker reads it, as it reads the
    scenario), at their own times x `time_scale`, or at a Poisson `arrival_rate` drawn with `seed`.
    Picklable; `stream()` is a fresh request stream each call (the trace is streamed, never held)."""

    path: str
    limit: int | None = None
    time_scale: float | None = None
    arrival_rate: float | None = None
    seed: int = 0

    def stream(self) -> Iterable:
        src = request_source(trace=self.path, workload=None, n_requests=1, seed=self.seed, arrival="poisson",
                             cv=1.0, limit=self.limit, time_scale=self.time_scale)
        return src(self.arrival_rate)

    def describe(self) -> dict:
        """The sample as the sweep's JSON reports it."""
        return {"kind": "trace", "trace": self.path, "limit": self.limit, "time_scale": self.time_scale,
                "arrival_rate": self.arrival_rate}
