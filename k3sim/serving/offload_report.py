"""The offload-tier report (`k3sim prefix-cache --offload-report`): what a host-memory tier under the GPU pool
recovers of the conversation trace's prefix reuse, for Kimi K3 and Qwen3-Next on H200, with the GPU pool the
memory planner leaves per GPU and a host tier of 0, 64 GB, 256 GB and 1 TB per GPU (and an unbounded GPU pool
as the reference); `offload.md` and `offload.csv`.

Two views, each a run of a shipped command's code:
- serve: `k3sim serve` on the trace's own timing, a fleet of the model's replica layout sized so that it keeps up
  with the trace (K3: 4 replicas of TP8 x PP2 x EP8, 64 GPUs; Qwen3-Next: 1 of TP8 x EP8, 8 GPUs: modelling
  choices, the smallest fleets found not overloaded at host tier 0), SGLang's cache-aware router
  (`prefix-aware`); hit rate by tier and TTFT;
- replay: `k3sim prefix-cache`'s replay, one replica of that layout under the whole trace (the view the issue's
  "0-3 %" comes from: a replica that cannot keep up holds most of its pool for queued prompts), hit rate by tier.
Every figure is a simulation run here; the report states the host link and where its figure comes from.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from k3sim.files import atomic_write_text, output_dir

KIND, PART = "prefix-cache-sweep", "offload"  # beside the sweeps and engines.md of reports/prefix_cache
TRACE = "data/traces/conversation_trace.jsonl"
HARDWARE = "h200"
# per-GPU host tier sizes (bytes): 0 (today), 64 GB (where the curve starts), 256 GB (a DGX H200's 2 TB of system
# memory over its 8 GPUs, NVIDIA DGX H200 datasheet), 1 TB (a large-memory host or a pooled DRAM tier as Mooncake's)
HOST_SIZES: tuple[float, ...] = (0.0, 64e9, 256e9, 1e12)
# the replay's policy (hash block 512, `serve`'s page rule, run.default_physical_block): the K3 design, which keeps
# every recurrent kind's state (KDA, Gated DeltaNet); `serve` runs its own default per model (decoupled for K3;
# full-attention for Qwen3-Next: serve's policies place KDA state only, `run._check_mla_only_policy`)
POLICY = "decoupled"
# model -> (file, replica layout, replicas of the serving fleet); layouts as reports/prefix_cache/engines.md's
MODELS = {"kimi-k3": ("models/kimi-k3.yaml", {"tp": 8, "pp": 2, "ep": 8}, 4),
          "qwen3-next-80b-a3b": ("models/qwen3-next-80b-a3b.yaml", {"tp": 8, "pp": 1, "ep": 8}, 1)}
# the serving workload as scenarios/default.yaml states it (vLLM defaults: 8192-token chunk, 10 % workspace)
WORKLOAD = {"mode": "serve", "context_tokens": 131072, "prefill_chunk_tokens": 8192, "workspace_fraction": 0.10}


@dataclass
class OffloadReport:
    rows: list[dict]
    files: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0


def _scenario(tmp: Path, name: str, path: str, layout: dict, replicas: int) -> Path:
    """A serving scenario for the model's fleet (written to `tmp`: ServeSetup reads scenarios from files)."""
    import yaml

    from k3sim.files import project_path

    gpus = layout["tp"] * layout["pp"]
    doc = {"name": f"{name}-offload", "model": str(project_path(path)), "hardware": HARDWARE,
           "cluster": {"num_gpus": gpus * replicas, "gpus_per_node": 8}, "parallelism": layout,
           "workload": WORKLOAD, "serving": {"router": "prefix-aware"}}
    out = tmp / f"{name}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def serve_row(scenario: Path, name: str, host: float | None, *, trace: Path, limit: int | None) -> dict:
    """One `k3sim serve` run: the fleet of `scenario` with a per-GPU host tier of `host` bytes (None: an
    unbounded GPU pool instead, the reference)."""
    from k3sim.serving.run import ServeSetup, request_source, simulate

    setup = ServeSetup.from_scenario(scenario, host_pool_bytes=host or 0.0,
                                     pool_bytes="unbounded" if host is None else None)
    src = request_source(trace=trace, workload=None, n_requests=1, seed=0, arrival="poisson", cv=1.0, limit=limit)
    s = simulate(setup, src(None)).summary
    pool = setup.pools[0]
    keys = ("token_hit_rate", "token_hit_rate_gpu", "token_hit_rate_host", "ttft_p50_s", "ttft_p99_s",
            "tpot_p50_s", "throughput_requests_per_s", "overloaded", "host_restore_bytes", "host_restore_s",
            "host_demoted_bytes", "host_evicted_bytes", "requests_restored", "restore_wait_s_total", "requests",
            "gpus")
    row = {"view": "serve", "model": name, "host_pool_bytes_per_gpu": host, "gpu_pool": "unbounded" if host is None
           else "free HBM", "replicas": pool.replicas, "layout": _layout(pool.parallelism), "policy": pool.cache.policy,
           "pool_bytes_per_replica": pool.cache.capacity_bytes, **{k: s.get(k) for k in keys}}
    n = row["requests_restored"]
    row["restore_wait_s_mean"] = row["restore_wait_s_total"] / n if n else None
    return row


def _layout(par) -> str:
    return f"TP{par.tp} PP{par.pp} EP{par.ep}"


def replay_rows(name: str, path: str, layout: dict, hosts: Sequence[float], *, trace: Path,
                limit: int | None) -> list[dict]:
    """`k3sim prefix-cache`'s replay, one replica of `layout` under the trace: per GPU pool = the planner's free
    HBM (in the cache's units: one TP rank's share of every layer, the stage shares as `serve` sizes them), the
    host tier and host link in the same units, the step clock the replica's step model line (as `prefix-cache`
    draws it). Plus the unbounded GPU pool."""
    import dataclasses

    from k3sim.configs import Parallelism, load_hardware, load_model
    from k3sim.files import project_path
    from k3sim.prefix_cache.offload import host_link
    from k3sim.prefix_cache.setup import make_config
    from k3sim.serving.replay import ModelStepCost, SchedulerConfig, replay
    from k3sim.serving.run import default_physical_block, pool_capacity_bytes
    from k3sim.workloads.mooncake import read_mooncake

    model, hw = load_model(str(project_path(path))), load_hardware(HARDWARE)
    par = Parallelism(**layout)
    plan = dict(context_tokens=WORKLOAD["context_tokens"], prefill_chunk_tokens=WORKLOAD["prefill_chunk_tokens"],
                workspace_fraction=WORKLOAD["workspace_fraction"])
    cap = pool_capacity_bytes(model, hw, par, None, **plan)
    inv_share = pool_capacity_bytes(model, hw, par, 1.0, **plan)  # whole-model bytes per byte of one GPU
    link = host_link(hw, source="--offload-report")
    pb = default_physical_block(model, 512, par.tp, POLICY)
    base = make_config(path, POLICY, 512, pb, cap, tp=par.tp, model=model)
    sched = SchedulerConfig()
    cost = ModelStepCost(model, hw, **layout).line(sched.token_budget)
    offered = _offered_prompt_tokens_per_s(trace, limit)
    rows = []
    for host in (*hosts, None):
        if host is None:
            cfg = dataclasses.replace(base, capacity_bytes=None)
        elif host:
            cfg = dataclasses.replace(base, host_capacity_bytes=host * inv_share,
                                      host_bandwidth_bytes_per_s=link.achieved_bytes_per_s * inv_share)
        else:
            cfg = base
        res = replay(read_mooncake(trace, limit=limit), cfg, sched, cost)
        rows.append({"view": "replay", "model": name, "host_pool_bytes_per_gpu": host,
                     "gpu_pool": "unbounded" if host is None else "free HBM", "replicas": 1, "policy": POLICY,
                     "layout": _layout(par), "pool_bytes_per_replica": cfg.capacity_bytes,
                     "token_hit_rate": res.token_hit_rate, "token_hit_rate_gpu": res.token_hit_rate_gpu,
                     "token_hit_rate_host": res.token_hit_rate_host if host else None,
                     "ttft_p50_s": res.ttft_p50_s, "ttft_p99_s": res.ttft_p99_s,
                     "host_restore_bytes": res.host_restore_bytes if host else None,
                     "host_restore_s": res.host_restore_s if host else None,
                     "host_demoted_bytes": res.offload.get("host", {}).get("demoted_bytes") if host else None,
                     "host_evicted_bytes": res.offload.get("host", {}).get("evicted_bytes") if host else None,
                     "requests_restored": res.requests_restored if host else None,
                     "restore_wait_s_mean": res.restore_wait_s_mean if host else None,
                     "requests": res.requests, "gpus": par.gpus, "pool_bytes_peak": res.pool_bytes_peak,
                     "pool_bytes_peak_per_gpu": res.pool_bytes_peak / inv_share,
                     "mean_prompt_tokens": res.input_tokens / res.requests if res.requests else None,
                     "kv_bytes_per_token": cfg.mla_kv_bytes_per_token, "max_running": sched.max_running,
                     # the prompt tokens left to prefill arrive faster than the replica's clock prefills them
                     "overloaded": cost.tokens_per_s < offered * (1 - res.token_hit_rate),
                     "step_clock": f"{cost.step_overhead_s * 1e3:.2f} ms + tokens / {cost.tokens_per_s:,.0f} "
                                   "tokens/s"})
    return rows


def _offered_prompt_tokens_per_s(trace: Path, limit: int | None) -> float:
    """Prompt tokens per second the trace offers: their sum over the span of its arrivals."""
    from k3sim.workloads.mooncake import read_mooncake

    first = last = None
    tokens = 0
    for r in read_mooncake(trace, limit=limit):
        first = r.arrival_s if first is None else first
        last = r.arrival_s
        tokens += r.input_tokens
    return tokens / (last - first) if last is not None and last > first else math.inf


def _pct(v) -> str:
    return "-" if v is None or v != v else f"{100 * v:.1f}"


def _s(v) -> str:
    return "-" if v is None or v != v else (f"{v:.3g}" if v < 1000 else f"{v:,.0f}")


def _gb(v) -> str:
    return "-" if v is None or v != v else f"{v / 1e9:,.0f}"


def _host(v) -> str:
    if v is None:
        return "- (GPU unbounded)"
    return "0" if not v else f"{v / 1e12:g} TB" if v >= 1e12 else f"{v / 1e9:g} GB"


def _table(rows: list[dict], view: str) -> str:
    head = ("| model | policy | fleet | host tier per GPU | token hit % (GPU + host) | of which host % | TTFT p50 / p99 (s) | "
            "restored (GB) | host-link time (s) | requests restored (mean wait ms) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["view"] != view:
            continue
        fleet = f"{r['replicas']} x {r['layout']} ({r['gpus']} GPUs)"
        wait = r.get("restore_wait_s_mean")
        restored = "-" if r["requests_restored"] is None else (
            f"{r['requests_restored']:,} ({_s(1e3 * wait) if wait else '-'})")
        ttft = f"{_s(r['ttft_p50_s'])} / {_s(r['ttft_p99_s'])}"
        if r.get("overloaded"):
            ttft += " (overloaded)"
        lines.append(f"| {r['model']} | `{r['policy']}` | {fleet} | {_host(r['host_pool_bytes_per_gpu'])} | {_pct(r['token_hit_rate'])} "
                     f"| {_pct(r['token_hit_rate_host'])} | {ttft} | {_gb(r['host_restore_bytes'])} | "
                     f"{_s(r['host_restore_s'])} | {restored} |")
    return "\n".join(lines)


def _findings(rows: list[dict]) -> list[str]:
    """One sentence per model and view: the GPU pool alone, each host tier (its share of the gap to the unbounded
    pool; TTFT where the fleet keeps up), the unbounded reference."""
    out = []
    for view in ("serve", "replay"):
        for name in dict.fromkeys(r["model"] for r in rows):
            sel = [r for r in rows if r["view"] == view and r["model"] == name]
            zero = next((r for r in sel if r["host_pool_bytes_per_gpu"] == 0), None)
            unb = next((r for r in sel if r["host_pool_bytes_per_gpu"] is None), None)
            tiers = sorted((r for r in sel if r["host_pool_bytes_per_gpu"]), key=lambda r: r["host_pool_bytes_per_gpu"])
            if zero is None or unb is None or not tiers:
                continue
            gap = unb["token_hit_rate"] - zero["token_hit_rate"]
            steps = []
            for r in tiers:
                got = (r["token_hit_rate"] - zero["token_hit_rate"]) / gap if gap > 0 else math.nan
                text = f"{_host(r['host_pool_bytes_per_gpu'])} {_pct(r['token_hit_rate'])} % ({_pct(got)} % of the gap"
                if not zero.get("overloaded"):
                    text += f", TTFT p50 / p99 {_s(r['ttft_p50_s'])} / {_s(r['ttft_p99_s'])} s"
                steps.append(text + ")")
            head = (f"{view}, {name}: the GPU pool alone serves {_pct(zero['token_hit_rate'])} % of prompt tokens"
                    + ("" if zero.get("overloaded") else
                       f" (TTFT p50 / p99 {_s(zero['ttft_p50_s'])} / {_s(zero['ttft_p99_s'])} s)")
                    + f", an unbounded pool {_pct(unb['token_hit_rate'])} %; with a host tier per GPU of ")
            out.append(head + "; ".join(steps))
    return out


def _pinned_sentence(rows: list[dict]) -> str:
    """Why an overloaded replica's GPU pool alone finds little: what its running prompts reserve, from its rows."""
    r = next((r for r in rows if r["view"] == "replay" and r.get("overloaded") and r["host_pool_bytes_per_gpu"] == 0),
             None)
    if r is None:
        return ""
    need = r["max_running"] * r["mean_prompt_tokens"] * r["kv_bytes_per_token"]
    return (f"It then keeps as many prompts running as its pool admits (up to {r['max_running']}), and their pages, "
            f"reserved at admission, fill the pool ({r['model']}: {r['max_running']} prompts of the trace's mean "
            f"{r['mean_prompt_tokens']:,.0f} tokens at {r['kv_bytes_per_token'] / 1024:g} KiB per token and TP rank "
            f"would take {need / 1e9:,.0f} GB; the pool holds {r['pool_bytes_per_replica'] / 1e9:,.0f} GB), so the "
            "GPU pool alone finds little (the issue's 0-3 %); the fleet that keeps up has several replicas' pools and "
            "a cache-aware router. ")


def _working_set_sentence(rows: list[dict]) -> str:
    """The unbounded replays' peak pool per GPU: what a tier would have to hold to lose nothing."""
    peaks = [f"{r['model']} {r['pool_bytes_peak_per_gpu'] / 1e12:.2g} TB" for r in rows
             if r["view"] == "replay" and r["host_pool_bytes_per_gpu"] is None]
    return ("An unbounded pool peaks at " + ", ".join(peaks) + " per GPU: everything the replay ever cached (it "
            "evicts nothing), what a GPU pool and its tiers would hold to lose no reuse at all.") if peaks else ""


def render(rows: list[dict], *, link, limit: int | None, clocks: dict[str, str]) -> str:
    sl = f" (first {limit} requests)" if limit else ""
    return "\n".join([
        "# A host-memory tier under the GPU pool: the conversation trace on H200",
        "",
        "Generated by `k3sim prefix-cache --offload-report --out reports/prefix_cache` "
        "(`k3sim/serving/offload_report.py`; the mechanism in `k3sim/prefix_cache/offload.py` and `cache.py`). "
        f"Every figure is a run of `k3sim serve` or of the `k3sim prefix-cache` replay on `{Path(TRACE).name}`{sl} "
        "on H200, with the GPU pool per GPU the memory planner leaves (HBM - weights - workspace, "
        "`memory.plan.serve_plan`), hash block 512 and `serve`'s page rule. `serve` runs its default policy per "
        f"model (`decoupled` for K3; `full-attention` for Qwen3-Next, because serve's policies place KDA state only: "
        f"its rows are an upper bound on what Gated DeltaNet state allows); the replay runs `{POLICY}` for both (the "
        "K3 design, which keeps every recurrent kind's state).",
        "",
        "## The mechanism",
        "",
        "- What the GPU pool evicts (a KV page, or a checkpoint with all its state groups) is written to the host "
        "tier (SGLang HiCache's `write_back` policy); the host tier evicts LRU and drops. A lookup walks both; a "
        "KV page found in host memory is restored into a GPU page (it leaves the tier), a checkpoint is copied "
        "into the request's private state (it stays). The pool's pinning rules are unchanged (a restore takes "
        "its pages out of the tier before any allocation can evict into it).",
        "- A hit in host memory pays its transfer: the restored bytes (pages, a partial page's tokens, the "
        "checkpoint) over the GPU's host link, after the restores queued before it; the request's prefill starts "
        "when they have landed while the rest of the batch runs (vLLM's asynchronous load: the request waits in "
        "WAITING_FOR_REMOTE_KVS). So a restore adds to that request's TTFT, not to the step time, in `serve` and in "
        "the replay alike. The eviction's write-back (the other direction) is not charged.",
        f"- Host link: {link.peak_bytes_per_s / 1e9:g} GB/s one way per GPU by the datasheet (PCIe Gen5 x16), "
        f"{link.achieved_bytes_per_s / 1e9:.4g} GB/s achieved ({100 * link.efficiency:.0f} %): {link.source}. "
        "Both directions at once measured 46.5 GB/s each on the same machine. With pipeline stages each stage's "
        "GPUs move their layers' share of a restore over their own links.",
        "- Hit rate by tier: the host share is the part of a hit beyond what a lookup of the GPU pool alone finds at "
        "the request's admission; the GPU share is the rest.",
        "",
        "## Serving fleets sized for the trace (`k3sim serve`, the trace's own timing)",
        "",
        _table(rows, "serve"),
        "",
        "## One replica under the whole trace (`k3sim prefix-cache` replay)",
        "",
        _table(rows, "replay"),
        "",
        "A replica marked overloaded prefills slower (its step clock, below) than the prompt tokens the hits leave "
        "arrive, so its queue grows through the run and its TTFTs are those of that queue (read its hit rate). "
        + _pinned_sentence(rows) + _working_set_sentence(rows),
        "",
        "## What the runs show",
        "",
        *[f"- {t}." for t in _findings(rows)],
        "",
        "## Sizes and limits",
        "",
        "- Host sizes per GPU: 64 GB (where the curve starts), 256 GB (an 8-GPU DGX H200 has 2 TB of system memory: "
        "256 GB per GPU, NVIDIA DGX H200 datasheet; a GB200 superchip has 480 GB of LPDDR5X for two GPUs, 240 GB "
        "each), 1 TB (a large-memory host, or a DRAM pool shared across nodes as Mooncake's). The unbounded "
        "rows give the ceiling: the trace's reuse the cache could ever serve.",
        "- One restore at a time per engine on its links (pp engines of a replica share them); no layer-wise "
        "overlap of a restore with the prefill (HiCache loads layer by layer beside the forward): the waits are an "
        "upper bound. No SSD tier in these runs (`k3sim prefix-cache --ssd-pool-bytes` models one).",
        "- The prefix-aware router counts a replica's host-tier blocks as cached (a cache-aware router remembers "
        "what it sent where, whichever tier holds it now).",
        "",
        "## Step clocks of the replays",
        "",
        *[f"- {m}: {c}" for m, c in clocks.items()],
        "",
    ])


CSV_COLUMNS = ["view", "model", "policy", "layout", "replicas", "gpus", "gpu_pool", "pool_bytes_per_replica",
               "host_pool_bytes_per_gpu", "token_hit_rate", "token_hit_rate_gpu", "token_hit_rate_host",
               "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "throughput_requests_per_s", "overloaded",
               "host_restore_bytes", "host_restore_s", "host_demoted_bytes", "host_evicted_bytes",
               "requests_restored", "restore_wait_s_mean", "requests", "pool_bytes_peak", "pool_bytes_peak_per_gpu",
               "mean_prompt_tokens", "kv_bytes_per_token", "step_clock"]


def offload_rows(*, hosts: Sequence[float] = HOST_SIZES, limit: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Every row of the report: per model, serve at each host size and with an unbounded GPU pool, then the
    replays."""
    from k3sim.files import project_path

    trace = project_path(TRACE)
    rows: list[dict] = []
    total = len(MODELS) * 2 * (len(hosts) + 1)
    with tempfile.TemporaryDirectory(prefix="k3sim-offload-") as tmp:
        for name, (path, layout, replicas) in MODELS.items():
            scn = _scenario(Path(tmp), name, path, layout, replicas)
            for host in (*hosts, None):
                rows.append(serve_row(scn, name, host, trace=trace, limit=limit))
                if progress is not None:
                    progress(len(rows), total)
    for name, (path, layout, _) in MODELS.items():
        rows += replay_rows(name, path, layout, hosts, trace=trace, limit=limit)
        if progress is not None:
            progress(len(rows), total)
    return rows


def write_offload_report(out_dir: str | Path, *, hosts: Sequence[float] = HOST_SIZES, limit: int | None = None,
                         progress: Callable[[int, int], None] | None = None) -> OffloadReport:
    """Run every row and write `offload.md` and `offload.csv` into `out_dir` (kind `prefix-cache-sweep`, part
    `offload`, `k3sim.files.output_dir`)."""
    import pandas as pd

    from k3sim.configs import load_hardware
    from k3sim.prefix_cache.offload import host_link

    t0 = time.perf_counter()
    out = Path(out_dir)
    files = {"table": str(out / "offload.md"), "csv": str(out / "offload.csv")}
    with output_dir(out, kind=KIND, part=PART, source="--out"):
        rows = offload_rows(hosts=hosts, limit=limit, progress=progress)
        clocks = {r["model"]: f"{r['step_clock']} (H200 {r['layout']}, its step model's line)"
                  for r in rows if r["view"] == "replay"}
        md = render(rows, link=host_link(load_hardware(HARDWARE), source="--offload-report"), limit=limit,
                    clocks=clocks)
        df = pd.DataFrame(rows)
        for c in CSV_COLUMNS:
            if c not in df:
                df[c] = None
        atomic_write_text(files["table"], md)
        atomic_write_text(files["csv"], df[CSV_COLUMNS].to_csv(index=False))
    return OffloadReport(rows, files, time.perf_counter() - t0)
