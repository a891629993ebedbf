"""The token-budget answer of `k3sim plan SCENARIO --tokens N --days D` (scenario `training.tokens`, `training.days`):
the smallest cluster, and its layout, that trains N tokens in D days, from a sweep over cluster sizes.

How the candidates are formed:
- Clusters: the scenario's `cluster.num_gpus` times powers of two, halved while a whole number of GPUs and
  doubled up to the largest permitted cluster (`max_gpus`: `--max-gpus`, default the bounds table's `gpus`
  maximum). A cluster too small to reach the rate even at 100 % MFU (`ideal_gpus`: required tokens/s x model
  FLOP per token / peak FLOP/s per GPU, the FLOP count MFU uses) is not swept: no layout can meet it there.
- Layouts on each cluster: the sweep's training grid (`planner.sweep.training_points`: the scenario's `sweep:`
  lists, else the lists `k3sim sweep` derives from the scenario; dp fills the cluster unless `sweep.dp` names
  it) at the scenario's global batch (or `sweep.global_batch_sequences`), so every candidate trains the same
  tokens per step; micro-batches derived, points that do not divide or starve the pipeline skipped and counted.
- Pricing: the analytic path of `k3sim sweep` (closed-form pipeline), which decides; a point that fits in
  memory (the memory plan runs on the fastest points only, until the answer is known) and takes at most D
  days meets the budget. A point whose compute alone (`step_lower_bound_s`) already exceeds the step the rate
  allows is not priced: it cannot meet the budget. The chosen layout and the runner-up are also priced as
  `k3sim plan` prices a layout (the event engine), shown beside the sweep's figures.
- Days a layout takes: ceil(tokens / tokens per step) steps x its step time / 86,400 s.
- Chosen: on the smallest cluster where a layout fits in memory and trains the tokens within the days, the
  fastest such layout; runner-up: the next in (GPUs, days) order (a slower layout on that cluster, else the
  fastest on the next). Clusters are swept in increasing size and the sweep stops once both are known.
A budget no layout meets on the largest permitted cluster is `met = False` with the fastest fitting layout
found (`best`, searched past the bound: every point that could beat it is priced): the command writes the
report, then prints one line with its figures and exits 2.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

SECONDS_PER_DAY = 86_400.0
LAYOUT_KEYS = ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "num_micro_batches", "micro_batch_size",
               "global_batch_sequences")
ROW_KEYS = ("gpus", "step_time_s", "tokens_per_step", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
            "memory_per_gpu_bytes", "fits", "bubble_ratio", "pipeline_source")


@dataclass
class TokenBudget:
    """The answer as data; `to_json` is the plan JSON's `token_budget` section (SI units, days in days)."""

    tokens: float
    days: float
    required_tokens_per_s: float
    max_gpus: int
    ideal_gpus: float                  # GPUs at 100 % MFU for the required rate (the sweep starts above it)
    clusters: list[dict]               # per swept cluster: points, priced, fitting, meeting, best, skipped
    chosen: dict | None                # the answer (None: no layout meets the budget)
    runner_up: dict | None
    best: dict | None                  # the fastest fitting layout found (the answer's figures when none meets)
    global_batch_sequences: list[int]
    seq_len_tokens: int
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.chosen is not None

    def to_json(self) -> dict:
        c = self.chosen
        return {"tokens": self.tokens, "days": self.days, "required_tokens_per_s": self.required_tokens_per_s,
                "met": self.met, "gpus": c["gpus"] if c else None, "days_taken": c["days"] if c else None,
                "layout": layout_text(c) if c else None, "chosen": c, "runner_up": self.runner_up,
                "best": self.best, "max_gpus": self.max_gpus, "ideal_gpus": self.ideal_gpus,
                "global_batch_sequences": self.global_batch_sequences,
                "tokens_per_step": [b * self.seq_len_tokens for b in self.global_batch_sequences],
                "clusters": self.clusters, "notes": self.notes}   # no wall time: a regenerated plan is identical

    def shortfall(self) -> str:
        """The one line of a budget not met: the rate needed and the best layout's figures."""
        need = f"{self.tokens:.3g} tokens in {self.days:g} days need {self.required_tokens_per_s:,.0f} tokens/s"
        b = self.best
        if self.ideal_gpus > self.max_gpus:
            return (f"{need}, {self.ideal_gpus:,.0f} GPUs even at 100 % MFU, more than the {self.max_gpus:,} allowed; "
                    "raise --max-gpus, give more days or fewer tokens")
        if b is None:
            return (f"{need} and no layout of the sweep fits in memory on up to {self.max_gpus:,} GPUs; raise "
                    "--max-gpus or change the sweep: section")
        return (f"{need}; the best layout on up to {self.max_gpus:,} GPUs ({layout_text(b)}, {b['gpus']:,} GPUs) "
                f"trains {b['tokens_per_s']:,.0f} tokens/s: {b['days']:.1f} days; give more days, fewer tokens, "
                "a larger --max-gpus or global batch")


def layout_text(row: dict) -> str:
    """tp=8 pp=16 v=2 ep=64 dp=128 m=16: the layout of a row in one short phrase."""
    parts = [f"tp={row['tp']}", f"pp={row['pp']}"] + [f"v={row['virtual_stages']}"] * (row["virtual_stages"] > 1)
    parts += [f"ep={row['ep']}"] + [f"cp={row['cp']}"] * (row["cp"] > 1)
    return " ".join(parts + [f"dp={row['dp']}", f"m={row['num_micro_batches']}"]
                    + [f"mbs={row['micro_batch_size']}"] * (row["micro_batch_size"] > 1))


def candidate_clusters(start: int, max_gpus: int, ideal: float) -> tuple[list[int], list[int]]:
    """(clusters swept, clusters below the 100 % MFU bound), both ascending: `start` x 2^k for every integer k
    that gives a whole number of GPUs at most `max_gpus` (the caller passes the smaller of the permitted
    cluster and the largest the grid can fill, `grid_gpus`)."""
    sizes, g = set(), start
    while g >= 1:
        if g <= max_gpus:
            sizes.add(g)
        if g % 2:
            break
        g //= 2
    g = start * 2
    while g <= max_gpus:
        sizes.add(g)
        g *= 2
    return sorted(s for s in sizes if s >= ideal), sorted(s for s in sizes if s < ideal)


def grid_gpus(lists: dict, micro_batch_size: int) -> int:
    """The most GPUs any point of the training lists uses: max tp x pp x cp times the widest dp, which is the
    largest given dp, else (dp fills the cluster) the largest global batch over the smallest micro-batch
    size (the scenario's, or with micro-batch counts named, the global batch over the fewest: one sequence
    each), since a point needs at least one micro-batch of at least one sequence per dp rank."""
    if lists["dp"]:
        dp = max(lists["dp"])
    else:
        dp = max(lists["global_batch_sequences"]) // (1 if lists["num_micro_batches"] else micro_batch_size)
        dp //= min(lists["num_micro_batches"]) if lists["num_micro_batches"] else 1
    return max(lists["tp"]) * max(lists["pp"]) * max(lists["cp"]) * max(dp, 1)


def ideal_gpus(inp, ctx, rate: float) -> float:
    """GPUs that reach `rate` tokens/s at 100 % MFU: rate x model FLOP per token / the peak the GEMMs may run
    at (the training precision's peak when the profile has one, else bf16's): a lower bound on any layout."""
    hw = inp.hw
    peak = float(hw.peak_flops_per_s.get(inp.training.precision) or hw.peak_flops_per_s.get("bf16", 0.0))
    if peak <= 0:
        return 1.0
    return rate * ctx.model_flop_per_token(inp.scenario.workload.context_tokens) / peak


def step_lower_bound_s(inp, ctx, p: dict) -> float:
    """Seconds the analytic path's step of point `p` takes at least, from the layer costs alone: every
    micro-batch's forward and backward of every layer (and the embedding and LM head) plus, under full
    recompute, each layer's forward again, spread perfectly over the pp ranks (each rank runs its compute in
    sequence, so the busiest holds at least the mean), times Megatron's closed form for 1F1B and interleaved
    1F1B, m + (pp - 1) / v micro-batch slots (Narayanan et al., SC'21); other schedules m slots. Left out: the
    communication, the EP imbalance, sends, DP and optimizer time the step model adds on top of the same layer
    costs (`TrainingContext.stage_sums`). The search checks every point it prices against this bound."""
    from k3sim.training.schedule import resolve_schedule

    w, opts = inp.scenario.workload, inp.training
    tokens = p["micro_batch_size"] * w.context_tokens
    costs = ctx.layer_costs(p["tp"], p["ep"], p["cp"], tokens, w.context_tokens, opts.moe_glue, opts.precision)
    full = opts.recompute == "full" or (opts.recompute is None and w.activation_checkpointing)
    again = sum(c.forward_s for c in costs if c.kind in ("kda", "mla")) if full else 0.0  # decoder layers only
    per_micro_batch = again + sum(c.forward_s + c.backward_input_s + c.backward_weight_s for c in costs)
    m, pp, v = p["num_micro_batches"], p["pp"], p["virtual_stages"]
    one_f_one_b = pp > 1 and resolve_schedule(opts.pipeline_schedule, v) in ("1f1b", "interleaved-1f1b")
    return (m + (pp - 1) / v * one_f_one_b) * per_micro_batch / pp


def _budget_row(row: dict, tokens: float) -> dict:
    """A priced point as the answer reports it: its layout, speed, memory, and the days the budget takes."""
    steps = math.ceil(tokens / row["tokens_per_step"])
    out = {k: row[k] for k in LAYOUT_KEYS + ROW_KEYS}
    out.update({"steps": steps, "days": steps * row["step_time_s"] / SECONDS_PER_DAY})
    return out


def _rank(row: dict) -> tuple:
    """The answer's order: fewest GPUs, then fastest (then the grid's order of the layout, for ties)."""
    return (row["gpus"], row["step_time_s"], tuple(row[k] for k in LAYOUT_KEYS))


class _Search:
    """The sweep's state across clusters: the priced points, the bound check, the rows that meet."""

    def __init__(self, inp, ctx, lists: dict, tokens: float, days: float, prune: bool):
        self.inp, self.ctx, self.lists, self.tokens, self.days, self.prune = inp, ctx, lists, tokens, days, prune
        self.seen: set = set()
        self.pruned: list[tuple[float, dict]] = []      # (bound tokens/s, point) not priced
        self.priced: list[dict] = []                    # closed-form rows, status ok, memory not yet known
        self.violation: str | None = None

    def price(self, p: dict, **train: Any) -> dict:
        from k3sim.planner.sweep import evaluate

        return evaluate(self.inp, self.ctx, None, {k: p[k] for k in LAYOUT_KEYS}, **train)

    def cluster(self, gpus: int) -> tuple[dict, list[dict]]:
        """One cluster: its grid points (those priced on a smaller cluster, when `sweep.dp` fixes dp, not again)
        priced closed form without the memory plan, unless their bound already exceeds the step the budget
        allows (they cannot meet it); then, in increasing order of the bound, each one that meets and would be
        among the two fastest so far gets its memory plan (a point whose bound exceeds the second-fastest that
        fits can be neither). Returns the cluster's summary and its two fastest fitting points that meet."""
        from k3sim.planner.sweep import TRAIN_DIMS, training_points

        skipped: Counter = Counter()
        points = [p for p in training_points(self.inp, self.lists, gpus, skipped, {}, {d: set() for d in TRAIN_DIMS})
                  if tuple(p[k] for k in LAYOUT_KEYS) not in self.seen]
        seq = self.inp.scenario.workload.context_tokens
        todo = []
        for i, p in enumerate(points):
            self.seen.add(tuple(p[k] for k in LAYOUT_KEYS))
            bound = step_lower_bound_s(self.inp, self.ctx, p)
            per_step = p["global_batch_sequences"] * seq
            limit = self.days * SECONDS_PER_DAY / math.ceil(self.tokens / per_step)   # the slowest step that meets
            if self.prune and bound > limit:
                self.pruned.append((per_step / bound, p))   # tokens/s it cannot exceed
            else:
                todo.append((bound, i, p, limit))
        todo.sort(key=lambda t: t[:2])
        fit: list[dict] = []
        meet = checked = priced = errors = 0
        one_size = self.lists["dp"] is None   # dp fills the cluster: every point has its GPUs, ranked by speed
        for bound, _, p, limit in todo:
            if self.prune and one_size and len(fit) > 1 and bound > fit[1]["step_time_s"]:
                self.pruned.append((p["global_batch_sequences"] * seq / bound, p))  # slower than both found
                continue
            r = self.price(p, with_memory=False)
            priced += 1
            if r["status"] != "ok":
                errors += 1
                continue
            self.priced.append(r)
            if r["step_time_s"] < bound * (1 - 1e-9) and self.violation is None:
                self.violation = f"{layout_text(r)}: step {r['step_time_s']:.6g} s below its bound {bound:.6g} s"
            if r["step_time_s"] > limit:
                continue
            meet += 1
            if len(fit) < 2 or _rank(r) < _rank(fit[1]):
                checked += 1
                got, _ = self.fitting([_budget_row(r, self.tokens)], 1)
                fit = sorted(fit + got, key=_rank)[:2]
        fastest = max(self.priced[len(self.priced) - (priced - errors):], key=lambda r: r["tokens_per_s"], default=None)
        summary = {"gpus": gpus, "points": len(points), "priced": priced, "below_bound": len(points) - priced,
                   "fastest_priced_layout": layout_text(fastest) if fastest else None,   # its memory not checked
                   "fastest_priced_days": _budget_row(fastest, self.tokens)["days"] if fastest else None,
                   "meet_closed_form": meet, "memory_checked": checked, "meet": len(fit),
                   "best_layout": layout_text(fit[0]) if fit else None, "best_days": fit[0]["days"] if fit else None,
                   "skipped": dict(sorted(skipped.items()))}
        return summary, fit

    def fitting(self, rows: list[dict], want: int) -> tuple[list[dict], int]:
        """The first `want` of `rows` (fastest first) that fit in memory, with their memory figures; and how
        many memory plans ran (each costs several closed-form steps, so only these run one)."""
        out, checked = [], 0
        for r in rows:
            if len(out) >= want:
                break
            checked += 1
            m = self.price(r)
            if m["status"] == "ok" and m["fits"]:
                out.append(_budget_row(m, self.tokens))
        return out, checked

    def best(self) -> dict | None:
        """The fastest fitting layout of every cluster swept: the priced rows fastest first, then every point
        the bound left out whose bound beats the best found so far (so none is missed)."""
        found = None
        for r in sorted(self.priced, key=lambda r: -r["tokens_per_s"]):
            fit, _ = self.fitting([_budget_row(r, self.tokens)], 1)
            if fit:
                found = fit[0]
                break
        for top, p in sorted(self.pruned, key=lambda t: -t[0]):
            if found is not None and top <= found["tokens_per_s"]:
                break
            r = self.price(p)
            if r["status"] == "ok" and r["fits"] and (found is None or r["tokens_per_s"] > found["tokens_per_s"]):
                found = _budget_row(r, self.tokens)
        return found


def _with_plan_clock(search: _Search, row: dict | None) -> dict | None:
    """The row with `k3sim plan`'s figures beside the sweep's: step, days and pipeline of the event engine."""
    if row is None:
        return None
    r = search.price(row, engine=None)
    if r["status"] != "ok":
        return {**row, "plan_error": r["error"]}
    steps = math.ceil(search.tokens / r["tokens_per_step"])
    return {**row, "plan_step_time_s": r["step_time_s"], "plan_days": steps * r["step_time_s"] / SECONDS_PER_DAY,
            "plan_pipeline_source": r["pipeline_source"]}


def token_budget(inp, tokens: float, days: float, *, max_gpus: int | None = None,
                 kernel_time: Callable | None = None, context: Any = None, prune: bool = True) -> TokenBudget:
    """Sweep cluster sizes upwards (module docstring) until the chosen layout and the runner-up are known.
    `prune` False prices every point (the bound's check: the same answer, slower)."""
    from k3sim.configs.bounds import BOUNDS
    from k3sim.planner.sweep import _train_lists
    from k3sim.training import TrainingContext

    t0 = time.perf_counter()
    rate = tokens / (days * SECONDS_PER_DAY)
    max_gpus = int(BOUNDS["gpus"].hi) if max_gpus is None else int(max_gpus)
    ctx = context or TrainingContext(inp.model, inp.hw, kernel_time=kernel_time)
    lists = _train_lists(inp, {k: v for k, v in inp.sweep.model_dump().items() if v is not None})
    ideal = ideal_gpus(inp, ctx, rate)
    fillable = grid_gpus(lists, inp.scenario.workload.micro_batch_size)
    swept, below = candidate_clusters(inp.scenario.cluster.num_gpus, min(max_gpus, fillable), ideal)
    search = _Search(inp, ctx, lists, tokens, days, prune)
    clusters, meeting = [], []
    for gpus in swept:
        summary, meet = search.cluster(gpus)
        clusters.append(summary)
        meeting += meet
        if len(meeting) >= 2:
            break
    if search.violation is not None and prune:  # the step model priced below the bound: price every point
        out = token_budget(inp, tokens, days, max_gpus=max_gpus, context=ctx, prune=False)
        out.notes.append(f"the compute bound did not hold ({search.violation}): every point priced")
        return out
    notes = [f"clusters below {ideal:,.0f} GPUs (100 % MFU at the required rate) not swept: "
             f"{', '.join(f'{g:,}' for g in below)}"] if below else []
    if fillable < max_gpus:
        notes.append(f"clusters above {fillable:,} GPUs not swept: no point of the grid uses more (tp x pp x cp x dp "
                     "at the global batch)")
    if not swept:
        notes.append(f"no candidate cluster: --max-gpus {max_gpus:,} is below the {ideal:,.0f} GPUs the rate "
                     "needs at 100 % MFU")
    return TokenBudget(tokens=tokens, days=days, required_tokens_per_s=rate, max_gpus=max_gpus, ideal_gpus=ideal,
                       clusters=clusters, chosen=_with_plan_clock(search, meeting[0] if meeting else None),
                       runner_up=_with_plan_clock(search, meeting[1] if len(meeting) > 1 else None),
                       best=None if meeting else _with_plan_clock(search, search.best()),
                       global_batch_sequences=list(lists["global_batch_sequences"]),
                       seq_len_tokens=inp.scenario.workload.context_tokens, wall_s=time.perf_counter() - t0,
                       notes=notes)
