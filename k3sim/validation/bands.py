"""The band table (`hardware_profiles/measured/h200/step_bands.csv`): every whole-step check of the committed H200
runs, predicted by today's step model, with its signed error; `k3sim.configs.bands` reads it (issue 24 item 4).

`python3 -m k3sim.validation.bands [OUT.csv]` writes it and `step_bands.yaml` beside it (the command, the rule, and
the sha256 of every input: the run files read, the specs, the glue calibration, the kernel store's digest), so the
committed table is regenerable and a stale one is detectable.

What each kind's error is of (the model the planner runs today, not an older or a better one):
- decode (`decode_step.model_prediction`: the step model over the measured configuration's layers, one rank's
  compute, graph convention) against CUDA-graph decode steps of runs `SERVE_RUNS` (Kimi-Linear-48B whole; the K3
  TP8/EP8 slice with MXFP4 and bf16 experts; a Qwen3-Next-shaped 16-layer GDN + gated GQA slice). The serving and decode models keep the plain proxies for the
  implementation's glue (`reports/decode/README.md`: the glue-calibrated check is validation only), so the plain
  model's errors are the current ones.
- prefill: the same against the eager mixed prefill steps (chunk 512-8192, prefix 0 / 8K, 0 / 32 riding decodes).
  A point whose profiled kernels fill less than `train_step.GPU_BOUND` of its step, or that its run's write-up
  found host-launch bound (`HOST_BOUND`), measures the host's launches (eager PyTorch), which a serving engine's
  graphs avoid and the step model does not price: kept in the table, not used. Unprofiled short chunks may still
  carry host time, so the prefill band's slow end is conservative.
- train (`train_step.check_tables`: the training step model with the profile's glue calibration, what
  `training_layer_costs` prices by default) against the forward and forward+backward steps of runs
  `train_report.RUNS`; used: the GPU-bound points held out of the glue fit (the fit points and host-bound points
  are kept, not used).
Basis "datasheet": the same points predicted on the H200 with its measured data removed (every kernel its
datasheet roofline; the training glue carried as any uncalibrated profile gets it), the band of a profile
that has only datasheet figures.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from k3sim.configs.bands import BAND_FILE, COLUMNS

PROFILE = "h200"
# Kimi-Linear-48B and the K3 slice (run b: new decode points); Qwen3-Next's 16-layer slice (run a; its repeat
# `20261202-wholestep-qwen-b` measured the same points again within 0.9 % and is left out, not counted twice)
SERVE_RUNS = ("20261201-wholestep-serve", "20261201-wholestep-serve-b", "20261202-wholestep-qwen")
COMMAND = "python3 -m k3sim.validation.bands"
# Mixed prefill points found host-launch bound by their run's write-up, not by a profile (the host's enqueue time of
# the step as long as the GPU's work or longer: reports/decode/qwen3_next_wholestep.md, "Mixed prefill"): kept in
# the table, not used, as the profiled host-bound points are. (run, chunk, prefix, decodes)
HOST_BOUND = {("20261202-wholestep-qwen", 2048, 0, 32), ("20261202-wholestep-qwen", 2048, 8192, 32),
              ("20261202-wholestep-qwen", 4096, 0, 32)}
META_FILE = "step_bands.yaml"


def datasheet_only(hw: Any) -> Any:
    """`hw` with its measured data removed: every kernel time the predictor's datasheet roofline."""
    return hw.model_copy(update={"name": f"{hw.name}-datasheet-only", "calibration_dir": None})


def _family(spec) -> str:
    from k3sim.configs import load_model

    return load_model(spec.model).name


def _row(basis: str, kind: str, spec_cfg: str, family: str, run: str, point: str, measured: float,
         predicted: float, used: bool = True, note: str = "") -> dict:
    return {"profile": PROFILE, "basis": basis, "kind": kind, "family": family, "config": spec_cfg, "run": run,
            "point": point, "measured_s": measured, "predicted_s": predicted, "error": predicted / measured - 1,
            "used": int(used), "note": note}


def _profiled_share(run_dir: Path) -> dict[tuple, float]:
    """{(chunk, prefix, decodes): profiled kernel GPU seconds} of a serve run's profiled prefill points."""
    import pandas as pd

    path = run_dir / "kernels.csv"
    if not path.is_file():
        return {}
    K = pd.read_csv(path)
    K = K[K.part == "prefill"]
    groups = K.groupby(["chunk", "prefix", "decodes"])
    return {(int(c), int(p), int(d)): float(g.gpu_s.sum()) for (c, p, d), g in groups}


def serve_rows(run_dir: Path, hw: Any, basis: str) -> list[dict]:
    """Decode (graph) and mixed prefill (eager) checks of one serving whole-step run, predicted on `hw`."""
    import pandas as pd

    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_model
    from k3sim.step.batch import Batch
    from k3sim.validation.decode_step import _decode_kernel, _spec_layers, model_prediction
    from k3sim.validation.runs import run_file
    from k3sim.validation.train_step import GPU_BOUND

    specs = S.load_specs(S.SPECS_PATH)
    run = run_dir.name
    out = []

    def predict(cfg, ek, batch):
        spec = specs[cfg]
        return model_prediction(load_model(spec.model), hw, tp=spec.tp, ep=spec.ep, layers=_spec_layers(spec),
                                embed_head=spec.embed_head, batch=batch, expert_kernel=_decode_kernel(spec, ek))

    dec = pd.read_csv(run_file(run_dir, "decode_step.csv", "serving whole-step"))
    for r in dec[(dec.status == "ok") & (dec.timer == "graph")].itertuples():
        pred = predict(r.config, r.expert_kernel, Batch.decode(int(r.B), int(r.C)))
        out.append(_row(basis, "decode", r.config, _family(specs[r.config]), run,
                        f"B={int(r.B)} C={int(r.C)} {r.expert_kernel}", float(r.seconds), pred))
    if not (run_dir / "prefill_step.csv").is_file():
        return out
    profiled = _profiled_share(run_dir)
    pre = pd.read_csv(run_dir / "prefill_step.csv")
    for r in pre[pre.status == "ok"].itertuples():
        key = (int(r.chunk), int(r.prefix), int(r.decodes))
        batch = Batch(decode_contexts=(int(r.decode_context),) * key[2], prefill=((key[0], key[1]),))
        pred = predict(r.config, r.expert_kernel, batch)
        share = profiled.get(key, float("nan")) / float(r.seconds)
        host = share < GPU_BOUND  # NaN (not profiled): False, used
        note = f"host-bound: profiled kernels {100 * share:.0f} % of the eager step" if host else ""
        if (run, *key) in HOST_BOUND:
            host, note = True, "host-bound: the host's enqueue time >= the GPU's work (the run's write-up)"
        out.append(_row(basis, "prefill", r.config, _family(specs[r.config]), run,
                        f"chunk={key[0]} prefix={key[1]} decodes={key[2]}", float(r.seconds), pred, not host, note))
    return out


def train_rows(run_dir: Path, hw: Any, basis: str) -> list[dict]:
    """Training checks of one run: the glue-calibrated step model (the training default) on `hw`."""
    from k3sim.calibration.wholestep import spec as S
    from k3sim.validation.train_step import GPU_BOUND, check_tables

    specs = S.load_specs(S.SPECS_PATH)
    steps, _fams = check_tables(run_dir, hw)
    out = []
    for r in steps.itertuples():
        gpu_bound = getattr(r, "gpu_bound", None)
        profiled = gpu_bound is not None and gpu_bound == gpu_bound  # None or NaN: not profiled
        note = ("fit point of the glue calibration" if not r.held_out
                else "not profiled: GPU-boundness unknown" if not profiled
                else f"host-bound: profiled kernels under {GPU_BOUND:.0%} of the step" if not bool(gpu_bound) else "")
        out.append(_row(basis, "train", r.config, _family(specs[r.config]), run_dir.name,
                        f"{int(r.seq)}x{int(r.micro_batch)} {r.phase}", float(r.seconds), float(r.predicted_glue_s),
                        used=not note, note=note))
    return out


def band_rows(hw: Any = PROFILE) -> list[dict]:
    """Every check of the committed runs on both bases (measured; datasheet-only), in table order."""
    from k3sim.configs import load_hardware
    from k3sim.configs.profiles import measured_dir
    from k3sim.validation.train_report import RUNS as TRAIN_RUNS

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    base = measured_dir(hw)
    rows: list[dict] = []
    for basis, h in (("measured", hw), ("datasheet", datasheet_only(hw))):
        for run in SERVE_RUNS:
            rows += serve_rows(base / run, h, basis)
        for run in TRAIN_RUNS:
            rows += train_rows(base / run, h, basis)
    return rows


def input_files(hw: Any = PROFILE) -> list[Path]:
    """The files the table is computed from (their sha256 is the table's data fingerprint)."""
    from k3sim.calibration.wholestep import spec as S
    from k3sim.configs import load_hardware
    from k3sim.configs.profiles import measured_dir
    from k3sim.validation.train_report import RUNS as TRAIN_RUNS

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    base = measured_dir(hw)
    names = {"decode_step.csv", "prefill_step.csv", "kernels.csv", "train_step.csv"}
    files = [p for run in SERVE_RUNS + tuple(TRAIN_RUNS) for p in sorted((base / run).iterdir()) if p.name in names]
    return files + [Path(S.SPECS_PATH), base / "training_glue.yaml"]


def fingerprint(hw: Any = PROFILE) -> dict:
    """{relative path: sha256} of `input_files` and the kernel store's content digest (`store.read_files`)."""
    from k3sim.configs import load_hardware
    from k3sim.configs.profiles import measured_dir
    from k3sim.kernels.store import read_files

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    root = Path(__file__).resolve().parents[2]
    out = {}
    for p in input_files(hw):
        p = Path(p).resolve()
        out[str(p.relative_to(root)) if p.is_relative_to(root) else str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    out["kernel store (k3sim.kernels.store.read_files digest)"] = read_files(measured_dir(hw)).digest
    return out


def write_bands(out: str | Path | None = None, hw: Any = PROFILE) -> str:
    """Write the band table and its fingerprint (atomically); returns a summary per (basis, kind, family)."""
    import pandas as pd
    import yaml

    from k3sim.configs import load_hardware
    from k3sim.configs.profiles import measured_dir
    from k3sim.files import atomic_write_text, check_output_file

    hw = load_hardware(hw) if isinstance(hw, str) else hw
    out = Path(out) if out is not None else measured_dir(hw) / BAND_FILE
    check_output_file(out, source="OUT")
    df = pd.DataFrame(band_rows(hw), columns=list(COLUMNS))
    meta = {"command": COMMAND, "table": out.name, "rows": len(df),
            "rule": "error = predicted / measured - 1 per check; a band is the envelope of the used checks' errors "
                    "of one (basis, kind, family), widened to include 0 (k3sim/configs/bands.py)",
            "inputs_sha256": fingerprint(hw)}
    atomic_write_text(out, df.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(out.with_name(META_FILE), yaml.safe_dump(meta, sort_keys=False, width=120))
    return summary(df).to_string()


def summary(df) -> Any:
    """Used checks per (basis, kind, family): count, min, max and mean signed error."""
    used = df[df.used.astype(bool)]
    return used.groupby(["basis", "kind", "family"]).error.agg(["size", "min", "max", "mean"])


def main(argv: list[str] | None = None) -> int:  # python3 -m k3sim.validation.bands [OUT.csv]
    import sys

    from k3sim.errors import InputError

    args = sys.argv[1:] if argv is None else argv
    try:
        print(write_bands(args[0] if args else None))
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
