"""Leave-one-out validation of the predictor over a profile's measured points.

Each measured shape is removed in turn; the op's model is refitted without it (warm-started from the
all-data fit) and the shape is predicted from the remaining points exactly as `predict_kernel_time`
would (interpolated inside the remaining range, model outside). Errors are relative to the
measured median. The goal (issue 3): MAPE <= 5 % for GEMM, HBM, grouped MoE, KDA and attention,
<= 10 % for collectives.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any

import numpy as np

from k3sim.kernels.ops import FAMILIES, OPS

GOAL_MAPE = {"gemm": 0.05, "hbm": 0.05, "moe": 0.05, "kda": 0.05, "attention": 0.05, "collective": 0.10}


def _refit(spec, pts, full_fit):
    """Refit one op on `pts` (a PointSet without the left-out shape), warm-started from the all-data fit."""
    from k3sim.kernels.fit import OpFit, fit_weights
    from k3sim.kernels.model import RooflineFit, fit_alpha_beta, levenberg_marquardt, roofline_residual

    out = OpFit(op=spec.name, points_used=len(pts.seconds))
    w = fit_weights(pts.sigma)
    if spec.kind == "collective":
        gpus = pts.params[:, spec.params.index("gpus")]
        for n in sorted(set(gpus.tolist())):
            m = gpus == n
            out.alpha_beta[int(n)] = fit_alpha_beta(pts.nbytes[m], pts.seconds[m], weights=w[m])
        for n, ab in full_fit.alpha_beta.items():  # a GPU count left with no points keeps its fit
            out.alpha_beta.setdefault(n, ab)
        return out
    rf = full_fit.roofline
    res = roofline_residual(pts.flop, pts.nbytes, pts.seconds, rf.peak_flops_per_s, rf.bandwidth_bytes_per_s,
                            weights=w, feats=pts.feats, steps=pts.steps if rf.step_s > 0 else None)
    th, _ = levenberg_marquardt(res, rf.to_theta(), prior_weight=1e-4)
    out.roofline = RooflineFit.from_theta(th, rf.peak_flops_per_s, rf.bandwidth_bytes_per_s, tuple(rf.eff_exponents),
                                          serial=rf.step_s > 0)
    return out


def leave_one_out(store, hw: Any, fitted=None, *, refit: bool = True, extrapolation: str | None = None,
                  ops: list[str] | None = None):
    """One row per measured shape: measured and predicted seconds, source, method, relative error."""
    import pandas as pd

    from k3sim.kernels.fit import fit_profile
    from k3sim.kernels.points import PointSet
    from k3sim.kernels.predict import EXTRAPOLATION, OpPredictor

    extrapolation = extrapolation or EXTRAPOLATION
    fitted = fitted or fit_profile(store, hw)
    rows = []
    for op in ops or store.ops():
        spec = OPS[op]
        table = store.points(op)
        pts = PointSet.from_points(spec, table)
        spread = table["spread"].to_numpy(float) if "spread" in table else np.zeros(len(table))
        warm = table["warmup"].to_numpy(bool) if "warmup" in table else np.zeros(len(table), bool)
        keys = list(spec.params)
        for i in range(len(pts.seconds) if len(pts.seconds) > 1 else 0):
            rest = pts.without(i)
            fit = _refit(spec, rest, fitted.ops[op]) if refit else fitted.ops[op]
            key = tuple(int(v) for v in pts.params[i])
            opp = OpPredictor(spec, rest, fit, hw, "leave-one-out fit")
            pred = opp.predict(dict(zip(keys, key)), extrapolation)
            model_s = opp.model_seconds(dict(zip(keys, key)))[0]
            measured = float(pts.seconds[i])
            method = pred.method
            rows.append({"family": spec.family, "op": op, "shape": " ".join(f"{k}={v}" for k, v in zip(keys, key)),
                         "measured_s": measured, "predicted_s": pred.seconds, "source": pred.source,
                         "method": method, "rel_err": pred.seconds / measured - 1.0,
                         "model_s": model_s, "model_rel_err": model_s / measured - 1.0,
                         "spread": float(spread[i]), "warmup": bool(warm[i])})
    return pd.DataFrame(rows, columns=["family", "op", "shape", "measured_s", "predicted_s", "source", "method",
                                       "rel_err", "model_s", "model_rel_err", "spread", "warmup"])


def leave_shape_out(store, hw: Any, *, ops: list[str] | None = None):
    """Harder than leave-one-out: a whole layer shape (every M of one GEMM (N, K), every T of one head
    count) is removed, the op refitted from scratch, and its points predicted: how the predictor does
    on a layer nobody measured. Ops without `shape_params`, or with one shape only, are skipped."""
    import pandas as pd

    from k3sim.kernels.fit import fit_op
    from k3sim.kernels.points import PointSet
    from k3sim.kernels.predict import OpPredictor

    rows = []
    for op in ops or store.ops():
        spec = OPS[op]
        pts = store.points(op)
        shape = list(spec.shape_params)
        if not shape or pts.groupby(shape).ngroups < 2:
            continue
        keys = list(spec.params)
        for _, sub in pts.groupby(shape):
            rest = pts.drop(index=sub.index)
            opp = OpPredictor(spec, PointSet.from_points(spec, rest), fit_op(spec, rest, hw), hw, "leave-shape-out")
            for _, r in sub.iterrows():
                p = {k: int(r[k]) for k in keys}
                pred = opp.predict(p)
                rows.append({"family": spec.family, "op": op, "shape": " ".join(f"{k}={v}" for k, v in p.items()),
                             "measured_s": float(r["seconds"]), "predicted_s": pred.seconds, "source": pred.source,
                             "rel_err": pred.seconds / float(r["seconds"]) - 1.0})
    return pd.DataFrame(rows, columns=["family", "op", "shape", "measured_s", "predicted_s", "source", "rel_err"])


def summarize_shapes(lso) -> "pd.DataFrame":
    import pandas as pd

    out = [{"op": op, "family": g["family"].iloc[0], "count": len(g), "mape": float(g["rel_err"].abs().mean()),
            "max_abs_err": float(g["rel_err"].abs().max())} for op, g in lso.groupby("op", sort=False)]
    return pd.DataFrame(out, columns=["family", "op", "count", "mape", "max_abs_err"])


REPEATABLE_SPREAD = 0.10  # a shape whose repetitions' p20-p80 spread is within 10 % of its median (a reporting choice)


def summarize(loo) -> "pd.DataFrame":
    """Per family and per op: count, MAPE, max |error|, how many came from interpolation, goal met."""
    import pandas as pd

    out = []
    for level, keys in (("family", ["family"]), ("op", ["family", "op"])):
        for k, g in loo.groupby(keys, sort=False):
            k = k if isinstance(k, tuple) else (k,)
            fam = k[0]
            err = g["rel_err"].abs()
            out.append({"level": level, "family": fam, "op": k[1] if len(k) > 1 else "(all)", "count": len(g),
                        "mape": float(err.mean()), "max_abs_err": float(err.max()),
                        "p90_abs_err": float(err.quantile(0.9)),
                        "interpolated": int((g["source"] == "interpolated").sum()),
                        "model_only_mape": float(g["model_rel_err"].abs().mean()),
                        "warmup_rows": int(g["warmup"].sum()),
                        "mape_no_warmup": float(err[~g["warmup"].astype(bool)].mean())
                        if (~g["warmup"].astype(bool)).any() else float("nan"),
                        "repeatable": int((g["spread"] <= REPEATABLE_SPREAD).sum()),
                        "mape_repeatable": float(err[g["spread"] <= REPEATABLE_SPREAD].mean())
                        if (g["spread"] <= REPEATABLE_SPREAD).any() else float("nan"),
                        "goal_mape": GOAL_MAPE[fam], "meets_goal": bool(err.mean() <= GOAL_MAPE[fam])})
    df = pd.DataFrame(out)
    if df.empty:
        return df
    order = {f: i for i, f in enumerate(FAMILIES)}
    df["_o"] = df["family"].map(order)
    return df.sort_values(["_o", "level", "op"], kind="stable").drop(columns="_o").reset_index(drop=True)


def ensure_out_dir(out_dir: Path) -> Path:
    """Create the report directory (before the slow leave-one-out, so a bad --out fails at once)."""
    from k3sim.errors import InputError

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create the report directory ({err.strerror or err.__class__.__name__})",
                         source=str(out_dir)) from None
    if not os.access(out_dir, os.W_OK):
        raise InputError("report directory is not writable", source=str(out_dir))
    return out_dir


def markdown(summary, meta: dict, loo=None, shapes=None) -> str:
    lines = [f"# Kernel-time leave-one-out validation: {meta['profile']}", "",
             f"Generated {meta['date']} by `k3sim calibrate validate`; data fingerprint `{meta['fingerprint']}`; "
             f"runs: {', '.join(meta['runs'])}.", "",
             "Each measured shape is left out, the op's model refitted without it, and the shape predicted from "
             "the rest (interpolated inside the remaining range, fitted model outside). Error = predicted / "
             "measured - 1. *model only*: the refitted model alone, without the interpolated residual (how well "
             "the fitted roofline / alpha-beta generalises on its own).", "",
             "*repeatable*: the shapes whose own repetitions agree (p20-p80 spread within "
             f"{100 * REPEATABLE_SPREAD:.0f} % of the median), and the MAPE over those alone; the rest are "
             "shapes whose medians scatter. *warm-up*: rows the harness cut below its base 25 repetitions "
             "although the kernel is short (the warm-up before them compiled), and the MAPE without them. The goal is judged on MAPE over all shapes.", "",
             "| family | op | count | MAPE | max abs err | p90 abs err | interpolated | model only MAPE "
             "| repeatable | MAPE repeatable | warm-up | MAPE w/o warm-up | goal | met |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for _, r in summary.iterrows():
        name = f"**{r['family']}**" if r["level"] == "family" else r["family"]
        lines.append(f"| {name} | {r['op']} | {r['count']} | {100 * r['mape']:.2f} % | {100 * r['max_abs_err']:.1f} % "
                     f"| {100 * r['p90_abs_err']:.1f} % | {r['interpolated']} | {100 * r['model_only_mape']:.1f} % "
                     f"| {r['repeatable']} | {100 * r['mape_repeatable']:.2f} % | {r['warmup_rows']} "
                     f"| {100 * r['mape_no_warmup']:.2f} % | {100 * r['goal_mape']:.0f} % "
                     f"| {'yes' if r['meets_goal'] else 'no'} |")
    if shapes is not None and len(shapes):
        lines += ["", "## Leave-shape-out", "",
                  "A whole layer shape left out at once (all M of one GEMM (N, K); all B of one MoE expert "
                  "shape; all T of one KDA head count or one SDPA (H, D)), the op refitted without it: the "
                  "error on a layer that was never measured.", "",
                  "| family | op | count | MAPE | max abs err |", "|---|---|---:|---:|---:|"]
        for _, r in shapes.iterrows():
            lines.append(f"| {r['family']} | {r['op']} | {r['count']} | {100 * r['mape']:.2f} % "
                         f"| {100 * r['max_abs_err']:.1f} % |")
    lines += three_figures(summary, shapes)
    if loo is not None and len(loo):
        lines += ["", "## Largest errors per family", "",
                  "| family | op | shape | measured | predicted | error | spread p20-p80 | method |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        worst = loo.assign(_a=loo["rel_err"].abs()).sort_values("_a", ascending=False).groupby("family", sort=False).head(3)
        for _, r in worst.iterrows():
            lines.append(f"| {r['family']} | {r['op']} | {r['shape']} | {1e6 * r['measured_s']:.1f} us "
                         f"| {1e6 * r['predicted_s']:.1f} us | {100 * r['rel_err']:+.1f} % | {100 * r['spread']:.0f} % "
                         f"| {r['method']} |")
    return "\n".join(lines) + "\n"


def three_figures(summary, shapes=None) -> list[str]:
    """Markdown lines: per op, leave-one-out, the fitted model alone and leave-shape-out side by side (which
    to quote depends on the question: a shape between measured ones, a shape outside the grid, a layer
    shape nobody measured)."""
    ops = summary[summary["level"] == "op"]
    if ops.empty:
        return []
    lso = {} if shapes is None or not len(shapes) else dict(zip(shapes["op"], shapes["mape"]))
    lines = ["", "## Three figures per op", "",
             "*Leave-one-out* predicts a measured shape from its neighbours (interpolation inside the grid); "
             "*fitted model alone* is the same left-out shape from the refitted model without the interpolated "
             "residual (what a shape outside the grid gets); *leave-shape-out* removes a whole layer shape (one "
             "GEMM (N, K), one MoE expert shape, one KDA head count, one SDPA (H, D)): the figure for a new layer "
             "shape.", "",
             "| op | shapes | leave-one-out | fitted model alone | leave-shape-out |", "|---|---:|---:|---:|---:|"]
    for _, r in ops.iterrows():
        shape = f"{100 * lso[r['op']]:.1f} %" if r["op"] in lso else "-"
        lines.append(f"| {r['op']} | {r['count']} | {100 * r['mape']:.1f} % | {100 * r['model_only_mape']:.1f} % "
                     f"| {shape} |")
    return lines


def write_report(loo, summary, out_dir: Path, meta: dict, shapes=None) -> list[Path]:
    """`validation.md` (tables), `validation.csv` (LOO summary), `validation_points.csv` (every LOO
    point) and, when given, `validation_shapes.csv` (the leave-shape-out summary)."""
    from k3sim.files import atomic_write_text  # temp file, then rename

    out_dir = ensure_out_dir(out_dir)
    # every file rendered before the first is written: a rendering error leaves the old report whole
    texts = {"validation.md": markdown(summary, meta, loo, shapes),
             # the fingerprint of the data it was built from, on every row: the planner reads this table and
             # labels it stale when the measurements changed since (planner.plan.validation_staleness)
             "validation.csv": summary.assign(data_fingerprint=meta["fingerprint"]).to_csv(index=False,
                                                                                          float_format="%.6g"),
             "validation_points.csv": loo.to_csv(index=False, float_format="%.6g")}
    if shapes is not None:
        texts["validation_shapes.csv"] = shapes.to_csv(index=False, float_format="%.6g")
    for name, text in texts.items():
        atomic_write_text(out_dir / name, text)
    return [out_dir / name for name in texts]


def data_fingerprint(hw: Any) -> str:
    """The fingerprint of the profile's measured data (`MeasurementStore.fingerprint`: every op CSV's name
    and bytes) that `validate_profile` writes into its tables, "" for a profile without measured data."""
    from k3sim.configs.profiles import measured_dir
    from k3sim.kernels.store import load_store

    d = measured_dir(hw)
    return "" if d is None else load_store(d).fingerprint


def validate_profile(hw: Any, *, refit: bool = True, progress=None) -> tuple[Any, Any, dict, Any]:
    """Load the profile's store, leave-one-out every op and leave-shape-out where an op has several
    shapes; returns (LOO points table, LOO summary, meta, leave-shape-out summary). `progress(done, total)`,
    if given, is called after each op of each pass (2 x ops in all; minutes on the H200 store): the ops run
    one at a time through the same functions, so the tables are those of one call over every op."""
    import pandas as pd

    from k3sim.errors import InputError
    from k3sim.kernels.fit import fit_profile
    from k3sim.configs.profiles import measured_dir
    from k3sim.kernels.store import load_store

    d = measured_dir(hw)
    if d is None:
        raise InputError(f"profile '{hw.name}' has no measured data to validate against", field="calibration_dir")
    store = load_store(d, hardware=hw)
    fitted, ops = fit_profile(store, hw), list(store.ops())

    def each(fn, offset: int) -> "pd.DataFrame":
        parts = []
        for i, op in enumerate(ops):
            parts.append(fn(op))
            if progress:
                progress(offset + i + 1, 2 * len(ops))
        full = [p for p in parts if not p.empty]
        return pd.concat(full, ignore_index=True) if full else parts[0] if parts else fn(None)

    loo = each(lambda op: leave_one_out(store, hw, fitted, refit=refit, ops=[op] if op else None), 0)
    if loo.empty:  # an empty table would read as a result
        raise InputError("no op has two or more measured shapes: nothing to leave one out", source=str(d))
    meta = {"profile": str(hw.name), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "fingerprint": store.fingerprint, "runs": sorted(store.runs)}
    lso = each(lambda op: leave_shape_out(store, hw, ops=[op] if op else None), len(ops))
    return loo, summarize(loo), meta, summarize_shapes(lso)
