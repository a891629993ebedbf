"""The serving whole-step check: predictions for the whole-step measurements
(`k3sim/calibration/wholestep/`: CUDA-graph decode steps, eager mixed prefill steps on one GPU), made before
they run (`k3sim check decode-predict`), and predicted vs measured after (`k3sim check decode`).

Two predictions per point, both from the one kernel predictor under the CUDA-graph convention:
- `model`: the step model itself (`forward_step` machinery over the measured configuration's layers:
  the same layout, down-projections whole on the rank as the measured model builds them, collectives
  left out because one GPU runs one rank's compute);
- `manifest`: the sum of per-kernel predictions over the exact kernel list the measured model launches
  (`calibration.wholestep.spec.sequence`), so a miss of the whole step against this sum is a composition effect
  (back-to-back kernels in one graph vs kernels timed alone), not a wrong kernel list.
Kernels the profile has not measured (implementation glue: conv update, sigmoid, split copies, MoE
permute/combine, KV-cache writes) stream their bytes through the HBM-copy fit and say `proxy` in source.
Kernel families (`step.families`) split a measured step and its prediction into comparable parts.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call, Timer
from k3sim.step.families import FAMILIES, OTHER, PROXIED, kernel_family, op_family
from k3sim.step.layers import embedding_calls, layer_calls, lm_head_calls
from k3sim.step.layout import StepLayout
from k3sim.step.training import COLLECTIVES
from k3sim.validation.runs import input_file, run_file

PREDICTIONS = "reports/decode/wholestep_predictions.csv"  # the committed predictions of the first serve run
RUN = "hardware_profiles/measured/h200/20261201-wholestep-serve"  # the run they were checked against


def _nb(*xs) -> float:
    return float(math.prod(xs))


def prefix_equivalent_tokens(chunk: int, kv: int) -> int:
    """T whose full causal attention has the (query, key) pairs of `chunk` queries over `kv` = prefix + chunk keys
    aligned bottom right: chunk (kv - chunk) + chunk (chunk + 1) / 2 = T (T + 1) / 2 (T rounded up)."""
    pairs = chunk * (kv - chunk) + chunk * (chunk + 1) / 2
    return max(1, math.ceil((math.sqrt(1 + 8 * pairs) - 1) / 2))


def _hybrid_call(op: str, p: dict) -> Call | None:
    """The hybrid layers' manifest entries (issue 23 item 7, Qwen3-Next's GDN and gated GQA): the GDN gating (beta
    and the fp32 decay of every value head: b and a read as bf16, beta bf16 and g fp32 written, through the HBM
    proxy), a chunk's GQA attention after a cached prefix (the `gqa_prefill_fwd` of the same FLOP, as MLA's prefix
    attention below), several sequences' GQA prefill (one call per sequence). None for any other op."""
    if op == "gdn_gating":
        return Call(op, op, {"T": int(p["T"]), "H": int(p["H"])}, proxy_bytes=float(p["T"]) * p["H"] * (3 * BF16 + 4))
    if op == "gqa_prefix_causal_fwd":
        t = prefix_equivalent_tokens(int(p["Tq"]), int(p["Tkv"]))
        return Call(op, "gqa_prefill_fwd", {"T": t, "Hq": p["Hq"], "Hkv": p["Hkv"], "D": p["D"], "window": t},
                    count=p.get("B", 1))
    if op == "gqa_prefill_fwd" and "B" in p:
        return Call(op, op, {k: int(v) for k, v in p.items() if k != "B"}, count=p["B"])
    return None


def manifest_call(op: str, p: dict) -> Call:
    """One manifest entry as a predictor call (registry op) or an HBM proxy with the bytes it moves."""
    hybrid = _hybrid_call(op, p)
    if hybrid is not None:
        return hybrid
    p = dict(p)
    if op == "silu_mul":
        T = p["T"]
        if isinstance(T, str):  # "N x topk" rows of the routed experts
            a, _, b = T.partition("x")
            T = math.ceil(float(a) * float(b))
        return Call(op, op, {"T": int(T), "N": int(p.get("N", p.get("D")))}, proxy_bytes=3 * _nb(T, p.get("N", p.get("D"))) * BF16)
    if op == "bmm_bf16":  # per-head batched product: a GEMM of equal FLOP and weight bytes
        return Call(op, "gemm_bf16", {"M": p["M"], "N": p["N"] * p["batch"], "K": p["K"]})
    if op == "sdpa_prefix_causal_fwd":
        c, kv = p["Tq"], p["Tkv"]
        side = max(1, math.ceil(math.sqrt(c * (2 * (kv - c) + c))))
        return Call(op, "sdpa_causal_fwd", {"T": side, "H": p["H"], "D": p["D"]})
    if op in ("sdpa_causal_fwd", "sdpa_causal_fwd_bwd") and "B" in p:
        return Call(op, op, {"T": p["T"], "H": p["H"], "D": p["D"]}, count=p["B"])
    if op == "moe_mxfp4_decode" and not float(p["topk"]).is_integer():
        pairs = p["B"] * p["topk"]
        p = {**p, "B": max(1, math.ceil(pairs)), "topk": 1}
    if op == "moe_grouped_bf16" and not float(p["topk"]).is_integer():
        pairs = p["B"] * p["topk"]
        p = {**p, "B": max(1, math.ceil(pairs)), "topk": 1}
    proxy = {
        "conv1d_update": lambda: 2 * _nb(p.get("B", 1), p.get("D", 1), p.get("W", 1)) * BF16,
        "causal_conv1d_fwd": lambda: 2 * _nb(p.get("B", 1), p.get("T", 1), p.get("D", 1)) * BF16,
        "sigmoid": lambda: 2 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "split_copy": lambda: 2 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "sigmoid_mul": lambda: 3 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "gated_rmsnorm": lambda: 3 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "kv_cache_write": lambda: 2 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        # gathered / combined rows: `rows` when the run compacts them under EP, else T x topk
        "moe_permute": lambda: 2 * _nb(p.get("rows", p.get("T", 1) * p.get("topk", 1)), p.get("D", 1)) * BF16,
        "moe_combine": lambda: 2 * _nb(p.get("rows", p.get("T", 1) * p.get("topk", 1)), p.get("D", 1)) * BF16,
    }.get(op, lambda: 0.0)()
    return Call(op, op, {k: int(v) for k, v in p.items()}, proxy_bytes=proxy)


def manifest_prediction(seq: list[dict], hw: Any, kernel_time: Callable | None = None) -> tuple[float, dict]:
    """Sum of per-kernel predictions over a kernel list; also the seconds by op and by source kind."""
    timer = Timer(hw, kernel_time, "graph")
    total, by_op, by_src = 0.0, {}, {}
    for e in seq:
        c = manifest_call(e["op"], e["params"])
        r = timer.row(c, 0)  # unregistered ops stream their bytes (Timer's HBM proxy)
        total += r.seconds
        by_op[e["op"]] = by_op.get(e["op"], 0.0) + r.seconds
        kind = "proxy" if r.source.startswith("proxy") else r.source
        by_src[kind] = by_src.get(kind, 0.0) + r.seconds
    return total, {"by_op": by_op, "by_source": by_src}


def model_prediction(model, hw: Any, *, tp: int, ep: int, layers: list[int], embed_head: bool, batch: Batch,
                     expert_kernel: str, kernel_time: Callable | None = None) -> float:
    """The step model over `layers` (0-based) of `model` as one rank computes them (no collectives)."""
    from k3sim.step.forward import _eval_calls

    lay = StepLayout(tp=tp, ep=ep, expert_kernel=expert_kernel, replicated_down_proj=True)
    timer = Timer(hw, kernel_time, "graph")
    calls = embedding_calls(model, batch) if embed_head else []
    for i in layers:
        calls += layer_calls(model, i, lay, batch, expert_kernel)
    if embed_head:
        calls += [c for c in lm_head_calls(model, lay, batch) if c.component != "sampling"]
    calls = [c for c in calls if c.op not in COLLECTIVES]
    return sum(r.seconds for r in _eval_calls(timer, calls, 0) if not r.hidden)


# ---------------------------------------------------------------------------------------- tables
def _spec_layers(spec) -> list[int]:
    return [r["index"] - 1 for r in spec.layers]


def _decode_kernel(spec, kernel: str) -> str:
    return "mxfp4_token" if kernel == "mxfp4" else "grouped_bf16"


def prediction_rows(hw: Any = "h200", kernel_time: Callable | None = None, plan: str | None = None) -> list[dict]:
    """One row per point the whole-step run measures (its default grids and plan), with both predictions."""
    from k3sim.calibration.wholestep import run as R
    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_hardware, load_model

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    specs = S.load_specs(S.SPECS_PATH)
    items = R.parse_plan(plan or R.DEFAULT_PLAN, specs, "grouped_bf16")
    rows: list[dict] = []
    for cfg, kernel, part, _secs in items:
        spec = specs[cfg]
        model = load_model(spec.model if not spec.model.startswith("/") else spec.model)
        layers = _spec_layers(spec)
        ek = _decode_kernel(spec, kernel)
        if part == "decode":
            for c in R.DECODE_C.get(cfg, R.DECODE_C["default"]):
                for b in R.DECODE_B:
                    st = S.StepShape(decodes=b, context=c)
                    man, info = manifest_prediction(S.sequence(spec, st, kernel), hw, kernel_time)
                    mod = model_prediction(model, hw, tp=spec.tp, ep=spec.ep, layers=layers,
                                           embed_head=spec.embed_head, batch=Batch.decode(b, c),
                                           expert_kernel=ek, kernel_time=kernel_time)
                    rows.append(dict(config=cfg, part="decode", expert_kernel=kernel, B=b, C=c,
                                     predicted_model_s=mod, predicted_manifest_s=man,
                                     proxy_share=info["by_source"].get("proxy", 0.0) / man))
        elif part == "prefill":
            for r in R.PREFILL_RIDE:
                for p in R.PREFILL_PREFIX:
                    for ch in R.PREFILL_CHUNKS:
                        st = S.StepShape(decodes=r, context=R.RIDE_CONTEXT if r else 0, chunk=ch, prefix=p)
                        man, info = manifest_prediction(S.sequence(spec, st, kernel), hw, kernel_time)
                        b = Batch(decode_contexts=(R.RIDE_CONTEXT,) * r, prefill=((ch, p),))
                        mod = model_prediction(model, hw, tp=spec.tp, ep=spec.ep, layers=layers,
                                               embed_head=spec.embed_head, batch=b, expert_kernel=ek,
                                               kernel_time=kernel_time)
                        rows.append(dict(config=cfg, part="prefill", expert_kernel=kernel, chunk=ch, prefix=p,
                                         decodes=r, predicted_model_s=mod, predicted_manifest_s=man,
                                         proxy_share=info["by_source"].get("proxy", 0.0) / man))
        else:
            from k3sim.validation.train_step import predict as train_predict

            for r in train_predict([(cfg, q, mb) for q in R.TRAIN_SEQ for mb in R.TRAIN_MB], hw, kernel_time):
                rows.append(dict(config=cfg, part="train", expert_kernel="bf16", seq=r["seq"],
                                 micro_batch=r["micro_batch"], phase=r["phase"], predicted_model_s=r["predicted_s"],
                                 predicted_manifest_s=float("nan"), proxy_share=float("nan")))
    return rows


def write_predictions(out, plan: str | None = None) -> int:
    """`k3sim check decode-predict OUT.csv`: the predictions of every point the run's `plan` measures,
    written (atomically) before the run; returns the number of rows."""
    import pandas as pd

    from k3sim.files import atomic_write_text, check_output_file

    check_output_file(out, source="OUT")  # refused before the work, not after
    df = pd.DataFrame(prediction_rows(plan=plan))
    atomic_write_text(out, df.to_csv(index=False, float_format="%.6g"))
    return len(df)


def write_check(run_dir, out_dir, pred_csv=PREDICTIONS) -> str:
    """`k3sim check decode RUN OUT_DIR`: OUT_DIR/wholestep_check.csv and wholestep_families.csv (an output
    directory of kind "check", part "decode"); returns the step model's absolute error by configuration,
    part and expert kernel (count, mean, max) as text."""
    from k3sim.files import atomic_write_text, output_dir

    with output_dir(out_dir, kind="check", source="OUT_DIR", part="decode") as out:
        steps, fams = check_tables(pred_csv, run_dir)
        atomic_write_text(out / "wholestep_check.csv", steps.to_csv(index=False, float_format="%.6g"))
        atomic_write_text(out / "wholestep_families.csv", fams.to_csv(index=False, float_format="%.6g"))
    g = steps.assign(abs_err=steps.error_model.abs()).groupby(["config", "part", "expert_kernel"])
    return g.abs_err.agg(["size", "mean", "max"]).to_string()


# ----------------------------------------------------------------------------------------- checks
def check_tables(pred_csv, run_dir, hw: Any = "h200", kernel_time: Callable | None = None):
    """Predicted vs measured whole steps, and the per-family split of the profiled points.

    Returns (steps, families): steps has one row per measured point (measured graph or eager seconds,
    both predictions, their errors, and for profiled points the sum of kernel GPU times); families
    compares each kernel family's predicted time with the profiler's at the profiled points."""
    from pathlib import Path

    import pandas as pd

    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_hardware

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    run_dir = Path(run_dir)
    P = pd.read_csv(input_file(pred_csv, "--predictions"))
    files = {n: run_file(run_dir, n, "serving whole-step") for n in ("decode_step.csv", "prefill_step.csv", "kernels.csv")}
    steps = []
    dec = pd.read_csv(files["decode_step.csv"])
    dec = dec[(dec.status == "ok") & (dec.timer == "graph")]
    d = P[P.part == "decode"].merge(dec[["config", "expert_kernel", "B", "C", "seconds"]],
                                    on=["config", "expert_kernel", "B", "C"])
    d = d.assign(part="decode", timer="graph")
    steps.append(d)
    pre = pd.read_csv(files["prefill_step.csv"])
    pre = pre[pre.status == "ok"]
    p = P[P.part == "prefill"].merge(pre[["chunk", "prefix", "decodes", "seconds"]], on=["chunk", "prefix", "decodes"])
    steps.append(p.assign(timer="eager"))
    st = pd.concat(steps, ignore_index=True)
    st["error_model"] = st.predicted_model_s / st.seconds - 1
    st["error_manifest"] = st.predicted_manifest_s / st.seconds - 1
    K = pd.read_csv(files["kernels.csv"])
    K["family"] = K.kernel.map(kernel_family)
    specs = S.load_specs(S.SPECS_PATH)
    fam_rows = []
    for key, g in K.groupby(["config", "part", "expert_kernel", "B", "C", "chunk", "prefix", "decodes"], dropna=False):
        cfg, part, ek, B, C, chunk, prefix, decodes = key
        spec = specs[cfg]
        if part == "decode":
            shape = S.StepShape(decodes=int(B), context=int(C))
        else:
            shape = S.StepShape(decodes=int(decodes), context=4096 if decodes else 0, chunk=int(chunk),
                                prefix=int(prefix))
        _t, info = manifest_prediction(S.sequence(spec, shape, ek), hw, kernel_time)
        pred_fam: dict[str, float] = {}
        for op, s in info["by_op"].items():
            pred_fam[op_family(op)] = pred_fam.get(op_family(op), 0.0) + s
        meas = g.groupby("family").gpu_s.sum().to_dict()
        calls = g.groupby("family").calls.sum().to_dict()
        for fam in [f for f, _, _ in FAMILIES] + [OTHER]:
            fam_rows.append(dict(config=cfg, part=part, expert_kernel=ek, B=B, C=C, chunk=chunk, prefix=prefix,
                                 decodes=decodes, family=fam, predicted_s=pred_fam.get(fam, 0.0),
                                 profiled_s=meas.get(fam, 0.0), kernels=int(calls.get(fam, 0))))
        m = st.config.eq(cfg) & st.part.eq(part)
        if part == "decode":
            m &= st.B.eq(B) & st.C.eq(C) & st.expert_kernel.eq(ek)
        else:
            m &= st.chunk.eq(chunk) & st.prefix.eq(prefix) & st.decodes.eq(decodes)
        st.loc[m, "profiled_kernel_sum_s"] = g.gpu_s.sum()
        st.loc[m, "profiled_kernels"] = int(g.calls.sum())
    return st, pd.DataFrame(fam_rows)


# -------------------------------------------------------------- glue calibrated from the profiles
def _interp_log2(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear in log2(x) through (xs, ys), held flat outside the range."""
    import math

    pts = sorted(zip(xs, ys))
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            w = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + w * (y1 - y0)
    return pts[-1][1]


def glue_calibrated(steps, fams, hw: Any = "h200", kernel_time: Callable | None = None):
    """Re-predict every measured point with the implementation's glue taken from the profiled points.

    At the profiled points (decode B = 1, 8, 64, 256 at the first context; prefill chunks 512 and 8192
    without prefix) the profiler measured the glue families (`PROXIED`) and the graph's cost beyond its
    kernels (measured step - kernel sum: launch gaps, host time for eager prefill). Every other point
    takes those two terms interpolated in log2(B) (log2(chunk)) from the profiled points of its
    configuration, in place of the proxies' prediction; the measured kernels' families stay predicted.
    Eager prefill steps take the glue only (their gap is host launch time, which depends on the host).
    Points that were profiled are in-sample for the two terms (`held_out` False); the rest are not."""
    import pandas as pd

    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_hardware

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    specs = S.load_specs(S.SPECS_PATH)
    prof = steps.dropna(subset=["profiled_kernel_sum_s"])
    glue: dict[tuple, float] = {}
    for f in fams[fams.family.isin(PROXIED)].itertuples():
        k = (f.config, f.part, f.expert_kernel, float(f.B if f.part == "decode" else f.chunk))
        glue[k] = glue.get(k, 0.0) + float(f.profiled_s)
    cal: dict[tuple, tuple[list, list, list]] = {}
    for r in prof.itertuples():
        x = r.B if r.part == "decode" else r.chunk
        key = (r.config, r.part, r.expert_kernel)
        g = glue[(r.config, r.part, r.expert_kernel, float(x))]
        xs, gs, bs = cal.setdefault(key, ([], [], []))
        xs.append(float(x))
        gs.append(g)
        # graph replay beyond its kernels (launch gaps); an eager prefill's host time is not carried over
        bs.append(max(0.0, r.seconds - r.profiled_kernel_sum_s) if r.part == "decode" else 0.0)
    out = []
    for r in steps.itertuples():
        key = (r.config, r.part, r.expert_kernel)
        if key not in cal:
            continue
        spec = specs[r.config]
        if r.part == "decode":
            shape, x = S.StepShape(decodes=int(r.B), context=int(r.C)), r.B
        else:
            shape = S.StepShape(decodes=int(r.decodes), context=4096 if r.decodes else 0, chunk=int(r.chunk),
                                prefix=int(r.prefix))
            x = r.chunk
        total, info = manifest_prediction(S.sequence(spec, shape, r.expert_kernel), hw, kernel_time)
        proxied = sum(s for op, s in info["by_op"].items() if op_family(op) in PROXIED)
        xs, gs, bs = cal[key]
        pred = total - proxied + _interp_log2(xs, gs, x) + _interp_log2(xs, bs, x)
        held = not (pd.notna(r.profiled_kernel_sum_s))
        out.append(dict(config=r.config, part=r.part, expert_kernel=r.expert_kernel, B=r.B, C=r.C, chunk=r.chunk,
                        prefix=r.prefix, decodes=r.decodes, seconds=r.seconds, predicted_glue_calibrated_s=pred,
                        error=pred / r.seconds - 1, held_out=held))
    return pd.DataFrame(out)


def predict_new_points(points, pred_csv, run_dir, hw: Any = "h200"):
    """Glue-calibrated predictions for decode points not measured yet: `points` is an iterable of
    (config, expert_kernel, B, C). The calibration (profiled glue and graph gaps) comes from `run_dir`."""
    import pandas as pd

    steps, fams = check_tables(pred_csv, run_dir, hw)
    new = pd.DataFrame([dict(config=c, part="decode", expert_kernel=k, B=float(b), C=float(ctx), chunk=float("nan"),
                             prefix=float("nan"), decodes=float("nan"), seconds=float("nan"),
                             profiled_kernel_sum_s=float("nan")) for c, k, b, ctx in points])
    cal_rows = steps[steps.profiled_kernel_sum_s.notna()]
    out = glue_calibrated(pd.concat([cal_rows, new], ignore_index=True), fams, hw)
    out = out[out.seconds.isna()].drop(columns=["seconds", "error", "held_out"])
    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_hardware, load_model

    hwp = load_hardware(hw) if isinstance(hw, str) else hw
    specs = S.load_specs(S.SPECS_PATH)
    mod = []
    for r in out.itertuples():
        spec = specs[r.config]
        model = load_model(spec.model)
        mod.append(model_prediction(model, hwp, tp=spec.tp, ep=spec.ep, layers=_spec_layers(spec),
                                    embed_head=spec.embed_head, batch=Batch.decode(int(r.B), int(r.C)),
                                    expert_kernel=_decode_kernel(spec, r.expert_kernel)))
    return out.assign(predicted_model_s=mod)
