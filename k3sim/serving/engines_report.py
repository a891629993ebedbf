"""The engine-policy report (`k3sim prefix-cache --engines`): every engine policy of `prefix_cache.engines` on
Qwen3-Next, Nemotron-H and Kimi K3, on both shipped Mooncake traces, unbounded and at a bounded pool; the
block size each engine's rule gives (at TP 1, 2, 4, 8); every figure of `engines.md` / `engines.csv` is a
replay (or a rule) run here.

Step clock per model: the `ModelStepCost.line` of one replica (`LAYOUTS`, a modelling choice stated in the
report), the line `k3sim prefix-cache` itself draws through the step model; tests pass a model-free clock and a
trace slice. Sizes are whole-model (`tp` 1: one logical pool holding all ranks' KV and state); the block table
shows what TP does to each rule.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from k3sim.files import atomic_write_text, output_dir
from k3sim.prefix_cache.engines import ENGINE_POLICIES, ENGINES, block_rule, check_policy, engine_config
from k3sim.serving.replay import SchedulerConfig, StepCost

# the output kind (k3sim.files manifest): a prefix-cache sweep's, part "engines", so the report lives beside the
# sweeps of reports/prefix_cache
KIND, PART = "prefix-cache-sweep", "engines"
MODELS = ("models/qwen3-next-80b-a3b.yaml", "models/nemotron-h-56b.yaml", "models/kimi-k3.yaml")
TRACES = ("data/traces/conversation_trace.jsonl", "data/traces/synthetic_trace.jsonl")
# 1 TB: about one 8 x H200 node's HBM (8 x 141 GB) after Qwen3-Next's or Nemotron-H's weights; the same pool for
# every model so the policies' memory caps compare (modelling choice). None: unbounded.
CAPACITIES: tuple[float | None, ...] = (None, 1e12)
TPS = (1, 2, 4, 8)
# the replica whose step model prices each step (modelling choice: K3 as scenarios/default.yaml, the others on
# one node, TP 8, EP over the experts where there are experts)
LAYOUTS = {"kimi-k3": dict(tp=8, pp=2, ep=8), "qwen3-next-80b-a3b": dict(tp=8, pp=1, ep=8),
           "nemotron-h-56b": dict(tp=8, pp=1, ep=1)}
DEFAULT_LAYOUT = dict(tp=8, pp=1, ep=1)


@dataclass
class EnginesReport:
    rows: list[dict]
    blocks: list[dict]
    files: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0


def block_rows(models: Sequence, tps: Sequence[int] = TPS) -> list[dict]:
    """The KV page (tokens) each policy's rule gives for each model and TP size; '' where it is refused."""
    from k3sim.errors import InputError

    rows = []
    for model in models:
        for policy in ENGINE_POLICIES:
            row = {"model": model.name, "policy": policy}
            for tp in tps:
                try:
                    check_policy(model, policy)
                    rule = block_rule(model, policy, tp=tp)
                    row[f"tp{tp}_page_tokens"] = rule.page_tokens
                    row[f"tp{tp}_snapshot_tokens"] = rule.snapshot_tokens
                except InputError:
                    row[f"tp{tp}_page_tokens"] = row[f"tp{tp}_snapshot_tokens"] = ""
            rows.append(row)
    return rows


def _clock(model, cost: StepCost | None, token_budget: int) -> tuple[StepCost, str]:
    if cost is not None:
        return cost, "given"
    from k3sim.serving.replay import ModelStepCost

    layout = LAYOUTS.get(model.name, DEFAULT_LAYOUT)
    msc = ModelStepCost(model, "h200", **layout)
    return msc.line(token_budget), "step model, H200 TP{tp} PP{pp} EP{ep}".format(**layout)


def clocks_for(models: Sequence, cost: StepCost | None, token_budget: int) -> dict[str, tuple[StepCost, str]]:
    """Each model's step clock and where it comes from."""
    return {m.name: _clock(m, cost, token_budget) for m in models}


def engine_rows(models: Sequence, traces: Sequence[Path], capacities: Sequence[float | None], *,
                limit: int | None = None, sched: SchedulerConfig = SchedulerConfig(), cost: StepCost | None = None,
                processes: int | None = None, progress: Callable[[int, int], None] | None = None,
                clocks: dict[str, tuple[StepCost, str]] | None = None) -> list[dict]:
    """One row per model x trace x policy x capacity (a refused policy: one row with the refusal)."""
    from k3sim.errors import InputError
    from k3sim.serving.prefix_cache_run import run_sweep
    from k3sim.workloads.mooncake import read_mooncake

    clocks = clocks or clocks_for(models, cost, sched.token_budget)
    rows: list[dict] = []
    for trace in traces:
        reqs = list(read_mooncake(trace, limit=limit))
        configs, meta = [], []
        for model in models:
            for policy in ENGINE_POLICIES:
                try:
                    cfgs = [engine_config(model, policy, capacity_bytes=cap) for cap in capacities]
                except InputError as err:
                    rows.append({"trace": Path(trace).name, "model": model.name, "policy": policy,
                                 "note": err.reason})
                    continue
                if cfgs[0].mechanism == "step-end" and sched.token_budget < cfgs[0].physical_block_tokens:
                    rows.append({"trace": Path(trace).name, "model": model.name, "policy": policy,
                                 "note": f"token budget {sched.token_budget} below the {cfgs[0].physical_block_tokens}-"
                                         "token block: align mode cannot schedule a chunk"})
                    continue
                rule = block_rule(model, policy)
                # a prompt shorter than the first restorable position never hits (vLLM's inflated blocks)
                first = rule.snapshot_tokens or rule.hash_tokens
                short = sum(r.input_tokens <= first for r in reqs) / max(len(reqs), 1)
                for cfg in cfgs:
                    configs.append(cfg)
                    meta.append({"trace": Path(trace).name, "model": model.name, "page_tokens": rule.page_tokens,
                                 "snapshot_tokens": rule.snapshot_tokens, "rule_note": rule.note,
                                 "step_clock": clocks[model.name][1], "requests_within_first_snapshot": short})
        df = run_sweep(reqs, configs, sched, [clocks[m["model"]][0] for m in meta], processes, progress)
        for m, rec in zip(meta, df.to_dict("records")):
            rec.pop("wall_s", None)
            # pandas' NaN for an absent value (unbounded capacity, no note) back to None
            rows.append({**m, **{k: (None if isinstance(v, float) and v != v else v) for k, v in rec.items()}})
    return rows


def _pct(v) -> str:
    return "" if v is None or v != v else f"{100 * v:.2f}"


def _gib(v) -> str:
    return "" if v is None or v != v else f"{v / 2**30:,.1f}"


def _cap(v) -> str:
    return "unbounded" if v is None or v != v else f"{v / 1e12:g} TB"


def _policy_table() -> str:
    lines = ["| policy | engine | block-size rule | checkpoint placement | memory cap | source |",
             "|---|---|---|---|---|---|"]
    for e in ENGINES.values():
        lines.append(f"| `{e.name}` | {e.engine} | {e.block_rule} | {e.checkpoints} | {e.memory} | {e.source} |")
    return "\n".join(lines)


def _block_table(blocks: list[dict], tps: Sequence[int]) -> str:
    head = "| model | policy | " + " | ".join(f"TP{tp} page / snapshot (tokens)" for tp in tps) + " |"
    lines = [head, "|---|---|" + "---|" * len(tps)]
    for b in blocks:
        cells = []
        for tp in tps:
            page, snap = b[f"tp{tp}_page_tokens"], b[f"tp{tp}_snapshot_tokens"]
            cells.append("refused" if page == "" else f"{page:,} / {snap:,}" if snap else f"{page:,} / -")
        lines.append(f"| {b['model']} | `{b['policy']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _trace_table(rows: list[dict], trace: str, capacities: Sequence[float | None]) -> str:
    caps = [_cap(c) for c in capacities]
    head = ("| model | policy | engine page (tokens) | one checkpoint (GiB) | "
            + " | ".join(f"{c}: token hit % / request hit % / prefill FLOP saved % / state peak (GiB)" for c in caps)
            + " |")
    lines = [head, "|---|---|---|---|" + "---|" * len(caps)]
    by_key: dict[tuple, dict] = {}
    order: list[tuple] = []
    for r in rows:
        if r["trace"] != trace:
            continue
        key = (r["model"], r["policy"])
        if key not in by_key:
            by_key[key] = {}
            order.append(key)
        by_key[key][_cap(r.get("capacity_bytes"))] = r
    for key in order:
        cells = by_key[key]
        first = next(iter(cells.values()))
        if "note" in first and first.get("note") and "token_hit_rate" not in first:
            lines.append(f"| {key[0]} | `{key[1]}` | - | - | " + " | ".join(["refused: " + first["note"]]
                                                                           + [""] * (len(caps) - 1)) + " |")
            continue
        out = []
        dash = first["policy"] in ("full-attention", "none")  # no checkpoint to size
        for c in caps:
            r = cells.get(c)
            if r is None or r.get("token_hit_rate") is None or r.get("token_hit_rate") != r.get("token_hit_rate"):
                out.append(r.get("note", "") if r else "")
                continue
            out.append(f"{_pct(r['token_hit_rate'])} / {_pct(r['request_hit_rate'])} / "
                       f"{_pct(r['prefill_flop_saved_fraction'])} / {_gib(r['checkpoint_bytes_peak'])}")
        one = "-" if dash else _gib(first["checkpoint_bytes"])
        lines.append(f"| {key[0]} | `{key[1]}` | {first['page_tokens']:,} | {one} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def _headlines(rows: list[dict], capacities: Sequence[float | None]) -> list[str]:
    """One sentence per trace and model: the best engine policy against the upper bound, per capacity."""
    out = []
    ok = [r for r in rows if r.get("token_hit_rate") == r.get("token_hit_rate") and "token_hit_rate" in r]
    for trace in dict.fromkeys(r["trace"] for r in ok):
        for model in dict.fromkeys(r["model"] for r in ok if r["trace"] == trace):
            for cap in capacities:
                sel = [r for r in ok if r["trace"] == trace and r["model"] == model
                       and _cap(r.get("capacity_bytes")) == _cap(cap)]
                upper = next((r for r in sel if r["policy"] == "full-attention"), None)
                eng = [r for r in sel if r["policy"] not in ("full-attention", "none", "k3")]
                if not eng or upper is None:
                    continue
                best = max(eng, key=lambda r: r["token_hit_rate"])
                worst = min(eng, key=lambda r: r["token_hit_rate"])
                k3 = next((r for r in sel if r["policy"] == "k3"), None)
                text = (f"{trace}, {model}, {_cap(cap)}: best engine policy `{best['policy']}` "
                        f"{_pct(best['token_hit_rate'])} % of prompt tokens, worst `{worst['policy']}` "
                        f"{_pct(worst['token_hit_rate'])} %, `k3` {_pct(k3['token_hit_rate']) if k3 else '-'} %, "
                        f"upper bound {_pct(upper['token_hit_rate'])} %")
                align = next((r for r in sel if r["policy"] == "vllm-align"), None)
                if align is not None and cap is None:
                    text += (f"; {_pct(align['requests_within_first_snapshot'])} % of its requests are no longer "
                             f"than vLLM align's {align['page_tokens']:,}-token block (they can never hit)")
                out.append(text)
    return out


def render(rows: list[dict], blocks: list[dict], *, traces: Sequence[str], capacities: Sequence[float | None],
           tps: Sequence[int], clocks: dict[str, str], limit: int | None) -> str:
    """engines.md: the policies and their sources, the rules' block sizes, the replays, what they show."""
    sl = f" (first {limit} requests of each trace)" if limit else ""
    parts = [
        "# Prefix caching the way each engine does it: hybrid models on the Mooncake traces",
        "",
        "Generated by `k3sim prefix-cache --engines --out reports/prefix_cache` (`k3sim/serving/engines_report.py`; "
        "the mechanisms in `k3sim/prefix_cache/engines.py` and `cache.py`). Every number below is a replay through "
        f"the simulator{sl} or an engine's block-size rule evaluated on the model's sizes (kinds registry), not a "
        "typed-in figure. Pools are whole-model (TP 1: one logical pool holding every rank's KV and state).",
        "",
        "## The policies",
        "",
        _policy_table(),
        "",
        "A hit is the deepest restorable position inside the prompt's cached KV match (at least one prompt token "
        "is always recomputed); the rest of the prompt is prefilled again and priced by the replay's step clock. "
        "`full-attention` is the upper bound (every hash block restorable, no state); `none` reuses nothing.",
        "",
        "## Block size each engine's rule gives (KV page / finest restorable spacing, tokens)",
        "",
        _block_table(blocks, tps),
        "",
        "vLLM's rule is per layer and TP rank: one layer's state (recurrent + conv) against one layer's KV of one "
        "token, so TP changes it where the KV heads stop dividing (GQA replicates KV heads past their count; MLA's "
        "latent is replicated on every rank). SGLang keeps states in a pool of their own (no unification); "
        "TensorRT-LLM keeps its 32-token KV blocks and stores a snapshot as its own allocation.",
        "",
    ]
    for trace in traces:
        parts += [f"## {trace}", "", _trace_table(rows, trace, capacities), ""]
    parts += ["## What the replays show", ""]
    parts += [f"- {h}." for h in _headlines(rows, capacities)]
    parts += [
        "",
        "## Step clocks",
        "",
        *[f"- {m}: {c}" for m, c in clocks.items()],
        "",
        "## How to read it (modelling choices and limits)",
        "",
        "- The traces name 512-token blocks only. A snapshot is restorable by a later request only where the trace "
        "proves the prefix up to it is shared: inside a complete 512-token block of both prompts. So a snapshot at "
        "a prompt's end (SGLang's chunk ends, its finished-request states) inside the prompt's partial last block "
        "costs memory but is never matched, although a chat engine matching token by token may reuse it on the "
        "next turn: SGLang's figures here are a lower bound. vLLM's blocks (not multiples of 512) are matched at "
        "the first 512-token id ending at or after the block end (`prefix_cache/keys.py`): never invented, "
        "sometimes missed.",
        "- SGLang's KV pages (1 token) and TensorRT-LLM's (32 tokens) are simulated at 512 tokens (less than one "
        "page per request of difference in memory, much less replay time); their states are counted whole.",
        "- The state dtype is the model file's (fp32 state, bf16 conv). vLLM's `mamba_ssm_cache_dtype` 'auto' infers "
        "it from the model config (vllm/config/cache.py): where that gives the model's bf16, the state halves and "
        "so does the align block (Qwen3-Next, whose config names no state dtype: 544 tokens at bf16 by the same "
        "rule), so vLLM's own block for a model can be smaller than the one here.",
        "- Nemotron-H-56B is an 8K-context model; the traces' prompts run to 126K tokens: its rows price the "
        "cache mechanism on these traces, not a service the model could run.",
        "- Prefill FLOP saved: `prefix_cache/flops.py` (the one model-FLOP count, `memory/flops.py`).",
        "- `vllm-all` on K3 (KDA) uses vLLM's 'all' rule with its default chunk (2048): vLLM's K3 path runs align "
        "mode; that 'all' accepts KDA is not verified here.",
        "",
    ]
    return "\n".join(parts)


CSV_COLUMNS = ["trace", "model", "policy", "capacity_bytes", "page_tokens", "snapshot_tokens", "hash_block_tokens",
               "physical_block_tokens", "num_kda_groups", "checkpoint_bytes", "requests", "input_tokens",
               "token_hit_rate", "request_hit_rate", "prefill_tokens_saved", "prefill_flop_saved",
               "prefill_flop_saved_fraction", "checkpoint_bytes_peak", "pool_bytes_peak", "state_pool_bytes_peak",
               "checkpoints_written", "checkpoints_skipped", "checkpoints_evicted", "checkpoints_donated",
               "evictions", "requests_rejected", "requests_within_first_snapshot", "rule_note", "step_clock",
               "note"]


def write_engines_report(out_dir: str | Path, *, models: Sequence[str | Path] = MODELS,
                         traces: Sequence[str | Path] = TRACES, capacities: Sequence[float | None] = CAPACITIES,
                         limit: int | None = None, sched: SchedulerConfig = SchedulerConfig(),
                         cost: StepCost | None = None, processes: int | None = None,
                         progress: Callable[[int, int], None] | None = None) -> EnginesReport:
    """Replay every engine policy and write `engines.md` and `engines.csv` into `out_dir` (kind
    `prefix-cache-sweep`, part `engines`, `k3sim.files.output_dir`)."""
    import pandas as pd

    from k3sim.configs import load_model
    from k3sim.files import project_path

    t0 = time.perf_counter()
    loaded = [load_model(str(project_path(m))) for m in models]
    paths = [project_path(t) for t in traces]
    clocks = clocks_for(loaded, cost, sched.token_budget)
    rows = engine_rows(loaded, paths, capacities, limit=limit, sched=sched, processes=processes,
                       progress=progress, clocks=clocks)
    blocks = block_rows(loaded)
    text = {name: f"{src}: {c.step_overhead_s * 1e3:.2f} ms + tokens / {c.tokens_per_s:,.0f} tokens/s"
            for name, (c, src) in clocks.items()}
    md = render(rows, blocks, traces=[p.name for p in paths], capacities=capacities, tps=TPS, clocks=text,
                limit=limit)
    df = pd.DataFrame(rows)
    for c in CSV_COLUMNS:
        if c not in df:
            df[c] = None
    out = Path(out_dir)
    files = {"table": str(out / "engines.md"), "csv": str(out / "engines.csv")}
    with output_dir(out, kind=KIND, part=PART, source="--out"):
        atomic_write_text(files["table"], md)
        atomic_write_text(files["csv"], df[CSV_COLUMNS].to_csv(index=False))
    return EnginesReport(rows, blocks, files, time.perf_counter() - t0)

