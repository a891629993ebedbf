"""`k3sim prefix-cache`: hit rate of a hybrid model's prefix cache on a Mooncake trace under the K3 design or
the way an engine does it (vLLM all / align, SGLang no / extra buffer, TensorRT-LLM periodic snapshots), one
configuration, a sweep, or the engine-policy report (`--engines`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer


def _ints(text: str, option: str) -> list[int]:
    from k3sim.configs.bounds import check_range
    from k3sim.errors import InputError

    out: list[int] = []
    for x in text.split(","):
        if not x.strip():
            continue
        try:
            v = float(x)  # "6144" or "6.144e3"
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v == int(v)):
            raise InputError(f"expected comma-separated integers, got '{x.strip()[:40]}'", source=option)
        out.append(int(check_range(int(v), "block_tokens", option, integer=True)))
    return out


def _capacities(text: str) -> list[float | None]:
    from k3sim.configs.bounds import check_range
    from k3sim.errors import InputError

    out: list[float | None] = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        if x in ("none", "unbounded", "inf"):
            out.append(None)
            continue
        try:
            value = float(x)
        except ValueError:
            raise InputError(f"expected bytes or 'none', got '{x[:40]}'", source="--capacities") from None
        out.append(check_range(value, "capacity_bytes", "--capacities"))
    return out


def _check_tp(model: Path, tp: int) -> None:
    """--tp splits the KDA heads (and sizes the pool per GPU): the one layout check, as memory and cp use it."""
    from k3sim.configs import Parallelism, check_layout, load_model
    from k3sim.errors import InputError

    try:
        check_layout(load_model(str(model)), Parallelism(tp=tp))
    except InputError as err:
        if err.field in ("tp", "parallelism.tp"):
            raise InputError(err.reason, source="--tp") from None
        raise


def _sweep_progress(enabled: bool, label: str = "prefix-cache sweep"):
    """(callback, context) for a rich progress bar on stderr (sweep configurations, or requests replayed); a
    no-op when stderr is not a terminal or --json is given (scripts read stdout, logs do not want bars)."""
    import contextlib
    import sys

    if not enabled or not sys.stderr.isatty():
        return None, contextlib.nullcontext()
    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(console=Console(stderr=True), transient=True)
    task = bar.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update, bar


def register(app: typer.Typer) -> None:
    """Registers the command. Over 100 lines, with the command it defines: a typer command's signature is its
    option list (one parameter per option, as typer reads them); the body stays short."""
    from k3sim.commands.options import MODEL_SET

    @app.command("prefix-cache")
    def prefix_cache(
        model_set: list[str] = MODEL_SET,  # noqa: ARG001 - read by the loader (k3sim.configs.overrides)
        trace: Optional[Path] = typer.Option(None, "--trace", help="Mooncake JSONL trace (timestamp ms, lengths, hash_ids)"),
        workload: Optional[str] = typer.Option(None, "--workload",
                                               help="synthetic token-level workload instead of a trace: "
                                                    "chat | system-prompts | agent | rag"),
        seed: int = typer.Option(0, "--seed", help="synthetic workload seed"),
        n_requests: int = typer.Option(1000, "--requests", help="synthetic workload size (about N requests)"),
        model: Path = typer.Option(Path("models/kimi-k3.yaml"), "--model", help="model YAML or HF config.json"),
        policy: Optional[str] = typer.Option(
            None, "--policy", help="coarse | decoupled | full-attention (the K3 study, blocks as given), or an "
                                   "engine's way: vllm-all | vllm-align | sglang-no-buffer | sglang-extra-buffer | "
                                   "trtllm-periodic | k3 | none (blocks by its rule) [default: decoupled, or "
                                   "full-attention for a model without recurrent layers]"),
        hash_block: int = typer.Option(512, "--hash-block", help="hash block (tokens); coarse uses the physical block"),
        physical_block: Optional[int] = typer.Option(
            None, "--physical-block", help="physical block = page (tokens) [default: 6144 for coarse and decoupled, the hash "
            "block for full-attention, the engine's rule for an engine policy]"),
        snapshot_interval: Optional[int] = typer.Option(
            None, "--snapshot-interval", help="trtllm-periodic: a state snapshot every N tokens (TensorRT-LLM "
            "periodic_snapshot_interval) [default: 256, TensorRT-LLM's K3 example]"),
        capacity_bytes: Optional[float] = typer.Option(None, "--capacity-bytes", help="pool bytes; omit = unbounded"),
        host_pool_bytes: float = typer.Option(
            0.0, "--host-pool-bytes", help="host-memory tier under the pool, bytes per GPU as --capacity-bytes (0: "
            "none): what the pool evicts moves there (LRU), a hit there waits for its restore over the host link "
            "of --step-scenario's hardware"),
        ssd_pool_bytes: float = typer.Option(0.0, "--ssd-pool-bytes", help="SSD tier under the host tier, bytes "
                                             "per GPU (0: none); needs --ssd-bytes-per-s"),
        ssd_bytes_per_s: Optional[float] = typer.Option(None, "--ssd-bytes-per-s", help="SSD read bandwidth per "
                                                        "GPU (bytes/s; no default: it depends on the drives)"),
        kda_groups: Optional[int] = typer.Option(None, "--kda-groups", help="KDA cache groups (default KDA/MLA layers)"),
        tp: int = typer.Option(1, "--tp", help="TP ranks: sizes and capacity per GPU (KDA heads split, MLA replicated)"),
        retention_interval: int = typer.Option(0, "--retention-interval",
                                               help="decoupled: also keep a checkpoint every N tokens (0: off)"),
        eviction: str = typer.Option("lru", "--eviction",
                                     help="lru | flop-aware (Marconi: recency + alpha x prefill FLOP saved per byte)"),
        eviction_alpha: Optional[float] = typer.Option(None, "--eviction-alpha",
                                                       help="flop-aware: weight of FLOP efficiency [default: 1]"),
        token_budget: int = typer.Option(8192, "--token-budget", help="tokens per scheduling step"),
        max_running: int = typer.Option(256, "--max-running"),
        tokens_per_s: Optional[float] = typer.Option(
            None, "--tokens-per-s", help="step cost override: tokens per second (what-if knob) [default: derived "
            "from the step model of --step-scenario]"),
        step_overhead_s: Optional[float] = typer.Option(
            None, "--step-overhead-s", help="step cost override: fixed seconds per step [default: derived]"),
        step_scenario: Path = typer.Option(Path("scenarios/default.yaml"), "--step-scenario",
                                           help="scenario whose hardware and layout price each step"),
        limit: Optional[int] = typer.Option(None, "--limit", help="replay only the first N requests"),
        strict: bool = typer.Option(False, "--strict", help="stop at the first malformed trace line (exit 2)"),
        sweep: bool = typer.Option(False, "--sweep", help="sweep policies x hash blocks x physical blocks x capacities"),
        policies: str = typer.Option("coarse,decoupled,full-attention", "--policies"),
        hash_blocks: str = typer.Option("512", "--hash-blocks"),
        physical_blocks: str = typer.Option("512,1024,2048,4096,6144", "--physical-blocks"),
        capacities: str = typer.Option("none,64e9,256e9,1e12,4e12", "--capacities", help="bytes; 'none' = unbounded"),
        processes: Optional[int] = typer.Option(None, "--processes",
                                                help="sweep workers (default: one per core; at most one per configuration)"),
        out: Optional[Path] = typer.Option(None, "--out", help="--sweep output directory: new, empty or a previous "
                                           "prefix-cache sweep output [default: ./k3sim-out/prefix-cache/]"),
        name: Optional[str] = typer.Option(None, "--name", help="--sweep file prefix (default: trace file stem)"),
        engines: bool = typer.Option(False, "--engines", help="the engine-policy report: every engine policy on "
                                     "Qwen3-Next, Nemotron-H and K3, both shipped traces, into --out "
                                     "(engines.md, engines.csv) [default --out: ./k3sim-out/prefix-cache/, beside the sweeps]"),
        offload_report: bool = typer.Option(False, "--offload-report", help="the offload-tier report: a host "
                                            "tier of 0-1 TB per GPU under K3's and Qwen3-Next's H200 pools on the "
                                            "conversation trace, serve and replay, into --out (offload.md, "
                                            "offload.csv) [default --out: ./k3sim-out/prefix-cache/]"),
        json_out: bool = typer.Option(False, "--json", help="print JSON (SI units)"),
    ) -> None:
        """Prefix-cache hit rate for a trace under the K3 design's policies or the engines' own."""
        from k3sim.commands.options import PREFIX_CACHE, check
        from k3sim.errors import InputError
        from k3sim.files import project_path
        from k3sim.prefix_cache.setup import make_config
        from k3sim.serving.replay import SchedulerConfig

        if offload_report:
            check(_report_mode_rules("--offload-report", OFFLOAD_REPORT_OPTIONS, "k3sim.serving.offload_report"))
            _offload_report(out, limit=limit, json_out=json_out)
            return
        if engines:
            check(_engines_mode_rules())
            _engines_report(out, limit=limit, processes=processes, capacities=capacities, json_out=json_out,
                            tokens_per_s=tokens_per_s, step_overhead_s=step_overhead_s)
            return
        if (trace is None) == (workload is None):
            raise InputError("give exactly one of --trace FILE or --workload NAME", source="--trace")
        check(PREFIX_CACHE + _engine_rules())  # every option given changes the result (k3sim.commands.options)
        out, trace = _check_out_and_trace(out, name, sweep, trace)
        _check_numbers(token_budget=token_budget, max_running=max_running, hash_block=hash_block,
                       physical_block=physical_block, tp=tp, kda_groups=kda_groups,
                       retention_interval=retention_interval, capacity_bytes=capacity_bytes,
                       tokens_per_s=tokens_per_s, step_overhead_s=step_overhead_s, processes=processes,
                       limit=limit, n_requests=n_requests, workload=workload, snapshot_interval=snapshot_interval,
                       host_pool_bytes=host_pool_bytes, ssd_pool_bytes=ssd_pool_bytes, ssd_bytes_per_s=ssd_bytes_per_s)
        _check_tp(model, tp)
        from k3sim.configs import load_model
        from k3sim.configs.kinds import MIXERS

        loaded = load_model(str(project_path(model)))
        if policy is None:  # as `serve` does: the state policies need recurrent layers to place state
            policy = "decoupled" if any(MIXERS[k].recurrent for k in loaded.mixer_kinds) else "full-attention"
        sched = SchedulerConfig(token_budget, max_running)
        cfg = make_config(model, policy, hash_block, physical_block, capacity_bytes, kda_groups,
                          retention_interval, tp, eviction=eviction, eviction_alpha=eviction_alpha,
                          snapshot_interval_tokens=snapshot_interval, model=loaded)
        if not sweep:
            _check_budget(cfg, token_budget)
        if host_pool_bytes or ssd_pool_bytes:
            cfg = _with_offload(cfg, step_scenario, host_pool_bytes, ssd_pool_bytes, ssd_bytes_per_s)
        cost = _step_cost(model, step_scenario, tokens_per_s, step_overhead_s, token_budget)
        if sweep:
            engine = _sweep_engine(model, loaded, kda_groups=kda_groups, tp=tp, eviction=eviction,
                                   eviction_alpha=eviction_alpha, snapshot_interval=snapshot_interval,
                                   token_budget=token_budget)
            _prefix_cache_sweep(trace, cfg, sched, cost, policies=policies, hash_blocks=hash_blocks,
                                physical_blocks=physical_blocks, capacities=capacities, out=out, name=name,
                                strict=strict, limit=limit, processes=processes, workload=workload, seed=seed,
                                n_requests=n_requests, json_out=json_out, engine=engine)
            return
        _prefix_cache_replay(trace, cfg, sched, cost, strict=strict, limit=limit, workload=workload, seed=seed,
                             n_requests=n_requests, json_out=json_out, tokens_per_s=tokens_per_s,
                             step_overhead_s=step_overhead_s, step_scenario=step_scenario)


def _check_out_and_trace(out, name, sweep: bool, trace):
    """(--out, --trace) resolved: files only with --sweep (its directory checked before the trace is read), the
    trace found from any directory and probed now, before any work (read once later, while it is replayed: a
    pipe works)."""
    from k3sim.errors import InputError
    from k3sim.files import project_path

    for opt, v in (("--out", out), ("--name", name)):
        if v is not None and not sweep:
            raise InputError("only --sweep writes files; add --sweep or drop it", source=opt)
    if sweep:  # an --out k3sim may not write is refused before the trace is read
        from k3sim.files import check_output_dir, default_out
        from k3sim.serving.prefix_cache_run import KIND

        out = default_out("prefix-cache") if out is None else out
        check_output_dir(out, kind=KIND)
    if trace is not None:
        from k3sim.reader import probe

        trace = project_path(trace)  # data/traces/... works from any directory
        # refused if nothing readable is there (missing, a directory, a device)
        probe(trace, source=f"--trace {trace}", what="Mooncake JSONL trace")
    return out, trace


def _sweep_engine(model, loaded, *, kda_groups, tp, eviction, eviction_alpha, snapshot_interval, token_budget):
    """The builder of a sweep's engine policies (`setup.grid`): each by its rules, on these options' model."""
    from k3sim.prefix_cache.setup import make_config

    def engine(pol, hb, pb, cap):
        c = make_config(model, pol, hb, pb, cap, kda_groups, 0, tp, eviction=eviction, eviction_alpha=eviction_alpha,
                        model=loaded, snapshot_interval_tokens=snapshot_interval if pol == "trtllm-periodic" else None)
        _check_budget(c, token_budget, "--policies")
        return c

    return engine


def _check_numbers(*, token_budget, max_running, hash_block, physical_block, tp, kda_groups, retention_interval,
                   capacity_bytes, tokens_per_s, step_overhead_s, processes, limit, n_requests, workload,
                   snapshot_interval=None, host_pool_bytes=0.0, ssd_pool_bytes=0.0, ssd_bytes_per_s=None) -> None:
    """Every number option inside bounds.py's range for its kind, refused before the step model is built
    (the slow part), so a typo costs no wait."""
    from k3sim.configs.bounds import check_range
    from k3sim.errors import InputError

    for opt, v, kind in (("--token-budget", token_budget, "tokens"), ("--max-running", max_running, "batch"),
                         ("--hash-block", hash_block, "block_tokens"),
                         ("--tp", tp, "parallel")):
        check_range(v, kind, opt, integer=True)
    if physical_block is not None:
        check_range(physical_block, "block_tokens", "--physical-block", integer=True)
    if snapshot_interval is not None:
        check_range(snapshot_interval, "block_tokens", "--snapshot-interval", integer=True)
    if kda_groups is not None:
        check_range(kda_groups, "layers", "--kda-groups", integer=True)
    if retention_interval:
        check_range(retention_interval, "tokens", "--retention-interval", integer=True)
    if capacity_bytes is not None:
        check_range(capacity_bytes, "capacity_bytes", "--capacity-bytes")
    if tokens_per_s is not None:
        check_range(tokens_per_s, "rate", "--tokens-per-s")
    if step_overhead_s is not None:
        check_range(step_overhead_s, "seconds", "--step-overhead-s")
    if processes is not None:  # bounds.py's range; at most one worker per configuration is started
        check_range(processes, "workers", "--processes", integer=True)
    if limit is not None and limit <= 0:
        raise InputError(f"must be positive (got {limit})", source="--limit")
    from k3sim.prefix_cache.offload import check_tier_bytes

    check_tier_bytes(host_pool_bytes, "--host-pool-bytes")
    check_tier_bytes(ssd_pool_bytes, "--ssd-pool-bytes")
    if ssd_bytes_per_s is not None:
        check_range(ssd_bytes_per_s, "bandwidth", "--ssd-bytes-per-s")
    if n_requests != 1000 and workload is None:
        raise InputError("sizes a synthetic --workload only; a trace is replayed whole (use --limit)",
                         source="--requests")


# what the engine report (--engines) reads of the options; every other option is refused with it
ENGINES_OPTIONS = ("--out", "--limit", "--processes", "--capacities", "--json", "--engines", "--tokens-per-s",
                   "--step-overhead-s")


def _engine_rules() -> list:
    """Rules of the engine-policy and offload options (beside `options.PREFIX_CACHE`)."""
    from k3sim.commands.options import only_when, requires

    def periodic(f) -> bool:
        return f.value("--policy") == "trtllm-periodic" or (
            f.has("--sweep") and "trtllm-periodic" in str(f.value("--policies") or ""))

    return [only_when("--snapshot-interval", periodic, why="sets TensorRT-LLM's snapshot interval, and no "
                      "trtllm-periodic replay is run", fix="add --policy trtllm-periodic (or it to --policies), "
                      "or remove --snapshot-interval"),
            *[only_when(o, lambda f: not f.has("--sweep"), why="adds an offload tier to one replay; a sweep varies "
                        "the GPU pool alone", fix=f"remove --sweep, or {o}") for o in OFFLOAD_OPTIONS],
            requires("--ssd-bytes-per-s", "--ssd-pool-bytes", why="is the SSD tier's read bandwidth, and there is no "
                     "SSD tier", fix="add --ssd-pool-bytes, or remove --ssd-bytes-per-s")]


OFFLOAD_OPTIONS = ("--host-pool-bytes", "--ssd-pool-bytes", "--ssd-bytes-per-s")


def _with_offload(cfg, step_scenario, host_pool_bytes: float, ssd_pool_bytes: float, ssd_bytes_per_s):
    """`cfg` with its offload tiers: the host tier restores at the host link of the step scenario's hardware
    (`offload.host_link`: the profile's datasheet peak at its measured share); an SSD tier at the given read
    bandwidth, no faster than that link, which its bytes also cross."""
    import dataclasses

    from k3sim.configs import resolve_scenario
    from k3sim.errors import InputError
    from k3sim.files import project_path
    from k3sim.prefix_cache.offload import host_link
    from k3sim.prefix_cache.setup import OPTIONS, named_options

    _, _, hw = resolve_scenario(project_path(step_scenario))
    link = host_link(hw, source="--host-pool-bytes" if host_pool_bytes else "--ssd-pool-bytes")
    kw: dict = {}
    if host_pool_bytes:
        kw.update(host_capacity_bytes=host_pool_bytes, host_bandwidth_bytes_per_s=link.achieved_bytes_per_s)
    if ssd_pool_bytes:
        if ssd_bytes_per_s is None:
            raise InputError("an SSD tier needs its read bandwidth per GPU: add --ssd-bytes-per-s (no default: it "
                             "depends on the drives and how many GPUs share them)", source="--ssd-pool-bytes")
        kw.update(ssd_capacity_bytes=ssd_pool_bytes,
                  ssd_bandwidth_bytes_per_s=min(ssd_bytes_per_s, link.achieved_bytes_per_s))
    with named_options(OPTIONS):
        return dataclasses.replace(cfg, **kw)


def _engines_mode_rules() -> list:
    """--engines replays its own models, traces and policies: the options that choose them are refused."""
    from k3sim.commands.options import given_options, only_when

    given, _ = given_options()
    other = tuple(o for o in given if o not in ENGINES_OPTIONS)
    return [only_when(other, lambda f: False, why="has no effect with --engines, which replays its own models, "
                      "traces and policies (k3sim.serving.engines_report)",
                      fix="remove it (--engines takes --out, --limit, --processes, --capacities, --json, and a "
                          "step clock --tokens-per-s with --step-overhead-s)")]


OFFLOAD_REPORT_OPTIONS = ("--out", "--limit", "--json", "--offload-report")


def _report_mode_rules(flag: str, allowed: tuple[str, ...], module: str) -> list:
    """A report mode replays its own models, traces and configurations: the options that choose them are
    refused."""
    from k3sim.commands.options import given_options, only_when

    given, _ = given_options()
    other = tuple(o for o in given if o not in allowed)
    return [only_when(other, lambda f: False, why=f"has no effect with {flag}, which runs its own models, trace "
                      f"and tiers ({module})", fix=f"remove it ({flag} takes {', '.join(allowed[:-1])})")]


def _offload_report(out, *, limit, json_out: bool) -> None:
    """--offload-report: the host-tier runs of `serving.offload_report`, written under --out."""
    from k3sim.files import check_output_dir, default_out
    from k3sim.output import print_json, print_kv
    from k3sim.serving.offload_report import KIND, write_offload_report

    out = default_out("prefix-cache") if out is None else out
    check_output_dir(out, kind=KIND)
    progress, bar = _sweep_progress(not json_out, "prefix-cache offload tiers")
    with bar:
        rep = write_offload_report(out, limit=limit, progress=progress)
    if json_out:
        print_json({"files": rep.files, "wall_s": rep.wall_s, "rows": rep.rows})
        return
    print_kv("prefix-cache offload tiers", [*rep.files.items(), ("runs", len(rep.rows)),
                                            ("wall", f"{rep.wall_s:.1f} s")])


def _check_budget(cfg, token_budget: int, source: str = "--policy") -> None:
    """vLLM's align mode schedules whole blocks before a prompt's last block boundary: a budget below one block
    would never schedule a chunk (scheduler `_mamba_block_aligned_split`)."""
    from k3sim.errors import InputError

    if cfg.mechanism == "step-end" and token_budget < cfg.physical_block_tokens:
        raise InputError(f"{cfg.policy}'s {cfg.physical_block_tokens}-token block does not fit a "
                         f"{token_budget}-token step: align mode schedules whole blocks; raise --token-budget to at "
                         f"least {cfg.physical_block_tokens}", source="--token-budget")


def _engines_report(out, *, limit, processes, capacities: str, json_out: bool, tokens_per_s=None,
                    step_overhead_s=None) -> None:
    """--engines: every engine policy on the report's models and traces, written under --out; each model's step
    clock from its replica's step model unless both line parameters are given (one clock for all)."""
    from k3sim.errors import InputError
    from k3sim.files import check_output_dir, default_out
    from k3sim.output import print_json, print_kv
    from k3sim.serving.engines_report import CAPACITIES, KIND, write_engines_report
    from k3sim.serving.replay import StepCost

    if (tokens_per_s is None) != (step_overhead_s is None):
        raise InputError("with --engines a clock is both --tokens-per-s and --step-overhead-s (one line for every "
                         "model); give both, or neither for each model's step model",
                         source="--tokens-per-s" if tokens_per_s is not None else "--step-overhead-s")
    cost = StepCost(tokens_per_s, step_overhead_s) if tokens_per_s is not None else None

    out = default_out("prefix-cache") if out is None else out
    check_output_dir(out, kind=KIND)
    from k3sim.commands.options import given_options

    given, _ = given_options()
    caps = _capacities(capacities) if "--capacities" in given else list(CAPACITIES)
    progress, bar = _sweep_progress(not json_out, "prefix-cache engine policies")
    with bar:
        rep = write_engines_report(out, capacities=caps, limit=limit, processes=processes, progress=progress,
                                   cost=cost)
    if json_out:
        print_json({"files": rep.files, "wall_s": rep.wall_s, "rows": rep.rows, "blocks": rep.blocks})
        return
    print_kv("prefix-cache engine policies", [*rep.files.items(), ("replays", sum(1 for r in rep.rows
                                                                           if "token_hit_rate" in r)),
                                              ("wall", f"{rep.wall_s:.1f} s")])


def _prefix_cache_sweep(trace, cfg, sched, cost, *, policies, hash_blocks, physical_blocks, capacities, out, name,
                        strict, limit, processes, workload, seed, n_requests, json_out: bool, engine=None) -> None:
    """--sweep: one replay per policy x hash block x physical block x capacity (in worker processes), written
    under --out and printed as a table (or JSON)."""
    from k3sim.output import human_bytes, print_json, print_kv, print_table
    from k3sim.serving.prefix_cache_run import sweep_report

    pols = [p.strip() for p in policies.split(",") if p.strip()]
    progress, bar = _sweep_progress(not json_out)
    grid_hash, grid_phys = _ints(hash_blocks, "--hash-blocks"), _ints(physical_blocks, "--physical-blocks")
    grid_caps = _capacities(capacities)
    with bar:
        rep = sweep_report(trace, cfg, policies=pols, hash_blocks=grid_hash, physical_blocks=grid_phys,
                           capacities=grid_caps, out_dir=out, name=name, strict=strict, limit=limit,
                           sched=sched, cost=cost, processes=processes, workload=workload, seed=seed,
                           n_requests=n_requests, progress=progress, engine=engine)
    if json_out:
        print_json({"files": rep.files, "trace_lines_skipped": rep.trace_lines_skipped,
                    "wall_s": rep.wall_s, "rows": rep.table})
        return
    t = rep.table
    print_table(f"prefix-cache sweep: {trace.name if trace else workload}",
                ["policy", "hash", "block", "capacity", "token hit %", "request hit %", "evictions"],
                [(r.policy, r.hash_block_tokens, r.physical_block_tokens,
                  "unbounded" if r.capacity_bytes != r.capacity_bytes else human_bytes(r.capacity_bytes),
                  f"{100 * r.token_hit_rate:.2f}", f"{100 * r.request_hit_rate:.2f}", r.evictions)
                 for r in t.itertuples()])
    print_kv("files", list(rep.files.items()))


def _prefix_cache_replay(trace, cfg, sched, cost, *, strict, limit, workload, seed, n_requests, json_out: bool,
                         tokens_per_s, step_overhead_s, step_scenario) -> None:
    """One replay of the trace or workload through the cache, then its hit rates and the step clock that
    timed it (from the options only when both line parameters were given)."""
    from k3sim.serving.prefix_cache_run import simulate

    progress, bar = _sweep_progress(not json_out, "replaying requests")
    with bar:
        res = simulate(trace, cfg, strict=strict, limit=limit, sched=sched, cost=cost, workload=workload,
                       seed=seed, requests=n_requests, progress=progress)
    step_clock = {"tokens_per_s": cost.tokens_per_s, "step_overhead_s": cost.step_overhead_s,
                  "source": "option" if tokens_per_s is not None and step_overhead_s is not None
                  else f"step model of {step_scenario}"}
    _print_replay(res, trace, workload, step_clock, json_out)


def _print_replay(res, trace, workload, step_clock: dict, json_out: bool) -> None:
    """The replay's result: every field as JSON, or the hit rates, sizes and evictions with the first
    malformed trace lines skipped."""
    from k3sim.output import human_bytes, print_json, print_kv

    if json_out:
        import dataclasses

        print_json({**dataclasses.asdict(res), "step_clock": step_clock})
        return
    print_kv(f"prefix cache: {trace.name if trace else workload} ({res.policy})", [
        ("step clock", f"{step_clock['step_overhead_s'] * 1e3:.2f} ms + tokens / {step_clock['tokens_per_s']:,.0f} "
                       f"tokens/s ({step_clock['source']})"),
        ("hash / physical block", f"{res.hash_block_tokens} / {res.physical_block_tokens} tokens"),
        ("capacity", "unbounded" if res.capacity_bytes is None else human_bytes(res.capacity_bytes)),
        ("page", f"{human_bytes(res.page_bytes)}; KDA state slot {res.kda_pages_per_group_state} page(s) x "
                 f"{res.num_kda_groups} groups"),
        ("one checkpoint (state of every group)", human_bytes(res.checkpoint_bytes)),
        ("requests (rejected)", f"{res.requests:,} ({res.requests_rejected})"),
        ("token hit rate (prompt tokens served from the cache)", f"{100 * res.token_hit_rate:.2f} %"),
        ("request hit rate (requests reusing >= 1 cached block)", f"{100 * res.request_hit_rate:.2f} %"),
        ("MLA-only token hit rate", f"{100 * res.mla_only_token_hit_rate:.2f} %"),
        ("prefill tokens saved", f"{res.prefill_tokens_saved:,}"),
        ("prefill FLOP saved", f"{res.prefill_flop_saved:.3g} ({100 * res.prefill_flop_saved_fraction:.2f} %)"),
        ("eviction", res.eviction),
        ("checkpoint bytes peak", human_bytes(res.checkpoint_bytes_peak)),
        *([("state pool peak (a pool of its own)", human_bytes(res.state_pool_bytes_peak))]
          if res.state_pool_bytes_peak else []),
        ("evictions (KV / KDA pages)", f"{res.evictions:,} ({res.evicted_kv_pages:,} / {res.evicted_kda_pages:,})"),
        *_offload_lines(res),
        *([("TTFT p50 / p99 (one replica, the trace's own times)", f"{res.ttft_p50_s:.3g} s / {res.ttft_p99_s:.3g} s")]
          if res.ttft_p50_s == res.ttft_p50_s else []),
        ("trace lines skipped", res.trace_lines_skipped),
    ])
    for p in res.extra.get("trace_problems", [])[:5]:
        print(f"skipped line {p['line']}: {p['reason']}")


def _offload_lines(res) -> list:
    """The replay's offload tiers: the hit rate by tier, what each restored and in how much link time."""
    from k3sim.output import human_bytes

    if not res.offload:
        return []
    lines = [("token hit rate: GPU / host / SSD", f"{100 * res.token_hit_rate_gpu:.2f} % / "
                                                 f"{100 * res.token_hit_rate_host:.2f} % / "
                                                 f"{100 * res.token_hit_rate_ssd:.2f} %")]
    for name, t in res.offload.items():
        lines.append((f"{name} tier", f"{human_bytes(t['capacity_bytes'])} at {t['bandwidth_bytes_per_s'] / 1e9:.4g} "
                                      f"GB/s; restored {human_bytes(t['restored_bytes'])} in {t['restore_s']:.3g} s, "
                                      f"evicted into it {human_bytes(t['demoted_bytes'])}, out of it "
                                      f"{human_bytes(t['evicted_bytes'])}"))
    lines.append(("requests that waited for a restore", f"{res.requests_restored:,} (mean wait "
                                                         f"{1e3 * res.restore_wait_s_mean:.3g} ms)"))
    return lines


def _step_cost(model_path, scenario, tokens_per_s, step_overhead_s, token_budget):
    """The replay's step clock: `ModelStepCost.line` of the scenario's replica (the step model `k3sim serve`
    prices every step with), unless both line parameters are given as a what-if."""
    from k3sim.configs import load_model
    from k3sim.files import project_path
    from k3sim.serving.replay import ModelStepCost, StepCost

    if tokens_per_s is not None and step_overhead_s is not None:
        return StepCost(tokens_per_s, step_overhead_s)
    msc = ModelStepCost.from_scenario(project_path(scenario), load_model(project_path(model_path)))
    return msc.line(token_budget, tokens_per_s=tokens_per_s, step_overhead_s=step_overhead_s)
