"""The training glue calibration fitted on profiled whole training steps (`k3sim check fit-glue`).

The model side (`step/glue.py`) only reads the fitted file, `<measured dir>/training_glue.yaml`; fitting
needs the measurement harness's configurations and a run directory's profiled kernels, which is why it
lives here, beside the check it is tested by (`train_step.check_tables`: points not fitted are held out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from k3sim.step.families import PROXIED, kernel_family
from k3sim.step.glue import is_glue
from k3sim.validation.runs import run_file
from k3sim.validation.train_step import parse_points, slice_calls

COMMAND = "k3sim check fit-glue"


def fit_glue(run_dir, config: str, points: list[tuple[int, int]], hw: Any = "h200") -> dict:
    """Factors from the profiled `points` (seq, micro-batch) of `config` in a training run directory.

    Per point: forward factor = (profiled glue families - the registry-measured calls among them) /
    proxy-priced calls' predicted seconds; backward the same with forward+backward minus forward.
    The factors are the ratio of summed seconds over the points (one number each, no per-shape terms)."""
    import pandas as pd

    from k3sim.configs import load_hardware
    from k3sim.errors import InputError

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    K = pd.read_csv(run_file(run_dir, "kernels.csv", "profiled training whole-step"))
    K = K[(K.part == "train") & (K.config == config)]
    K = K.assign(family=K.kernel.map(kernel_family))
    num_f = num_b = den_f = den_b = 0.0
    for seq, mb in points:
        g = K[(K.seq == seq) & (K.micro_batch == mb) & K.family.isin(PROXIED)]
        if g.empty:
            raise InputError(f"{config} {seq}x{mb} was not profiled there", source=str(run_dir), field="points")
        prof_f = g[g.phase == "fwd"].gpu_s.sum()
        prof_b = g[g.phase == "fwd_bwd"].gpu_s.sum() - prof_f
        rows = [r for r in slice_calls(config, hw, seq, mb, None, None) if is_glue(r["op"])]
        num_f += prof_f - sum(r["fwd_s"] for r in rows if not r["proxy"])
        num_b += prof_b - sum(r["bwd_s"] for r in rows if not r["proxy"])
        den_f += sum(r["fwd_s"] for r in rows if r["proxy"])
        den_b += sum(r["bwd_s"] for r in rows if r["proxy"])
    return dict(fwd=round(num_f / den_f, 4), bwd=round(num_b / den_b, 4), config=config,
                points=[f"{q}x{m}" for q, m in points], run=Path(run_dir).name)


def write_glue_file(run_dir, out, points: str, hw: Any = "h200") -> dict:
    """Fit on `points` ('CONFIG:SEQxMB,...', one configuration) of `run_dir` and write the calibration file
    `out` (atomically) with its provenance, the command that wrote it included; returns the document."""
    import yaml

    from k3sim.errors import InputError
    from k3sim.files import atomic_write_text, check_output_file

    pts = parse_points(points)
    if len({c for c, _, _ in pts}) != 1:
        raise InputError("the points must be of one configuration", source="--points")
    check_output_file(out, source="OUT")  # refused before the fit, not after
    doc = fit_glue(run_dir, pts[0][0], [(q, m) for _, q, m in pts], hw)
    doc = {**doc, "fwd": float(doc["fwd"]), "bwd": float(doc["bwd"]),
           "command": f"{COMMAND} {run_dir} {out} --points {points}"}
    atomic_write_text(out, f"# Written by `{COMMAND}`; refit instead of editing.\n# Factors on the HBM-copy "
                      "proxy time of the kernels the op registry has not measured, in training (step/glue.py).\n"
                      + yaml.safe_dump(doc, sort_keys=False))
    return doc
