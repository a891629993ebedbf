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
    """A value in a report cell: times in s / ms / us, yes / no for a flag, "-" for none (no Python repr)."""
    import math

    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, (int, float)) and (_is_seconds(key) or key.endswith("_seconds")):
        return _s(float(v))
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _gb(b: float) -> str:
    """A size in a report table: binary units, as every table of the CLI prints them (`human_bytes`)."""
    from k3sim.output import human_bytes

    return human_bytes(b)


def _layout(p: dict) -> str:
    """The parallel layout as the field writes it: "TP8 PP16 (2 virtual stages) EP64 CP32 DP2" (a ZeRO stage
    other than the default 1 after it: ", ZeRO-3")."""
    parts = [f"TP{p.get('tp', 1)}", f"PP{p.get('pp', 1)}" + (f" ({p['virtual_stages']} virtual stages)"
                                                          if p.get("virtual_stages", 1) > 1 else "")]
    parts += [f"{k.upper()}{p[k]}" for k in ("ep", "cp", "dp") if p.get(k, 1) != 1]
    return " ".join(parts) + (f", ZeRO-{p['zero_stage']}" if p.get("zero_stage") not in (None, 1) else "")


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
    from k3sim.output import words
    from k3sim.report import figures as F

    mem = res.memory
    if mem is not None:
        rows = [(r.component, r.bytes) for r in mem.breakdown]
        p = F.memory_figure(rows, mem.hbm_bytes, f"{res.model} on {res.hardware}: per-GPU memory, pipeline stage "
                            f"{mem.worst_stage}", fig_dir / "memory.png")
        return [_section("memory", "Memory per GPU", res.verdict,
                         {"header": ["component", "per GPU", "source"],
                          "rows": [[words(r.component), _gb(r.bytes), r.source] for r in mem.breakdown]},
                         [(p, "memory breakdown")],
                         [_hbm_line(mem.hbm_bytes, mem.per_gpu_bytes.get("total"), fits=getattr(mem, "fits", True))])]
    if res.memory_rows:
        rows = [(r.component, r.bytes) for r in res.memory_rows]
        p = F.memory_figure(rows, res.hw.hbm_bytes, f"{res.model} on {res.hardware}: what the fullest GPU would "
                            "need (does not fit)", fig_dir / "memory.png")
        return [_section("memory", "Memory per GPU", res.verdict,
                         {"header": ["component", "per GPU", "source"],
                          "rows": [[words(r.component), _gb(r.bytes), r.source] for r in res.memory_rows]},
                         [(p, "memory breakdown of a layout that does not fit")],
                         [_hbm_line(res.hw.hbm_bytes, sum(r.bytes for r in res.memory_rows), fits=False)])]
    return [_section("memory", "Memory per GPU", res.verdict)]


def _hbm_line(hbm_bytes: float, used_bytes: float | None, fits: bool = True) -> str:
    """The capacity the table is held against: GiB as the table, the datasheet's GB beside it."""
    from k3sim.output import gib_with_gb

    verb = "holds" if fits else "would need"
    used = "" if used_bytes is None else \
        f"; the fullest GPU {verb} {_gb(used_bytes)} ({100 * used_bytes / hbm_bytes:.0f} %)"
    return f"HBM per GPU: {gib_with_gb(hbm_bytes)}{used}."


def _step_sections(res, fig_dir: Path) -> list[dict]:
    """Training step-time breakdown, each component with its share and the source of its number."""
    from k3sim.report import figures as F

    t = res.training
    if t is None:
        return []
    rows = [(r.component, r.seconds) for r in t.breakdown]
    p = F.breakdown_figure(rows, f"training step {t.step_time_s:.3g} s ({res.model}, {_layout(res.parallelism)})",
                           fig_dir / "step_breakdown.png")
    note = " ".join(x for x in (res.notes.get("step", ""), dominant_cost(t)) if x)
    return [_section("step", "Training step-time breakdown", note,
                     {"header": ["component", "seconds", "share", "source"],
                      "rows": [[r.component, f"{r.seconds:.4g}", f"{100 * r.seconds / t.step_time_s:.1f} %", r.source]
                               for r in t.breakdown]},
                     [(p, "step time breakdown")],
                     [f"Pipeline: {t.pipeline_source}."])]


# What each kind of breakdown row (`training.step.Row.kind`) is, in the words of the dominant-cost line.
COST_KINDS = {"compute": "compute", "cp": "context parallelism (CP)",
              "tp": "exposed TP communication", "ep": "EP (exposed all-to-all and load imbalance)",
              "pp": "pipeline sends", "dp": "exposed DP communication", "bubble": "the pipeline bubble",
              "optimizer": "the optimizer step"}


def dominant_cost(t) -> str:
    """The largest share of a training step by kind of cost, summed over the breakdown's rows of that kind
    (they add up to the step): "CP (...) is 75 % of a 1,048,576-token step: 116 s of 154 s"."""
    by: dict[str, float] = {}
    for r in t.breakdown:
        by[r.kind] = by.get(r.kind, 0.0) + r.seconds
    if not by or t.step_time_s <= 0:
        return ""
    kind, sec = max(by.items(), key=lambda kv: kv[1])
    return (f"Dominant cost: {COST_KINDS.get(kind, kind)} is {100 * sec / t.step_time_s:.0f} % of a "
            f"{t.seq_len_tokens:,}-token step ({_s(sec)} of {_s(t.step_time_s)}).")


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
    if res.mode != "serve":  # a section that does not apply is left out (plan.json's notes say why)
        return []
    if res.decode is None:
        return [_section("decode", "Decode roofline", res.notes["decode"])] if "decode" in res.notes else []
    from k3sim.decode.sweep import roofline_plot

    p = fig_dir / "decode_roofline.png"
    lay = res.decode_layout
    roofline_plot(res.decode, res.hw, p, f"{res.model} decode at {lay['context_tokens']:,} tokens, TP{lay['tp']} "
                                         f"PP{lay['pp']} EP{lay['ep']} on {res.hardware}")
    df = res.decode
    note = res.notes.get("decode", "k3sim.decode (step model, CUDA-graph convention)")
    return [_section("decode", "Decode roofline", f"{note}. {_decode_dominant(df, lay['context_tokens'])}",
                     {"header": ["batch", "TPOT", "tokens/s per GPU", "roofline", "fits memory", "largest cost"],
                      "rows": [[int(r.batch), _s(r.tpot_s), f"{r.tokens_per_s_per_gpu:,.1f}", r.roofline,
                                _fmt("", bool(r.fits_memory)), r.limiter] for r in df.itertuples()]},
                     [(p, "decode roofline")])]


def _decode_dominant(df, context: int) -> str:
    """The decode step's dominant cost at the largest batch that fits in memory (the serving step the fleet
    runs when full), from the sweep's own `limiter` (the component with the largest share of the busiest
    stage); the smallest batch's when none fits."""
    fits = [r for r in df.itertuples() if bool(r.fits_memory)]
    r = fits[-1] if fits else next(df.itertuples())
    where = "the largest batch that fits in memory" if fits else "the smallest batch (none fits in memory)"
    return (f"Dominant cost of a decode step at batch {int(r.batch)}, {where}, {context:,} tokens of context: "
            f"{r.limiter}; TPOT {_s(r.tpot_s)}.")


def _prefix_cache_sections(res, fig_dir: Path) -> list[dict]:
    """Prefix-cache hit rate by policy; only the note when the cache study was skipped."""
    from k3sim.report import figures as F

    if res.mode != "serve":  # does not apply: left out (plan.json's notes say why)
        return []
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
                     ([] if rows else ["No crossover within the lengths swept: one strategy wins throughout."])
                     + faster_cp_schemes(res))]


def faster_cp_schemes(res, min_gap: float = 0.05) -> list[str]:
    """Where the plan's own CP table (`res.cp_rows`, per layer, fwd + bwd, one rank) shows a scheme faster at
    the training scenario's sequence length and CP degree than the one the scenario runs (training.kda_cp /
    mla_cp; MLA K/V moved as the latent, `cp.model.DEFAULT_MLA_KV`, as the step model does), one line per
    layer kind saying so. A gap under `min_gap` (5 %, the near-tie threshold of `cp.sweep.crossovers`) is
    not a better choice. None for a serving scenario or one without CP (the table is then what CP would cost)."""
    from k3sim.cp.model import DEFAULT_MLA_KV
    from k3sim.cp.sweep import label

    t = res.training
    if t is None or res.parallelism.get("cp", 1) <= 1 or not res.cp_rows:
        return []
    S, opts = t.seq_len_tokens, t.options
    used = {"kda": (opts["kda_cp"], "-"),
            "mla": (opts["mla_cp"], "expanded" if opts["mla_cp"] == "ulysses" else DEFAULT_MLA_KV)}
    out = []
    for kind, (strategy, kv) in used.items():
        at = [r for r in res.cp_rows if r["seq_len"] == S and r["cp"] == res.cp_degree and r["layer"] == kind
              and not r["skipped"]]
        mine = next((r for r in at if r["strategy"] == strategy and r["mla_kv"] == kv), None)
        best = min(at, key=lambda r: r["time_s"], default=None)
        if mine is None or best is None or best["time_s"] >= (1 - min_gap) * mine["time_s"]:
            continue
        out.append(f"A faster {kind.upper()} scheme at this length: the plan's CP table has {label(best)} at "
                   f"{_s(best['time_s'])} per layer (fwd + bwd, one rank) against {_s(mine['time_s'])} for "
                   f"{label(mine)}, which the scenario uses ({100 * (1 - best['time_s'] / mine['time_s']):.0f} % "
                   f"less), at {S:,} tokens and P={res.cp_degree}; set training.{kind}_cp to try it.")
    return out


def _pipeline_sections(res, fig_dir: Path) -> list[dict]:
    """Pipeline Gantt chart when the step came from the event simulation; the closed form has no timeline."""
    from k3sim.report import figures as F

    t = res.training
    if res.mode != "train" or res.parallelism.get("pp", 1) == 1:  # no pipeline schedule: left out
        return []
    tl = getattr(getattr(t, "pipeline", None), "timeline", None) if t is not None else None
    if tl is None:
        return [_section("pipeline", "Pipeline schedule (Gantt)", res.notes.get("pipeline", "closed form used: no timeline"))]
    p = F.gantt_figure(tl, f"{_layout(res.parallelism)}: {t.num_micro_batches} micro-batches "
                           f"({t.pipeline_source})", fig_dir / "pipeline_gantt.png")
    return [_section("pipeline", "Pipeline schedule (Gantt)", f"bubble ratio {t.bubble_ratio:.3f}; step {_s(t.step_time_s)}",
                     None, [(p, "pipeline Gantt chart")])]


def _trust_sections(res) -> list[dict]:
    """Calibration error of the kernels the plan used and the assumptions behind it: what to trust."""
    from k3sim.kernels.validate import GOAL_MAPE  # each family's own goal (collectives 10 %, the rest 5 %)

    return [_section("calibration", "Calibration error of the kernels used", res.notes.get("calibration", ""),
                     {"header": ["op", "family", "points", "MAPE", "p90 abs. error", "max abs. error", "goal (MAPE)",
                                 "goal met"],
                      "rows": [[c["op"], c["family"], c["points"], f"{100 * c['mape']:.1f} %",
                                f"{100 * c['p90_abs_err']:.1f} %", f"{100 * c['max_abs_err']:.1f} %",
                                f"{100 * c.get('goal_mape', GOAL_MAPE[c['family']]):.0f} %",
                                _fmt("", bool(c["meets_goal"]))] for c in res.calibration]}
                     if res.calibration else None,
                     extra=["Kernel calls by source: " + "; ".join(f"{k['op']} {k['source']} x{k['calls']}"
                                                                   for k in res.kernel_calls)] if res.kernel_calls else []),
            _section("assumptions", "Assumptions and their sources", "",
                     {"header": ["assumption", "source"],
                      "rows": [[_assumption_words(res, a["assumption"]), a["source"]] for a in res.assumptions]})]


# A hardware profile's fields in the assumptions table, in words (`_assumption_words`).
HARDWARE_FIELDS = {"hbm_bytes": "HBM capacity per GPU", "hbm_bandwidth_bytes_per_s": "HBM bandwidth",
                   "peak_flops_per_s": "dense peak", "scaleup_bandwidth_bytes_per_s": "scale-up (NVLink) bandwidth "
                   "per GPU, one direction", "scaleup_domain_gpus": "GPUs in one scale-up domain",
                   "scaleout_bandwidth_bytes_per_s": "scale-out (NIC) bandwidth per GPU, one direction",
                   "num_sms": "SMs per GPU"}


def _hardware_value(field: str, v) -> str:
    """A profile value as a datasheet writes it: HBM in GiB with its GB, bandwidths in GB/s or TB/s, peaks in
    TFLOP/s per dtype, counts with separators."""
    from k3sim.output import gib_with_gb

    if field == "hbm_bytes":
        return gib_with_gb(float(v))
    if field.endswith("_bytes_per_s"):
        return f"{v / 1e12:,.2f} TB/s" if v >= 1e12 else f"{v / 1e9:,.0f} GB/s"
    if isinstance(v, dict):
        return ", ".join(f"{k} {x / 1e12:,.0f} TFLOP/s" for k, x in v.items())
    return f"{v:,}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _assumption_words(res, text: str) -> str:
    """The planner's assumption line, with a hardware field (`h200 hbm_bytes = 150109880320.0`, a dict of
    peaks) and the training knobs line (`... EP overlap None`) in words; any other line as written."""
    hw = res.hw
    for field, label in HARDWARE_FIELDS.items():
        if hw is not None and text == f"{hw.name} {field} = {getattr(hw, field, '')}":
            return f"{hw.name} {label}: {_hardware_value(field, getattr(hw, field))}"
    t = res.training
    o = getattr(t, "options", None) or {}
    if o and text == (f"routing skew {o['routing_skew']}, MoonEP redundant experts {o['redundant_experts']}, "
                      f"TP overlap {o['tp_overlap']}, EP overlap {o['ep_overlap']}"):
        ep = "from the pipeline schedule" if o["ep_overlap"] is None else f"{100 * o['ep_overlap']:.0f} %"
        return (f"routing skew (Zipf exponent) {o['routing_skew']:g}, MoonEP redundant experts "
                f"{o['redundant_experts']}, TP communication hidden {100 * o['tp_overlap']:.0f} %, EP all-to-all "
                f"hidden: {ep}")
    return text


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
