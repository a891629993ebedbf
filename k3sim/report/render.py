"""Render a plan into `report.md`, `report.html`, `plan.json` and `figures/*.png` in one directory.

The directory goes through `k3sim.files.output_dir` (kind `plan`): the report is built in a staging
directory and moved into place at the end, so a failed run (bad input, a crash while drawing, Ctrl-C)
leaves the previous report untouched and no half report; an existing directory that is not empty and not a
previous plan report is refused, and a file k3sim did not write in it is never touched.
"""

from __future__ import annotations

import json
from pathlib import Path

GB = 1e9
KIND = "plan"  # the output kind of a report directory (k3sim.files manifest)


def check_out_dir(out: str | Path, source: str = "--out") -> None:
    """Refuse a report directory k3sim may not write, before any work is done."""
    from k3sim.files import check_output_dir

    check_output_dir(out, kind=KIND, source=source)


def _s(x: float) -> str:
    from k3sim.output import human_seconds

    return human_seconds(x)


def _is_seconds(key: str) -> bool:
    """`ttft_p99_s` is a time; `goodput_requests_per_s` is a rate."""
    return key.endswith("_s") and not key.endswith("per_s")


def _fmt(key: str, v) -> str:
    if isinstance(v, float):
        return _s(v) if _is_seconds(key) else f"{v:.4g}"
    return str(v)


def _gb(b: float) -> str:
    return f"{b / GB:.2f} GB"


def _layout(p: dict) -> str:
    keys = ("tp", "pp", "virtual_stages", "ep", "cp", "dp", "zero_stage")
    return ", ".join(f"{k}={p[k]}" for k in keys if k in p and (p[k] != 1 or k in ("tp", "pp")))


def _section(id_, title, note="", table=None, figs=(), extra=()) -> dict:
    """One report section as the templates read it; figure paths are relative to the report directory so
    the report can be moved or served whole."""
    return {"id": id_, "title": title, "note": note, "table": table,
            "figures": [{"path": f"figures/{Path(p).name}", "alt": a} for p, a in figs],
            "extra": list(extra)}


def _summary(res) -> list[tuple[str, str]]:
    """The headline numbers at the top of the report: the training step, then the serving SLO figures, so a
    reader sees the answer before the sections that explain it."""
    summary: list[tuple[str, str]] = []
    t = res.training
    if t is not None:
        summary += [("step time", _s(t.step_time_s)), ("tokens per step", f"{t.tokens_per_step:,}"),
                    ("tokens/s", f"{t.tokens_per_s:,.0f}"), ("tokens/s per GPU", f"{t.tokens_per_s_per_gpu:,.1f}"),
                    ("MFU", f"{100 * t.mfu:.1f} %"), ("micro-batches", str(t.num_micro_batches)),
                    ("bubble ratio", f"{t.bubble_ratio:.3f}"), ("EP load imbalance (max/mean)", f"{t.ep_imbalance:.3f}")]
    if res.serving:
        for k, label in (("goodput_requests_per_s", "goodput (requests/s within the SLOs)"),
                         ("throughput_output_tokens_per_s_per_gpu", "output tokens/s per GPU"),
                         ("ttft_p99_s", "p99 TTFT"), ("tpot_p99_s", "p99 TPOT")):
            if k in res.serving:
                summary.append((label, _fmt(k, res.serving[k])))
    from k3sim.report.search import with_bands  # each figure's error band and the checks it comes from

    return with_bands(res, summary)


def _memory_sections(res, fig_dir: Path) -> list[dict]:
    """Memory per GPU: the fitting layout's breakdown, or, when nothing fits, what the fullest GPU would
    need, so a refused plan still shows why."""
    from k3sim.report import figures as F

    mem = res.memory
    if mem is not None:
        rows = [(r.component, r.bytes) for r in mem.breakdown]
        p = F.memory_figure(rows, mem.hbm_bytes, f"{res.model} on {res.hardware}: per-GPU memory, pipeline stage "
                            f"{mem.worst_stage}", fig_dir / "memory.png")
        return [_section("memory", "Memory per GPU", res.verdict,
                         {"header": ["component", "bytes per GPU", "source"],
                          "rows": [[r.component, _gb(r.bytes), r.source] for r in mem.breakdown]},
                         [(p, "memory breakdown")])]
    if res.memory_rows:
        rows = [(r.component, r.bytes) for r in res.memory_rows]
        p = F.memory_figure(rows, res.hw.hbm_bytes, f"{res.model} on {res.hardware}: what the fullest GPU would "
                            "need (does not fit)", fig_dir / "memory.png")
        return [_section("memory", "Memory per GPU", res.verdict,
                         {"header": ["component", "bytes per GPU", "source"],
                          "rows": [[r.component, _gb(r.bytes), r.source] for r in res.memory_rows]},
                         [(p, "memory breakdown of a layout that does not fit")])]
    return [_section("memory", "Memory per GPU", res.verdict)]


def _step_sections(res, fig_dir: Path) -> list[dict]:
    """Training step-time breakdown, each component with its share and the source of its number."""
    from k3sim.report import figures as F

    t = res.training
    if t is None:
        return []
    rows = [(r.component, r.seconds) for r in t.breakdown]
    p = F.breakdown_figure(rows, f"training step {t.step_time_s:.3g} s ({res.model}, {_layout(res.parallelism)})",
                           fig_dir / "step_breakdown.png")
    return [_section("step", "Training step-time breakdown", res.notes.get("step", ""),
                     {"header": ["component", "seconds", "share", "source"],
                      "rows": [[r.component, f"{r.seconds:.4g}", f"{100 * r.seconds / t.step_time_s:.1f} %", r.source]
                               for r in t.breakdown]},
                     [(p, "step time breakdown")],
                     [f"Pipeline: {t.pipeline_source}."])]


def _layer_ranges(layers: list[int]) -> str:
    """1-based layers as runs: [1, 2, 3, 33, 34] -> "1-3, 33-34"."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _stage_sections(res) -> list[dict]:
    """Per pipeline stage of the training step, one micro-batch: its layers, forward, backward, recompute,
    exposed communication (with the EP imbalance) and their sum, so a reader sees which stage the step waits
    on and how the layers were split."""
    t = res.training
    if t is None or len(t.stages) < 2:
        return []
    per = [s["per_micro_batch_s"] for s in t.stages]
    slow = max(range(len(per)), key=per.__getitem__)
    how = "by cost (balanced)" if t.stage_split == "balanced" else "by layer count (uniform)"
    note = (f"layers split {how}; the slowest stage, {slow}, takes {_s(per[slow])} per micro-batch, "
            f"{max(per) / min(per):.2f} x the fastest ({_s(min(per))}); stages numbered from 0, layers from 1")
    rows = [[str(s["stage"]), _layer_ranges(s["layers"]), _s(s["forward_s"]), _s(s["backward_s"]),
             _s(s["recompute_s"]), _s(sum(s["exposed_comm_s"].values()) + s["imbalance_s"]),
             _s(s["per_micro_batch_s"])] for s in t.stages]
    return [_section("stages", "Pipeline stages (one micro-batch)", note,
                     {"header": ["stage", "layers", "forward", "backward", "recompute",
                                 "exposed comm + EP imbalance", "per micro-batch"], "rows": rows})]


def _serving_sections(res, fig_dir: Path) -> list[dict]:
    """Serving latency and goodput (serve mode only); the note says why when the serving run is missing."""
    if res.mode != "serve":
        return []
    srv = res.serving
    if not srv:
        return [_section("serving", "Serving latency and goodput", res.notes.get("serving", "not available"))]
    rows = [[label, _fmt(k, srv[k])] for k, label in SERVING_ROWS if k in srv]
    extra = []
    if srv.get("overloaded"):  # latency percentiles of a growing queue are not an answer: the rate that is
        extra.append(f"Overloaded: {srv.get('offered_rate_per_s', float('nan')):.3g} requests/s offered, about "
                     f"{srv.get('sustainable_rate_per_s', float('nan')):.3g} requests/s sustainable; the latency "
                     "figures above are those of a queue that keeps growing.")
    extra += [f"Warning: {w}" for w in srv.get("warnings", []) or []]
    figs = []
    if res.serving_frame is not None and len(res.serving_frame):
        from k3sim.serving.report import plot_latency_cdfs

        p = fig_dir / "serving_latency.png"
        plot_latency_cdfs(res.serving_frame, p, f"{res.scenario}: latency CDFs (serving sample)")
        figs.append((p, "serving latency CDFs"))
    return [_section("serving", "Serving latency and goodput", res.notes.get("serving", ""),
                     {"header": ["quantity", "value"], "rows": rows}, figs, extra)]


# the serving figures of the report, in the field's words (JSON keys stay in plan.json)
SERVING_ROWS = (("requests", "requests simulated"), ("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99"),
                ("tpot_p50_s", "TPOT p50"), ("tpot_p99_s", "TPOT p99"), ("e2e_p50_s", "end-to-end latency p50"),
                ("e2e_p99_s", "end-to-end latency p99"), ("throughput_requests_per_s", "throughput (requests/s)"),
                ("throughput_output_tokens_per_s_per_gpu", "output tokens/s per GPU"),
                ("goodput_requests_per_s", "goodput (requests/s within both SLOs)"),
                ("token_hit_rate", "prefix-cache token hit rate"), ("slo_ttft_s", "TTFT SLO"),
                ("slo_tpot_s", "TPOT SLO"), ("sim_seconds", "simulated time"))


def _decode_sections(res, fig_dir: Path) -> list[dict]:
    """Decode roofline by batch; only the note when the decode sweep was skipped, so the reader learns why."""
    if res.decode is None:
        return [_section("decode", "Decode roofline", res.notes["decode"])] if "decode" in res.notes else []
    from k3sim.decode.sweep import roofline_plot

    p = fig_dir / "decode_roofline.png"
    lay = res.decode_layout
    roofline_plot(res.decode, res.hw, p, f"{res.model} decode at {lay['context_tokens']} tokens, TP{lay['tp']} "
                                         f"PP{lay['pp']} EP{lay['ep']} on {res.hardware}")
    df = res.decode
    return [_section("decode", "Decode roofline", res.notes.get("decode", "k3sim.decode (step model, CUDA-graph convention)"),
                     {"header": ["batch", "TPOT", "tokens/s per GPU", "roofline", "fits memory"],
                      "rows": [[int(r.batch), _s(r.tpot_s), f"{r.tokens_per_s_per_gpu:,.1f}", r.roofline, str(r.fits_memory)]
                               for r in df.itertuples()]},
                     [(p, "decode roofline")])]


def _prefix_cache_sections(res, fig_dir: Path) -> list[dict]:
    """Prefix-cache hit rate by policy; only the note when the cache study was skipped."""
    from k3sim.report import figures as F

    if res.prefix_cache is None:
        return [_section("prefix_cache", "Prefix-cache hit rate", res.notes["prefix_cache"])] \
            if "prefix_cache" in res.notes else []
    p = F.prefix_cache_figure(res.prefix_cache, f"{res.model}: prefix-cache hit rate by policy",
                              fig_dir / "prefix_cache.png")
    return [_section("prefix_cache", "Prefix-cache hit rate", res.notes.get("prefix_cache", ""),
                     {"header": ["policy", "hash block", "physical block", "token hit rate", "request hit rate", "note"],
                      "rows": [[r["policy"], r.get("hash_block_tokens", ""), r.get("physical_block_tokens", ""),
                                f"{r['token_hit_rate']:.3f}" if "token_hit_rate" in r else "",
                                f"{r['request_hit_rate']:.3f}" if "request_hit_rate" in r else "", r.get("note", "")]
                               for r in res.prefix_cache]},
                     [(p, "prefix cache hit rate")])]


def _cp_sections(res, fig_dir: Path) -> list[dict]:
    """Context-parallel strategy crossover lengths; says so when one strategy wins at every length swept."""
    if getattr(res, "cp_kinds", None):
        rows = [[f"{r['seq_len']:,}", r["kind"], r["scheme"], str(r["layers"]), _s(r["step_time_s"]),
                 f"{100 * r['share']:.0f} %"] for r in res.cp_kinds]
        return [_section("cp", f"Context parallelism by layer kind (P={res.cp_degree})", res.notes.get("cp", ""),
                         {"header": ["sequence (tokens)", "layer kind", "scheme", "layers", "CP step (fwd+bwd)",
                                     "share of the CP step"], "rows": rows})]
    if not res.cp_rows:
        return [_section("cp", "Context parallelism crossover", res.notes["cp"])] if "cp" in res.notes else []
    from k3sim.configs.dtypes import bytes_per_element
    from k3sim.cp.sweep import plot_crossover

    p = fig_dir / "cp_crossover.png"
    plot_crossover(res.cp_rows, res.cp_degree, res.cp_geometry, p, bytes_per_element("fp32"))
    rows = [[k.upper(), f"{c['a']} / {c['b']}", f"{c['seq_len']:,.0f}", c["faster_above"]]
            for k, cs in (res.cp_crossovers or {}).items() for c in cs]
    return [_section("cp", f"Context parallelism crossover (P={res.cp_degree})", res.notes.get("cp", ""),
                     {"header": ["layer", "strategies", "crossover length (tokens)", "faster above"], "rows": rows} if rows else None,
                     [(p, "CP crossover")],
                     [] if rows else ["No crossover within the lengths swept: one strategy wins throughout."])]


def _pipeline_sections(res, fig_dir: Path) -> list[dict]:
    """Pipeline Gantt chart when the step came from the event simulation; the closed form has no timeline."""
    from k3sim.report import figures as F

    t = res.training
    tl = getattr(getattr(t, "pipeline", None), "timeline", None) if t is not None else None
    if tl is None:
        return [_section("pipeline", "Pipeline schedule (Gantt)", res.notes.get("pipeline", "closed form used: no timeline"))]
    p = F.gantt_figure(tl, f"{_layout(res.parallelism)}: {t.num_micro_batches} micro-batches "
                           f"({t.pipeline_source})", fig_dir / "pipeline_gantt.png")
    return [_section("pipeline", "Pipeline schedule (Gantt)", f"bubble ratio {t.bubble_ratio:.3f}; step {_s(t.step_time_s)}",
                     None, [(p, "pipeline Gantt chart")])]


def _trust_sections(res) -> list[dict]:
    """Calibration error of the kernels the plan used and the assumptions behind it: what to trust."""
    return [_section("calibration", "Calibration error of the kernels used", res.notes.get("calibration", ""),
                     {"header": ["op", "points", "MAPE", "p90 |err|", "max |err|", "meets 5 % goal"],
                      "rows": [[c["op"], c["points"], f"{100 * c['mape']:.1f} %", f"{100 * c['p90_abs_err']:.1f} %",
                                f"{100 * c['max_abs_err']:.1f} %", str(c["meets_goal"])] for c in res.calibration]}
                     if res.calibration else None,
                     extra=["Kernel calls by source: " + "; ".join(f"{k['op']} {k['source']} x{k['calls']}"
                                                                   for k in res.kernel_calls)] if res.kernel_calls else []),
            _section("assumptions", "Assumptions and their sources", "",
                     {"header": ["assumption", "source"], "rows": [[a["assumption"], a["source"]] for a in res.assumptions]})]


def build_context(res, fig_dir: Path) -> dict:
    """Tables and figures of every section (figures drawn into `fig_dir`), in report order."""
    from k3sim.report.budget import budget_sections
    from k3sim.report.search import search_sections

    # the answer first (a search's recommendation, a token budget's cluster), then the sections that explain it
    sections = (search_sections(res, fig_dir) + budget_sections(res) + _memory_sections(res, fig_dir)
                + _step_sections(res, fig_dir) + _stage_sections(res)
                + _serving_sections(res, fig_dir)
                + _decode_sections(res, fig_dir) + _prefix_cache_sections(res, fig_dir) + _cp_sections(res, fig_dir)
                + _pipeline_sections(res, fig_dir) + _trust_sections(res))
    timings = ", ".join(f"{k} {v:.2f} s" for k, v in res.timings_s.items())
    return {"r": res, "layout": _layout(res.parallelism), "summary": _summary(res), "sections": sections,
            "timings": timings}


def _env():
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("k3sim.report", "templates"),
                              autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True,
                              lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def write_report(res, out: str | Path, source: str = "--out") -> list[Path]:
    """Write the report directory whole (`k3sim.files.output_dir`); returns the paths written (final
    locations). Opened already by the caller (`k3sim plan` opens it before planning), it joins that."""
    from k3sim.files import atomic_write_text, output_dir

    out = Path(out)
    with output_dir(out, kind=KIND, source=source):
        ctx = build_context(res, out / "figures")
        env = _env()
        texts = {"report.md": env.get_template("report.md.j2").render(**ctx),
                 "report.html": env.get_template("report.html.j2").render(**ctx),
                 "plan.json": json.dumps(res.to_json(), indent=2) + "\n"}
        for name, text in texts.items():
            atomic_write_text(out / name, text)
    return sorted([out / n for n in texts] + [out / "figures" / Path(f["path"]).name
                                             for sec in ctx["sections"] for f in sec["figures"]])
