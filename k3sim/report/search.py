"""The planning report's serving-search sections (`k3sim plan --trace T --slo-ttft S --slo-tpot S`), which lead the
report: the answer and why (the SLO that binds, or the one the closest layout misses), the runner-ups side by
side, the Pareto front of goodput per GPU against p99 TTFT, and what the bounds pruned, from
`PlanResult.serving_search` (`k3sim.planner.serve_search.SearchResult`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _why(r: dict, s: Any) -> str:
    """The binding constraint of a row: the SLO nearest (or furthest past) its limit."""
    from k3sim.planner.serve_search import binding

    t, p = r["ttft_s"] / s.slo_ttft_s, r["tpot_s"] / s.slo_tpot_s
    if r["meets_slo"]:
        which = (f"TTFT ({100 * t:.0f} % of its SLO)" if t >= p else f"TPOT ({100 * p:.0f} % of its SLO)")
        return f"meets both SLOs; the nearer its limit is {which}"
    return "misses: " + binding(r, s)


def _row(i: int, r: dict, s: Any) -> list[str]:
    from k3sim.planner.serve_search import describe

    return [str(i), str(r["gpus"]), describe(r), f"{r['ttft_s']:.3g}", f"{r['tpot_s'] * 1e3:.3g}",
            f"{r['goodput_requests_per_s_per_gpu']:.3g}", f"{r['throughput_output_tokens_per_s_per_gpu']:.3g}",
            f"{100 * r['token_hit_rate']:.1f} %", "yes" if r["meets_slo"] else "no", f"{r['requests']:,}",
            _band_cell(r)]


def _span(r: dict, key: str, scale: float = 1.0) -> str:
    return f"{r[key + '_low'] * scale:.3g}-{r[key + '_high'] * scale:.3g}"


def _band_cell(r: dict) -> str:
    """TTFT (s) / TPOT (ms) / goodput per GPU at the band's ends, for a row the search ran at both; '-' otherwise."""
    if r.get("ttft_s_low") is None:
        return "-" if "band_error" not in r else "band runs failed"
    return (f"{_span(r, 'ttft_s')} s / {_span(r, 'tpot_s', 1e3)} ms / "
            f"{_span(r, 'goodput_requests_per_s_per_gpu')}")


def band_lines(r: dict, pct: str) -> list[str]:
    """The recommendation's error band in words: its figures at both ends and the checks each factor is from."""
    b = r.get("band")
    if not b:
        return []
    if r.get("ttft_s_low") is None:
        return [f"Error band: the runs at the band's ends failed ({r.get('band_error', 'no figures')})."]
    why = []
    for kind, words in (("decode", "decode step"), ("prefill", "step with a prefill chunk")):
        x = b.get(kind)
        why.append(f"every {words} x{x['low_factor']:.2f}-x{x['high_factor']:.2f} ({x['source']})" if x
                   else f"every {words} unscaled (no whole-step check of the kind)")
    slow = "yes" if r.get("meets_slo_slow_end") else "no"
    return [f"Error band: {pct} TTFT {_span(r, 'ttft_s')} s, {pct} TPOT {_span(r, 'tpot_s', 1e3)} ms, goodput "
            f"{_span(r, 'goodput_requests_per_s_per_gpu')} requests/s per GPU; meets the SLOs at the slow end: "
            f"{slow}. The serving simulation was run again at both ends of the step model's measured error: "
            + "; ".join(why) + "."]


# render._summary's figures a band is given for: label -> (key, display scale, unit, format)
TRAIN_SUMMARY = {"step time": ("step_time_s", 1.0, " s", ".3g"),
                 "tokens/s per GPU": ("tokens_per_s_per_gpu", 1.0, "", ",.1f"), "MFU": ("mfu", 100.0, " %", ".1f")}
SERVE_SUMMARY = {"p99 TTFT": ("ttft_p99_s", 1.0, " s", ".3g"), "p99 TPOT": ("tpot_p99_s", 1e3, " ms", ".3g"),
                 "goodput": ("goodput_requests_per_s", 1.0, " requests/s", ".4g"),
                 "output tokens/s per GPU": ("throughput_output_tokens_per_s_per_gpu", 1.0, "", ".4g")}


def _ranges(src: dict, spec: dict) -> str:
    """`step time 589-615 ms, MFU 17.7-19.3 %` of the figures of `spec` that have a band in `src`."""
    out = []
    for label, (key, scale, unit, fmt) in spec.items():
        if src.get(f"{key}_low") is None:
            continue
        if unit == " s" and src.get(key, src[key + "_low"]) < 1:  # as human_seconds: ms below 1 s
            scale, unit = 1e3, " ms"
        out.append(f"{label} {src[key + '_low'] * scale:{fmt}}-{src[key + '_high'] * scale:{fmt}}{unit}")
    return ", ".join(out)


def with_bands(res: Any, summary: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The report's headline figures followed by their error bands, one line per kind of figure with the checks
    the band comes from: the training step's (scaled by the training checks' envelope), the serving search
    answer's (its DES run again at both ends). The figures' own lines are kept as they are."""
    out = list(summary)
    if getattr(res, "training", None) is not None:
        from k3sim.planner.bands import plan_training_band

        tb = plan_training_band(res)
        if tb["step_band"] is not None:
            note = tb["step_band"]["not_checked"]
            out.append(("error band (training step)", f"{_ranges(tb, TRAIN_SUMMARY)}: from "
                        + tb["step_band"]["source"] + (f"; {note}" if note else "")))
    s = getattr(res, "serving_search", None)
    row = (s.recommendation or s.closest) if s is not None else None
    if row is not None and row.get("ttft_p99_s_low") is not None:
        checks = "; ".join(f"{k}: {v['source']}" for k, v in row["band"].items() if v)
        out.append(("error band (serving)", f"{_ranges(row, SERVE_SUMMARY)}: the simulation run again at both "
                    f"ends of the step model's error ({checks})"))
    return out


def search_sections(res: Any, fig_dir: Path) -> list[dict]:
    """The sections (none without a search): answer, runner-ups, front, pruning."""
    s = getattr(res, "serving_search", None)
    if s is None:
        return []
    from k3sim.report.render import _section

    pct = f"p{s.percentile}"
    head = ["#", "GPUs", "layout", f"{pct} TTFT (s)", f"{pct} TPOT (ms)", "goodput (req/s per GPU)",
            "output tokens/s per GPU", "prefix-cache token hit rate", "meets SLOs", "requests simulated",
            "error band: TTFT / TPOT / goodput"]
    best = s.recommendation or s.closest
    answer = [f"Traffic: {s.traffic}; SLOs: {pct} TTFT {s.slo_ttft_s:g} s, "
              f"{pct} TPOT {s.slo_tpot_s * 1e3:g} ms."]
    if best is not None:
        answer.append("Why: " + _why(best, s) + ".")
        answer += band_lines(best, pct)
    out = [_section("search", "Recommendation", s.verdict(), {"header": head, "rows": [_row(1, best, s)]}
                    if best is not None else None, extra=answer)]
    if len(s.top) > 1:
        rows = [_row(i + 1, r, s) for i, r in enumerate(s.top)]
        out.append(_section("search_top", "Runner-up layouts side by side",
                            f"the {len(s.finals)} finalists ran the whole traffic; the rest are their screening run "
                            f"on its first {s.screen_requests:,} requests", {"header": head, "rows": rows}))
    figs = []
    if s.screened and any(r["status"] == "ok" for r in s.screened):
        figs = [(_front_figure(s, fig_dir / "search_front.png"), "goodput per GPU against p99 TTFT")]
    pruned = [[k, f"{v:,}", s.examples.get(k, "")] for k, v in s.pruned.items()]
    out.append(_section("search_front", "Pareto front and what the search pruned",
                        f"{s.candidates:,} candidate fleets; {len(s.screened):,} simulated; "
                        f"{len(s.front)} on the front (no other simulated layout has both more goodput per GPU and "
                        f"a lower p99 TTFT); search time {s.wall_s:.1f} s",
                        {"header": ["pruned by", "candidates", "example"], "rows": pruned} if pruned else None,
                        figs=figs))
    return out


def _front_figure(s: Any, path: Path) -> Path:
    from k3sim.report.figures import _plt, _save

    plt = _plt()
    ok = [r for r in s.screened if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r["ttft_p99_s"] for r in ok], [r["goodput_requests_per_s_per_gpu"] for r in ok], s=12, alpha=0.45,
               color="tab:gray", label=f"simulated layouts ({len(ok)})")
    if s.front:
        ax.plot([r["ttft_p99_s"] for r in s.front], [r["goodput_requests_per_s_per_gpu"] for r in s.front], "o-",
                color="tab:red", ms=5, label="Pareto front")
    ax.axvline(s.slo_ttft_s, color="black", ls="--", lw=1, label=f"TTFT SLO {s.slo_ttft_s:g} s")
    ax.set_xscale("log")
    ax.set_xlabel("p99 TTFT (s, log scale)")
    ax.set_ylabel("goodput (requests/s per GPU)")
    ax.set_title("Serving search: goodput per GPU against p99 TTFT", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)
