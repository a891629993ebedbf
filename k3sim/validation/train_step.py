"""The training whole-step check (issue 15 item 2): predictions made before the run
(`k3sim check train-predict`), the check after it (`k3sim check train`), and the glue calibration that is
carried from one configuration to another (fitted by `glue_fit`, `k3sim check fit-glue`).

The measured thing (`k3sim/calibration/wholestep/train_step.py`) is forward, and forward+backward, of a
layer slice at one rank's shapes (one GPU: no collectives). The prediction is the training step model's
own per-call costs (`step.training._call_costs` over `step.layers.layer_calls`, the layout the measured
model builds: MLA and LatentMoE down-projections whole on the rank), kept per call so that a miss can be
split by kernel family against a torch.profiler pass of the same point.

Glue: kernels the op registry has not measured (MoE permute/combine, routing sort and scatter, copies,
the small ops' backward) are priced by the HBM-copy proxy over the bytes they must move. The calibration
replaces that by `k x proxy` with one factor k per phase (forward; backward), each configuration's
k = profiled glue seconds / predicted glue seconds at its fit point, pooled as their mean over several
configurations (`glue_fit`). It is a per-byte efficiency of the implementation's glue, carried to other
shapes and configurations unchanged; points that did not fit k are the out-of-sample test, and
`glue_fit.glue_spread` leaves each configuration out in turn.
"""

from __future__ import annotations

from typing import Any, Callable

from k3sim.step.batch import Batch
from k3sim.step.calls import Timer
from k3sim.step.families import FAMILIES, OTHER, kernel_family, op_family
from k3sim.step.glue import GlueCalibration, is_glue
from k3sim.step.layers import embedding_calls, layer_calls
from k3sim.step.layout import StepLayout
from k3sim.step.training import COLLECTIVES, _call_costs, training_head_calls
from k3sim.validation.runs import run_file

PHASES = ("fwd", "fwd_bwd")


def train_calls(model, hw: Any, *, tp: int, ep: int, layers: list[int], seq: int, micro_batch: int,
                kernel_time: Callable | None = None, glue: GlueCalibration | None = None,
                embed_head: bool = False) -> list[dict]:
    """One row per call of the slice: op, component, forward / backward seconds, proxy or measured.
    `glue` as in `training_layer_costs` except that None here is the bytes-only proxy (the plain model)."""
    lay = StepLayout(tp=tp, ep=ep, expert_kernel="grouped_bf16", replicated_down_proj=True)
    timer = Timer(hw, kernel_time, "graph")
    batch = Batch(prefill=((seq, 0),) * micro_batch)
    calls = [(-1, c) for c in embedding_calls(model, batch)] if embed_head else []
    for i in layers:
        calls += [(i, c) for c in layer_calls(model, i, lay, batch, "grouped_bf16")]
    if embed_head:
        calls += [(model.num_layers, c) for c in training_head_calls(model, lay, batch)]
    rows = []
    for i, c in calls:
        if c.op in COLLECTIVES or c.hidden:
            continue
        f, bi, bw = _call_costs(timer, c, glue or GlueCalibration.proxy())
        proxy = timer.row(c, 0).source.startswith("proxy")
        rows.append(dict(layer=i, component=c.component, op=c.op, fwd_s=f, bwd_s=bi + bw, proxy=proxy,
                         glue=proxy and is_glue(c.op)))
    return rows


def spec_model(cfg: str):
    """(harness spec, model, 0-based layers) of a measured configuration of `specs.json`. The model is the
    harness's: without Block AttnRes (`attn_res_block_size` None), because the measured model runs no AttnRes
    read (calibration/wholestep/spec.py lists none; no run's manifest.json has one): pricing K3's AttnRes reads
    here put a kernel the GPU never ran into the prediction and the glue fit's denominator (found 2026-12-02)."""
    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_model

    spec = S.load_specs(S.SPECS_PATH)[cfg]
    model = load_model(spec.model).model_copy(update={"attn_res_block_size": None})
    return spec, model, [r["index"] - 1 for r in spec.layers]


def slice_calls(cfg: str, hw: Any, seq: int, mb: int, kernel_time: Callable | None,
                glue: GlueCalibration | None) -> list[dict]:
    """`train_calls` of a measured configuration of the whole-step harness (`specs.json`) at seq x mb."""
    spec, model, layers = spec_model(cfg)
    return train_calls(model, hw, tp=spec.tp, ep=spec.ep, layers=layers, seq=seq, micro_batch=mb,
                       kernel_time=kernel_time, glue=glue, embed_head=spec.embed_head)


def split(rows: list[dict]) -> dict[str, float]:
    """Seconds of a call list by phase and by part: 'glue' (proxy-priced calls the glue factors apply to)
    and 'measured' (everything else, including the gated norm's plain proxy)."""
    out = {"fwd_measured": 0.0, "fwd_glue": 0.0, "bwd_measured": 0.0, "bwd_glue": 0.0}
    for r in rows:
        part = "glue" if r["glue"] else "measured"
        out[f"fwd_{part}"] += r["fwd_s"]
        out[f"bwd_{part}"] += r["bwd_s"]
    return out


def predict(points, hw: Any = "h200", kernel_time: Callable | None = None,
            glue: GlueCalibration | None = None) -> list[dict]:
    """Rows (config, seq, micro_batch, phase, predicted_s, glue_s) for `points` = (config, seq, mb);
    `glue` None: the plain model (proxy bytes only)."""
    from k3sim.configs import load_hardware

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    out = []
    for cfg, seq, mb in points:
        s = split(slice_calls(cfg, hw, seq, mb, kernel_time, glue))
        fwd = s["fwd_measured"] + s["fwd_glue"]
        for phase, v, g in (("fwd", fwd, s["fwd_glue"]),
                            ("fwd_bwd", fwd + s["bwd_measured"] + s["bwd_glue"], s["fwd_glue"] + s["bwd_glue"])):
            out.append(dict(config=cfg, seq=seq, micro_batch=mb, phase=phase, predicted_s=v, glue_s=g))
    return out


def parse_points(text: str) -> list[tuple[str, int, int]]:
    """'CONFIG:SEQxMB,...' -> [(config, seq, mb)]; InputError naming --points otherwise."""
    from k3sim.calibration.wholestep import spec as S
    from k3sim.errors import InputError

    known = S.load_specs(S.SPECS_PATH)
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        cfg, _, sm = item.partition(":")
        q, _, m = sm.partition("x")
        if cfg not in known or not (q.isdigit() and m.isdigit() and int(q) > 0 and int(m) > 0):
            raise InputError(f"expected CONFIG:SEQxMB with a configuration of specs.json and positive numbers, "
                             f"got {item!r}", source="--points")
        out.append((cfg, int(q), int(m)))
    if not out:
        raise InputError("needs at least one CONFIG:SEQxMB point", source="--points")
    return out


# ----------------------------------------------------------------------------------------- checks
def family_prediction(cfg: str, seq: int, mb: int, hw: Any = "h200", kernel_time: Callable | None = None,
                      glue: GlueCalibration | None = None) -> dict[str, dict[str, float]]:
    """{phase: {kernel family: predicted seconds}} for one point (families of `step.families`)."""
    from k3sim.configs import load_hardware

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    out: dict[str, dict[str, float]] = {p: {} for p in PHASES}
    for r in slice_calls(cfg, hw, seq, mb, kernel_time, glue):
        fam = op_family(r["op"])
        out["fwd"][fam] = out["fwd"].get(fam, 0.0) + r["fwd_s"]
        out["fwd_bwd"][fam] = out["fwd_bwd"].get(fam, 0.0) + r["fwd_s"] + r["bwd_s"]
    return out


GPU_BOUND = 0.9  # a point whose profiled kernels fill >= 90 % of its measured time is GPU-bound


def check_tables(run_dir, hw: Any = "h200", kernel_time: Callable | None = None,
                 glue: GlueCalibration | None = None):
    """(steps, families) for a training run directory.

    steps: per measured point the seconds, the plain model's prediction and the glue-calibrated one
    (`glue`, default the profile's calibration), their errors, the profiled kernels' sum (GPU time)
    and `gpu_bound` (kernel sum >= 90 % of the step: else the host's launches set the pace, which the
    step model does not price), `held_out` (the point did not take part in fitting the glue).
    families: at profiled points each kernel family's predicted (plain) vs profiled GPU seconds."""
    from pathlib import Path

    import pandas as pd

    from k3sim.configs import load_hardware
    from k3sim.step.glue import load_glue

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    glue = glue or load_glue(hw)
    run_dir = Path(run_dir)
    T = pd.read_csv(run_file(run_dir, "train_step.csv", "training whole-step"))
    T = T[T.status == "ok"]
    keys = ["config", "seq", "micro_batch", "phase"]
    pts = sorted({(r.config, int(r.seq), int(r.micro_batch)) for r in T.itertuples()})
    P = pd.DataFrame(predict(pts, hw, kernel_time))
    G = pd.DataFrame(predict(pts, hw, kernel_time, glue=glue)).rename(columns={"predicted_s": "predicted_glue_s"})
    steps = T[keys + ["seconds", "host_s"]].merge(P[keys + ["predicted_s"]], on=keys)
    steps = steps.merge(G[keys + ["predicted_glue_s"]], on=keys)
    steps["error"] = steps.predicted_s / steps.seconds - 1
    steps["error_glue"] = steps.predicted_glue_s / steps.seconds - 1
    fit_pts = glue.fit_shapes()  # the same shape measured in another run is not held out either
    steps["held_out"] = [(r.config, int(r.seq), int(r.micro_batch)) not in fit_pts for r in steps.itertuples()]
    fams = []
    kpath = run_dir / "kernels.csv"
    if kpath.exists():
        K = pd.read_csv(kpath)
        K = K[K.part == "train"]
        K["family"] = K.kernel.map(kernel_family)
        for (cfg, seq, mb, phase), g in K.groupby(keys):
            pred = family_prediction(cfg, int(seq), int(mb), hw, kernel_time)[phase]
            meas = g.groupby("family").gpu_s.sum().to_dict()
            for fam in [f for f, _, _ in FAMILIES] + [OTHER]:
                fams.append(dict(config=cfg, seq=int(seq), micro_batch=int(mb), phase=phase, family=fam,
                                 predicted_s=pred.get(fam, 0.0), profiled_s=meas.get(fam, 0.0)))
            m = (steps.config == cfg) & (steps.seq == seq) & (steps.micro_batch == mb) & (steps.phase == phase)
            steps.loc[m, "profiled_kernel_sum_s"] = g.gpu_s.sum()
            steps.loc[m, "kernel_launches"] = int(g.calls.sum())
    if "profiled_kernel_sum_s" in steps:
        # unknown (NaN, not False) where the point was not profiled: neither GPU- nor host-bound
        gb = steps.profiled_kernel_sum_s >= GPU_BOUND * steps.seconds
        steps["gpu_bound"] = gb.astype(object).where(steps.profiled_kernel_sum_s.notna(), None)
        steps["error_glue_vs_kernels"] = steps.predicted_glue_s / steps.profiled_kernel_sum_s - 1
    return steps, pd.DataFrame(fams)


def write_predictions(out, points: str, *, glue: bool = False, both: bool = False, hw: Any = "h200") -> str:
    """`k3sim check train-predict OUT.csv --points ...`: predictions written (atomically) before a run;
    returns what to print. `glue`: with the profile's glue calibration (default the plain model); `both`:
    plain and glue-calibrated columns side by side (the layout of the committed prediction files)."""
    import pandas as pd

    from k3sim.configs import load_hardware
    from k3sim.files import atomic_write_text, check_output_file
    from k3sim.step.glue import load_glue

    pts = parse_points(points)
    check_output_file(out, source="OUT")  # refused before the work, not after
    hw = load_hardware(hw) if isinstance(hw, str) else hw
    cal = load_glue(hw) if glue else None
    df = pd.DataFrame(predict(pts, hw, glue=cal))
    if both:
        keys = ["config", "seq", "micro_batch", "phase"]
        g = pd.DataFrame(predict(pts, hw, glue=load_glue(hw)))
        df = df[keys + ["predicted_s"]].rename(columns={"predicted_s": "predicted_plain_s"}).merge(
            g.rename(columns={"predicted_s": "predicted_glue_s"}), on=keys)
    atomic_write_text(out, df.to_csv(index=False, float_format="%.6g"))
    return ((cal.source + "\n") if cal else "") + df.to_string(index=False)


def write_check(run_dir, out_dir, hw: Any = "h200") -> str:
    """`k3sim check train RUN OUT_DIR`: OUT_DIR/check_<run>.csv and families_<run>.csv (an output directory
    of kind "check", one part per run, so the checks of several runs share it); returns the steps table."""
    from pathlib import Path

    from k3sim.files import atomic_write_text, output_dir

    run = Path(run_dir).name
    with output_dir(out_dir, kind="check", source="OUT_DIR", part=f"train:{run}") as out:
        steps, fams = check_tables(run_dir, hw)
        atomic_write_text(out / f"check_{run}.csv", steps.to_csv(index=False, float_format="%.6g"))
        atomic_write_text(out / f"families_{run}.csv", fams.to_csv(index=False, float_format="%.6g"))
    return steps.to_string(index=False)
