"""The planning report's token-budget section (`k3sim plan --tokens N --days D`): the answer, the runner-up and
the clusters the budget's sweep tried, from `PlanResult.token_budget` (`k3sim.planner.budget.TokenBudget`)."""

from __future__ import annotations

from typing import Any


def _layout_row(name: str, r: dict | None) -> list[str] | None:
    if r is None:
        return None
    from k3sim.planner.budget import layout_text

    plan = f"{r['plan_days']:.1f}" if "plan_days" in r else r.get("plan_error", "")
    mem = f"{r['memory_per_gpu_bytes'] / 2 ** 30:.1f} GiB" if r.get("memory_per_gpu_bytes") is not None else ""
    return [name, f"{r['gpus']:,}", layout_text(r), f"{r['tokens_per_step']:,}", f"{r['step_time_s']:.4g}",
            f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f} %", mem, f"{r['days']:.1f}", plan]


def budget_sections(res: Any) -> list[dict]:
    """The section (none without a token budget): the answer in the note, the chosen layout, the runner-up
    (or the best found when nothing meets) and the clusters swept with what each gave."""
    b = getattr(res, "token_budget", None)
    if b is None:
        return []
    from k3sim.planner.budget import layout_text
    from k3sim.report.render import _section

    if b.met:
        c = b.chosen
        answer = (f"The smallest cluster that trains {b.tokens:.3g} tokens in {b.days:g} days "
                  f"({b.required_tokens_per_s:,.0f} tokens/s): {c['gpus']:,} GPUs, {layout_text(c)}, "
                  f"{c['days']:.1f} days.")
    else:
        answer = f"Not met: {b.shortfall()}."
    rows = [r for r in (_layout_row("chosen", b.chosen), _layout_row("runner-up", b.runner_up),
                        _layout_row("best found", b.best)) if r is not None]
    layouts = {"header": ["", "GPUs", "layout", "tokens per step", "step (s)", "tokens/s", "MFU", "memory per GPU",
                          "days", "days (k3sim plan)"], "rows": rows}
    clusters = [[f"{c['gpus']:,}", f"{c['points']:,}", f"{c['priced']:,}",
                 f"{c['fastest_priced_layout']}: {c['fastest_priced_days']:.1f}" if c["fastest_priced_layout"] else "",
                 f"{c['meet_closed_form']:,}", f"{c['memory_checked']:,}", f"{c['meet']:,}", c["best_layout"] or "",
                 f"{c['best_days']:.1f}" if c["best_days"] is not None else "",
                 "; ".join(f"{k} {v:,}" for k, v in c["skipped"].items())] for c in b.clusters]
    extra = ["Clusters swept: the table below (priced: through the analytic path; the other layouts cannot meet "
             "the rate or beat the two fastest by their compute alone; memory plans: run on the fastest that meet)."]
    out = [_section("token_budget", "Token budget: the smallest cluster", f"{answer} {res.notes.get('token_budget', '')}",
                    layouts if rows else None, extra=extra + list(b.notes))]
    out.append(_section("token_budget_clusters", "Token budget: clusters swept", "",
                        {"header": ["GPUs", "layouts", "priced", "fastest priced: days (memory not checked)",
                                    "meet (closed form)", "memory plans", "meet and fit", "fastest that meets and fits",
                                    "its days", "skipped"], "rows": clusters}))
    return out
