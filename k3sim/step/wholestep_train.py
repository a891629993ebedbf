"""The training whole-step check (issue 15 item 2): predictions made before the run, the check after it,
and the glue calibration that is carried from one configuration to another.

The measured thing (`k3sim/calibration/wholestep/train_step.py`) is forward, and forward+backward, of a
layer slice at one rank's shapes (one GPU: no collectives). The prediction is the training step model's
own per-call costs (`step.training._call_costs` over `step.layers.layer_calls`, the layout the measured
model builds: MLA and LatentMoE down-projections whole on the rank), kept per call so that a miss can be
split by kernel family against a torch.profiler pass of the same point.

Glue: kernels the op registry has not measured (MoE permute/combine, routing sort and scatter, copies,
the small ops' backward) are priced by the HBM-copy proxy over the bytes they must move. The calibration
replaces that by `k x proxy` with one factor k per phase (forward; backward), fitted on profiled points
of one configuration: k = profiled glue seconds / predicted glue seconds. It is a per-byte efficiency of
the implementation's glue, so it is carried to other shapes and to the other configuration unchanged;
points that did not fit k are the out-of-sample test.
"""

from __future__ import annotations

from typing import Any, Callable

from k3sim.step.batch import Batch
from k3sim.step.calls import Timer
from k3sim.step.layers import layer_calls
from k3sim.step.layout import StepLayout
from k3sim.step.training import COLLECTIVES, _call_costs

PHASES = ("fwd", "fwd_bwd")


def train_calls(model, hw: Any, *, tp: int, ep: int, layers: list[int], seq: int, micro_batch: int,
                kernel_time: Callable | None = None) -> list[dict]:
    """One row per call of the slice: op, component, forward / backward seconds, proxy or measured."""
    lay = StepLayout(tp=tp, ep=ep, expert_kernel="grouped_bf16", replicated_down_proj=True)
    timer = Timer(hw, kernel_time, "graph")
    batch = Batch(prefill=((seq, 0),) * micro_batch)
    rows = []
    for i in layers:
        for c in layer_calls(model, i, lay, batch, "grouped_bf16"):
            if c.op in COLLECTIVES or c.hidden:
                continue
            f, bi, bw = _call_costs(timer, c)
            proxy = timer.row(c, 0).source.startswith("proxy")
            rows.append(dict(layer=i, component=c.component, op=c.op, fwd_s=f, bwd_s=bi + bw, proxy=proxy))
    return rows


def _spec_model(cfg: str):
    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_model

    spec = S.load_specs(S.SPECS_PATH)[cfg]
    return spec, load_model(spec.model), [r["index"] - 1 for r in spec.layers]


def split(rows: list[dict]) -> dict[str, float]:
    """Seconds of a call list by phase and by measured / proxy ('glue') part."""
    out = {"fwd_measured": 0.0, "fwd_glue": 0.0, "bwd_measured": 0.0, "bwd_glue": 0.0}
    for r in rows:
        part = "glue" if r["proxy"] else "measured"
        out[f"fwd_{part}"] += r["fwd_s"]
        out[f"bwd_{part}"] += r["bwd_s"]
    return out


def predict(points, hw: Any = "h200", kernel_time: Callable | None = None, glue: dict | None = None) -> list[dict]:
    """Rows (config, seq, micro_batch, phase, predicted_model_s, ...) for `points` = (config, seq, mb).

    `glue`: {"fwd": k_f, "bwd": k_b} multiplies the proxy-priced calls (None: the plain model)."""
    from k3sim.configs import load_hardware

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    out = []
    for cfg, seq, mb in points:
        spec, model, layers = _spec_model(cfg)
        s = split(train_calls(model, hw, tp=spec.tp, ep=spec.ep, layers=layers, seq=seq, micro_batch=mb,
                              kernel_time=kernel_time))
        kf, kb = (glue["fwd"], glue["bwd"]) if glue else (1.0, 1.0)
        fwd = s["fwd_measured"] + kf * s["fwd_glue"]
        bwd = s["bwd_measured"] + kb * s["bwd_glue"]
        for phase, v in (("fwd", fwd), ("fwd_bwd", fwd + bwd)):
            out.append(dict(config=cfg, seq=seq, micro_batch=mb, phase=phase, predicted_s=v,
                            glue_s=kf * s["fwd_glue"] + (kb * s["bwd_glue"] if phase == "fwd_bwd" else 0.0)))
    return out


def main(argv: list[str] | None = None) -> None:
    """`python3 -m k3sim.step.wholestep_train predict OUT.csv --points CFG:SEQxMB,...`"""
    import argparse

    import pandas as pd

    from k3sim.files import atomic_write_text

    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["predict"])
    ap.add_argument("out")
    ap.add_argument("--points", required=True, help="CONFIG:SEQxMB,...")
    ap.add_argument("--glue", default="", help="FWD,BWD glue factors (default: the plain model)")
    a = ap.parse_args(argv)
    pts = []
    for item in a.points.split(","):
        cfg, _, sm = item.partition(":")
        q, _, m = sm.partition("x")
        pts.append((cfg, int(q), int(m)))
    glue = None
    if a.glue:
        f, b = (float(x) for x in a.glue.split(","))
        glue = {"fwd": f, "bwd": b}
    df = pd.DataFrame(predict(pts, glue=glue))
    atomic_write_text(a.out, df.to_csv(index=False, float_format="%.6g"))
    print(df.to_string(index=False))


if __name__ == "__main__":  # pragma: no cover
    main()
