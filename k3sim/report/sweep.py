"""The files of a layout sweep (`k3sim sweep`): the table as Parquet, the Pareto front as CSV and Markdown, its
figure, and `sweep.json`, written whole through `k3sim.files.output_dir` (kind `sweep`).

The planner (`k3sim.planner.sweep.sweep`) computes the sweep as data; writing it is report work, so the planner
never imports the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

KIND = "sweep"  # the output kind of a sweep directory (k3sim.files manifest)


def write_sweep(res: Any, out: str | Path) -> list[str]:
    """Write `res` (a `planner.sweep.SweepResult`) into `out`, all or nothing; the paths written, sorted."""
    import json

    from k3sim.files import atomic_path, atomic_write_text, output_dir
    from k3sim.output import to_jsonable
    from k3sim.report.figures import pareto_figure

    out = Path(out)
    df, ok, front = res.table, res.fitting, res.front
    with output_dir(out, kind=KIND):  # whole or not at all; never over files k3sim did not write
        with atomic_path(out / "sweep.parquet") as tmp:
            df.to_parquet(tmp, index=False)
        atomic_write_text(out / "pareto.csv", front.to_csv(index=False))
        atomic_write_text(out / "pareto.md", front_markdown(res))
        names = ["pareto.csv", "pareto.md", "sweep.json", "sweep.parquet"]
        if len(ok):
            pareto_figure(ok, res.x, res.y, front, f"{res.scenario}: {len(ok)} of {len(df)} layouts fit",
                          out / "pareto.png", res.xlabel, res.ylabel)
            names.append("pareto.png")
        atomic_write_text(out / "sweep.json", json.dumps(to_jsonable({
            "scenario": res.scenario, "mode": res.mode, "points": len(df),
            "ok": int((df["status"] == "ok").sum()), "fit": len(ok), "errors": int((df["status"] == "error").sum()),
            "skipped": res.skipped, "wall_s": res.wall_s, "workers": res.workers, "scheduler": res.scheduler,
            "pareto_x": res.x, "pareto_y": res.y, "pareto": front.to_dict(orient="records")}), indent=2) + "\n")
        return sorted(str(out / n) for n in names)


def front_markdown(res: Any) -> str:
    """`pareto.md`: the front's layouts with both axes and, for training, the micro-batch size, tokens per
    step, MFU and memory per GPU (a front per global batch when the grid names several)."""
    from k3sim.planner.sweep import SERVE_DIMS, TRAIN_DIMS

    df, front, x, y = res.table, res.front, res.x, res.y
    dims = list(TRAIN_DIMS if res.mode == "train" else SERVE_DIMS)
    head = dims + (["micro_batch_size", "tokens_per_step"] if res.mode == "train" else []) + [x, y] + (
        ["mfu", "memory_per_gpu_bytes"] if res.mode == "train" else ["tpot_p99_s"])
    skipped = getattr(res, "skipped", None) or {}
    lines = [f"# Sweep of {res.scenario}: Pareto front ({y} up, {x} down)", "",
             f"{len(df)} points, {int((df['status'] == 'ok').sum())} evaluated, "
             f"{int((df['status'] == 'error').sum())} refused with their error (see sweep.parquet)"
             + (f"; {sum(skipped.values()):,} grid points skipped ("
                + "; ".join(f"{k}: {v:,}" for k, v in skipped.items()) + ")" if skipped else "") + ".", ""]
    if res.mode == "train" and "global_batch_sequences" in df and df["global_batch_sequences"].nunique() > 1:
        lines += ["One front per global batch (a layout at another batch trains another run).", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in front.itertuples():
        vals = []
        for h in head:
            v = getattr(r, h)
            vals.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"
