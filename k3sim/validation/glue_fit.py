"""The training glue calibration fitted on profiled whole training steps (`k3sim check fit-glue`), and how far
it carries from one configuration to another (`glue_spread`, a section of reports/training/README.md).

The model side (`step/glue.py`) only reads the fitted file, `<measured dir>/training_glue.yaml`; fitting
needs the measurement harness's configurations and a run directory's profiled kernels, which is why it
lives here, beside the check it is tested by (`train_step.check_tables`: points not fitted are held out).

A configuration's factor is the ratio of summed seconds over the points it is fitted on (profiled glue
families minus the registry-measured calls among them, over the proxy-priced calls' predicted seconds; one
number per phase, no per-shape terms); a pooled factor is the mean of its configurations' factors
(`fit_pooled`). The committed file pools several configurations; `glue_spread` fits
each configuration alone at the same points (the spread) and, leaving each configuration out in turn, fits
the others and predicts the left-out configuration's whole steps (the error to expect on a configuration
that was never measured, such as the full K3 the planner prices).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from k3sim.step.families import PROXIED, kernel_family
from k3sim.step.glue import GlueCalibration, is_glue
from k3sim.validation.runs import run_file
from k3sim.validation.train_step import GPU_BOUND, parse_points, predict, slice_calls, spec_model

COMMAND = "k3sim check fit-glue"
# the profiled training runs (kernels.csv beside train_step.csv), in the order a point is looked up
PROFILED_RUNS = ("20261201-wholestep-train-b", "20261201-wholestep-train-c", "20261201-wholestep-train-d",
                 "20261201-wholestep-train-e")


def _kernels(path: str):
    """The training part of a run's kernels.csv with each kernel's family (read once per version of the file)."""
    f = run_file(Path(path), "kernels.csv", "profiled training whole-step")
    return _kernels_at(str(f), f.stat().st_mtime_ns)


@lru_cache(maxsize=8)
def _kernels_at(path: str, mtime_ns: int):
    import pandas as pd

    K = pd.read_csv(path)
    K = K[K.part == "train"]
    return K.assign(family=K.kernel.map(kernel_family))


def _profiled(run_dir, config: str, seq: int, mb: int):
    """The glue-family kernels profiled at one point of a run (empty when the point was not profiled)."""
    K = _kernels(str(run_dir))
    return K[(K.config == config) & (K.seq == seq) & (K.micro_batch == mb) & K.family.isin(PROXIED)]


def _sums(run_dir, config: str, seq: int, mb: int, hw: Any) -> tuple[float, float, float, float]:
    """(forward numerator, backward numerator, forward denominator, backward denominator) of one point: the
    profiled glue families less the registry-measured glue calls, and the proxy-priced glue calls' seconds."""
    from k3sim.errors import InputError

    g = _profiled(run_dir, config, seq, mb)
    if g.empty:
        raise InputError(f"{config} {seq}x{mb} was not profiled there", source=str(run_dir), field="points")
    prof_f = g[g.phase == "fwd"].gpu_s.sum()
    prof_b = g[g.phase == "fwd_bwd"].gpu_s.sum() - prof_f
    rows = [r for r in slice_calls(config, hw, seq, mb, None, None) if is_glue(r["op"])]
    return (prof_f - sum(r["fwd_s"] for r in rows if not r["proxy"]),
            prof_b - sum(r["bwd_s"] for r in rows if not r["proxy"]),
            sum(r["fwd_s"] for r in rows if r["proxy"]), sum(r["bwd_s"] for r in rows if r["proxy"]))


def _ratio(sums: list[tuple[float, float, float, float]]) -> tuple[float, float]:
    nf, nb, df, db = (float(sum(s[i] for s in sums)) for i in range(4))
    return round(nf / df, 4), round(nb / db, 4)


def fit_glue(run_dir, config: str, points: list[tuple[int, int]], hw: Any = "h200") -> dict:
    """Factors from the profiled `points` (seq, micro-batch) of one `config` in one training run directory."""
    from k3sim.configs import load_hardware

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    fwd, bwd = _ratio([_sums(run_dir, config, q, m, hw) for q, m in points])
    return dict(fwd=fwd, bwd=bwd, config=config, points=[f"{q}x{m}" for q, m in points], run=Path(run_dir).name)


def locate(run_dirs: list, points: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], Path]:
    """Each point's run: the first of `run_dirs` whose kernels.csv profiled it (InputError otherwise)."""
    from k3sim.errors import InputError

    dirs = [Path(d) for d in run_dirs]
    out = {}
    for cfg, q, m in points:
        hit = next((d for d in dirs if not _profiled(d, cfg, q, m).empty), None)
        if hit is None:
            raise InputError(f"{cfg} {q}x{m} was not profiled there", source=", ".join(map(str, dirs)),
                             field="points")
        out[(cfg, q, m)] = hit
    return out


def fit_pooled(run_dirs: list, points: list[tuple[str, int, int]], hw: Any = "h200") -> dict:
    """The pooled factors over `points` (config, seq, mb) of one or more configurations, each point from the
    first run of `run_dirs` that profiled it: each configuration's own factors (ratio of summed seconds at its
    points), and their mean, one weight per configuration (a ratio of sums over all points would let the
    27-layer whole model outweigh the 4-layer slices seven to one; the target is a configuration not measured,
    and each measured configuration is one sample of how the glue carries)."""
    from k3sim.configs import load_hardware

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    where = locate(run_dirs, points)
    sums = {p: _sums(where[p], *p, hw) for p in points}
    per = {}
    for cfg in dict.fromkeys(c for c, _, _ in points):
        f, b = _ratio([s for p, s in sums.items() if p[0] == cfg])
        per[cfg] = {"fwd": float(f), "bwd": float(b)}
    fwd, bwd = (round(sum(v[k] for v in per.values()) / len(per), 4) for k in ("fwd", "bwd"))
    names = [f"{c}:{q}x{m}" for c, q, m in points]
    return dict(fwd=float(fwd), bwd=float(bwd), points=names,
                runs={n: where[p].name for n, p in zip(names, points)}, per_config=per)


def write_glue_file(run_dirs, out, points: str, hw: Any = "h200") -> dict:
    """Fit on `points` ('CONFIG:SEQxMB,...', one or more configurations, each point once) found in `run_dirs`
    (one run directory or a list) and write the calibration file `out` (atomically) with its provenance, the
    command that wrote it included; returns the document."""
    import yaml

    from k3sim.errors import InputError
    from k3sim.files import atomic_write_text, check_output_file

    run_dirs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    pts = parse_points(points)
    if len(set(pts)) != len(pts):
        raise InputError("a point is given twice (it would count twice in the pooled fit)", source="--points")
    check_output_file(out, source="OUT")  # refused before the fit, not after
    doc = fit_pooled(run_dirs, pts, hw)
    doc["command"] = f"{COMMAND} {' '.join(map(str, run_dirs))} {out} --points {points}"
    atomic_write_text(out, f"# Written by `{COMMAND}`; refit instead of editing.\n# Factors on the HBM-copy "
                      "proxy time of the kernels the op registry has not measured, in training (step/glue.py): the "
                      "mean of per_config,\n# each configuration's own factors at its points (their range is the "
                      "spread, reports/training/README.md).\n"
                      + yaml.safe_dump(doc, sort_keys=False))
    return doc


# ------------------------------------------------------------------------------ spread and leave-one-out
def _steps(run_dirs: list):
    """Measured whole steps of the runs (status ok) with `gpu_bound` (profiled kernels >= GPU_BOUND of the
    step; only profiled points), one row per (config, seq, micro_batch, phase), the first run that has it."""
    import pandas as pd

    keys = ["config", "seq", "micro_batch", "phase"]
    rows = []
    for d in map(Path, run_dirs):
        T = pd.read_csv(run_file(d, "train_step.csv", "training whole-step"))
        T = T[T.status == "ok"][keys + ["seconds"]]
        k = _kernels(str(d)).groupby(keys).gpu_s.sum().rename("kernel_s").reset_index()
        rows.append(T.merge(k, on=keys).assign(run=d.name))
    S = pd.concat(rows, ignore_index=True).drop_duplicates(keys)
    return S.assign(gpu_bound=S.kernel_s >= GPU_BOUND * S.seconds)


def _errors(S, cal: GlueCalibration, hw: Any):
    """S (GPU-bound rows of one configuration) with `error`: predicted whole step / measured - 1 under `cal`."""
    import pandas as pd

    keys = ["config", "seq", "micro_batch", "phase"]
    pts = sorted({(r.config, int(r.seq), int(r.micro_batch)) for r in S.itertuples()})
    P = pd.DataFrame(predict(pts, hw, glue=cal))
    out = S.merge(P[keys + ["predicted_s"]], on=keys)
    return out.assign(error=out.predicted_s / out.seconds - 1)


def glue_spread(hw: Any = "h200", run_dirs: list | None = None, points: list[tuple[str, int, int]] | None = None):
    """Per-configuration factors, the pooled fit, its spread and leave-one-configuration-out errors.

    `points` default: the committed calibration file's (one per configuration). Returns a dict: `pooled`
    (fwd, bwd over all points), `spread` {"fwd": (min, max), "bwd": (min, max)} of the per-configuration
    factors, `configs`: one row per configuration (its fit point(s) and run, its own fwd / bwd, the range of
    the factors over all its profiled points `shape_fwd` / `shape_bwd`, and the whole-step errors at its
    GPU-bound points under three calibrations: its own factors (`own_*`), the pooled fit (`pooled_*`), and the
    fit of the other configurations alone (`loo_*`, with the fold's factors `loo_fwd` / `loo_bwd`), and the fit
    of the other model's configurations alone (`lomo_*`, factors `lomo_fwd` / `lomo_bwd`: a slice of the same
    model left in the fold is not a model never measured, which the planner's full K3 on another stack is
    closer to): mean signed (`_bias`), mean absolute (`_mape`) and largest absolute (`_max`) error)."""
    from k3sim.configs import load_hardware
    from k3sim.configs.profiles import profiles_dir
    from k3sim.step.glue import load_glue

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    base = profiles_dir() / "measured" / "h200"
    run_dirs = [base / r for r in PROFILED_RUNS] if run_dirs is None else [Path(d) for d in run_dirs]
    points = sorted(load_glue(hw).fit_shapes()) if points is None else points
    pooled = fit_pooled(run_dirs, points, hw)
    S = _steps(run_dirs)
    cal = GlueCalibration(pooled["fwd"], pooled["bwd"])
    model_of = {cfg: spec_model(cfg)[1].name for cfg in pooled["per_config"]}
    rows = []
    for cfg, own in pooled["per_config"].items():
        rest = [p for p in points if p[0] != cfg]
        fold = fit_pooled(run_dirs, rest, hw) if rest else None
        other = [p for p in points if model_of[p[0]] != model_of[cfg]]
        model_fold = fit_pooled(run_dirs, other, hw) if other else None
        shape = [fit_glue(d, c, [(q, m)], hw) for (c, q, m), d in _all_profiled(run_dirs, cfg).items()]
        gb = S[(S.config == cfg) & S.gpu_bound]
        row = dict(config=cfg, points=[n for n in pooled["points"] if n.rpartition(":")[0] == cfg],
                   run=sorted({pooled["runs"][n] for n in pooled["points"] if n.rpartition(":")[0] == cfg}),
                   fwd=own["fwd"], bwd=own["bwd"], profiled_points=len(shape),
                   shape_fwd=(min(s["fwd"] for s in shape), max(s["fwd"] for s in shape)),
                   shape_bwd=(min(s["bwd"] for s in shape), max(s["bwd"] for s in shape)), steps=len(gb))
        calibrations = [("own", GlueCalibration(own["fwd"], own["bwd"])), ("pooled", cal)]
        for name, f in (("loo", fold), ("lomo", model_fold)):
            if f is not None:
                row.update({f"{name}_fwd": f["fwd"], f"{name}_bwd": f["bwd"], "model": model_of[cfg]})
                calibrations.append((name, GlueCalibration(f["fwd"], f["bwd"])))
        for name, c in calibrations:
            e = _errors(gb, c, hw).error if len(gb) else None
            row[f"{name}_bias"] = float(e.mean()) if e is not None else float("nan")
            row[f"{name}_mape"] = float(e.abs().mean()) if e is not None else float("nan")
            row[f"{name}_max"] = float(e.abs().max()) if e is not None else float("nan")
        rows.append(row)
    spread = {k: (min(r[k] for r in rows), max(r[k] for r in rows)) for k in ("fwd", "bwd")}
    return dict(pooled={"fwd": pooled["fwd"], "bwd": pooled["bwd"]}, points=pooled["points"], spread=spread,
                configs=rows)


def _all_profiled(run_dirs: list, config: str) -> dict[tuple[str, int, int], Path]:
    """Every profiled point of `config` in the runs, each with the first run that profiled it."""
    out: dict[tuple[str, int, int], Path] = {}
    for d in map(Path, run_dirs):
        K = _kernels(str(d))
        for q, m in sorted({(int(a), int(b)) for a, b in K[K.config == config][["seq", "micro_batch"]].values}):
            out.setdefault((config, q, m), d)
    return out


def summary(doc: dict) -> str:
    """What `k3sim check fit-glue` prints: the pooled factors and each configuration's."""
    lines = [f"pooled over {len(doc['per_config'])} configuration(s), {len(doc['points'])} point(s): "
             f"x {doc['fwd']} forward, x {doc['bwd']} backward"]
    lines += [f"  {c}: x {f['fwd']} forward, x {f['bwd']} backward" for c, f in doc["per_config"].items()]
    return "\n".join(lines)


def glue_by_op(model, hw: Any, glues: dict, *, tp: int, ep: int, seq: int) -> dict[str, dict[str, float]]:
    """{op: {name: forward+backward seconds}} of the glue calls (`is_glue` or `FUSED_GLUE_OPS`) of one
    micro-batch of one `seq`-token sequence over every layer of `model` on one GPU of a TP x EP stage, under
    each calibration of `glues` ({name: GlueCalibration}); ops whose seconds are the same under all are left
    out. The step model's own calls and per-call costs (`step.training._call_costs`)."""
    from k3sim.step.batch import Batch
    from k3sim.step.calls import Timer
    from k3sim.step.glue import FUSED_GLUE_OPS
    from k3sim.step.layers import layer_calls
    from k3sim.step.layout import StepLayout
    from k3sim.step.training import _call_costs

    timer, lay, batch = Timer(hw), StepLayout(tp=tp, ep=ep), Batch(prefill=((seq, 0),))
    out: dict[str, dict[str, float]] = {}
    for i in range(model.num_layers):
        for c in layer_calls(model, i, lay, batch, "grouped_bf16"):
            if not (is_glue(c.op) or c.op in FUSED_GLUE_OPS) or c.hidden:
                continue
            row = out.setdefault(c.op, {k: 0.0 for k in glues})
            for k, g in glues.items():
                row[k] += sum(_call_costs(timer, c, g))
    return {op: v for op, v in out.items() if max(v.values()) - min(v.values()) > 1e-12}
