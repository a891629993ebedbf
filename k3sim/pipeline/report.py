"""Regenerate reports/pipeline/: Gantt charts and a Perfetto trace of K3 on H200, the encoder-cost vs
hidden-share sweep (CSV + PNG), the encoder-CP comparison and the AttnRes hand-off bytes.

    python -m k3sim.pipeline.report [--out reports/pipeline]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from k3sim.files import atomic_write_text, save_figure

SWEEP_RATIOS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
SWEEP_LAYOUTS = (("1f1b", 8, 1, 16), ("interleaved-1f1b", 8, 2, 16), ("interleaved-1f1b", 8, 2, 64),
                 ("zb-h1", 8, 1, 16))
POLICIES = ("serial", "decoupled", "bubble")


# A reference line, not a model input: the Kimi K2.5 report (arXiv 2602.02276) says its decoupled encoder
# process keeps 90 % of pure-text training efficiency (../shared/reference/domain-facts.md, via summaries).
K25_DEP_EFFICIENCY = 0.90

def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def encoder_sweep() -> list[dict]:
    """Uniform stages (F = 1, B = 2 per device and micro-batch, free transfers), encoder forward R x F,
    backward 2 R x F, for each layout and policy."""
    from k3sim.pipeline import EncoderWork, build_schedule, run_pipeline, uniform_costs

    rows = []
    for name, p, v, m in SWEEP_LAYOUTS:
        sched = build_schedule(name, p, m, v)
        costs = uniform_costs(p, v, 1.0, 2.0)
        for r in SWEEP_RATIOS:
            for pol in POLICIES:
                res = run_pipeline(sched, costs, EncoderWork.uniform(m, r), pol, keep_timeline=False)
                rows.append({"schedule": name, "p": p, "v": v, "m": m, "encoder_cost_ratio": r, "policy": pol,
                             "step_time_s": round(res.step_time_s, 6),
                             "text_step_time_s": round(res.text_step_time_s, 6),
                             "slowdown_vs_text": round(res.step_time_s / res.text_step_time_s - 1, 6),
                             "encoder_hidden_share": None if r == 0 else round(res.encoder_hidden_share, 6),
                             "text_only_efficiency": round(res.text_step_time_s / res.step_time_s, 6)})
    return rows


def plot_sweep(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"serial": ":", "decoupled": "--", "bubble": "-"}
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    for ci, (name, p, v, m) in enumerate(SWEEP_LAYOUTS):
        for pol in POLICIES:
            sel = [r for r in rows if (r["schedule"], r["p"], r["v"], r["m"], r["policy"]) == (name, p, v, m, pol)]
            xs = [r["encoder_cost_ratio"] for r in sel if r["encoder_cost_ratio"] > 0]
            hs = [r["encoder_hidden_share"] for r in sel if r["encoder_cost_ratio"] > 0]
            eff = [r["text_only_efficiency"] for r in sel]
            label = f"{name} p={p} v={v} m={m}, {pol}"
            axes[0].plot(xs, hs, styles[pol], color=colors[ci], marker="o", ms=3, label=label)
            axes[1].plot([r["encoder_cost_ratio"] for r in sel], eff, styles[pol], color=colors[ci], marker="o",
                         ms=3, label=label)
    axes[0].set_xlabel("encoder forward per micro-batch / stage forward (R)")
    axes[0].set_ylabel("encoder hidden share")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].axhline(K25_DEP_EFFICIENCY, color="grey", lw=0.8)
    axes[1].text(1.45, K25_DEP_EFFICIENCY + 0.005, f"K2.5 DEP: {K25_DEP_EFFICIENCY:.0%} of text-only (reported)",
                 fontsize=7, color="grey")
    axes[1].set_xlabel("encoder forward per micro-batch / stage forward (R)")
    axes[1].set_ylabel("text-only step / step with encoder")
    axes[0].legend(fontsize=6, ncol=1)
    axes[0].set_title("hidden share (uniform stages, F=1, B=2)", fontsize=9)
    axes[1].set_title("efficiency relative to text only", fontsize=9)
    fig.tight_layout()
    out = save_figure(fig, path, dpi=130)
    plt.close(fig)
    return out


def k3_runs(out: Path) -> dict:
    """K3 on H200, tp=8 ep=8, interleaved 1F1B p=8 v=2 m=16, model-derived costs, each policy."""
    from k3sim.configs import load_hardware, load_model
    from k3sim.pipeline import LayoutSpec, simulate_layout
    from k3sim.pipeline.trace import write_gantt, write_perfetto

    model, hw = load_model("models/kimi-k3.yaml"), load_hardware("h200")
    res = {}
    for pol in ("none", "serial", "decoupled", "bubble"):
        spec = LayoutSpec(schedule="interleaved-1f1b", stages=8, virtual=2, microbatches=16, encoder_policy=pol)
        r = simulate_layout(spec, model, hw)
        res[pol] = r
        if pol in ("serial", "bubble"):
            write_gantt(r.timeline, out / f"gantt_k3_interleaved_{pol}.png", title=(
                f"Kimi K3 on H200 (tp=ep=8), interleaved 1F1B p=8 v=2 m=16, encoder {pol}: "
                f"step {r.step_time_s:.3f} s (text only {r.text_step_time_s:.3f} s)"))
        if pol == "bubble":
            write_perfetto(r.timeline, out / "trace_k3_interleaved_bubble.json")
    summary = {pol: {"step_time_s": r.step_time_s, "text_step_time_s": r.text_step_time_s,
                     "bubble_ratio": r.bubble_ratio, "text_bubble_ratio": r.text_bubble_ratio,
                     "encoder_hidden_share": r.encoder_hidden_share,
                     "encoder_placed_in_bubbles": r.encoder_placed_in_bubbles,
                     "peak_in_flight_per_stage": [s.peak_in_flight for s in r.stage],
                     "planner_in_flight_per_stage": [s.planner_in_flight for s in r.stage],
                     "activation_bytes_per_stage": [s.peak_activation_bytes for s in r.stage]}
               for pol, r in res.items()}
    summary["extra"] = res["bubble"].extra
    return summary


def encoder_cp_table() -> list[dict]:
    """K3's ViT on one H200 stage (8 GPUs), 64 seeded micro-batches, at 2 and 8 images per micro-batch."""
    import statistics

    from k3sim.configs import load_hardware, load_model
    from k3sim.pipeline.encoder import encoder_steps

    model, hw = load_model("models/kimi-k3.yaml"), load_hardware("h200")
    rows = []
    for mean_images in (2.0, 8.0):
        for mode in ("none", "fixed", "dynamic"):
            st = encoder_steps(model, hw, 64, gpus=8, mode=mode, seed=0, mean_images=mean_images)
            rows.append({"images_per_microbatch": mean_images, "cp_mode": mode,
                         "mean_patches": round(statistics.mean(s.image_tokens for s in st)),
                         "mean_forward_s": round(statistics.mean(s.forward_s for s in st), 6),
                         "mean_backward_s": round(statistics.mean(s.backward_s for s in st), 6),
                         "max_forward_s": round(max(s.forward_s for s in st), 6),
                         "mean_imbalance": round(statistics.mean(s.imbalance for s in st), 4),
                         "max_imbalance": round(max(s.imbalance for s in st), 4),
                         "mean_comm_share": round(statistics.mean(s.comm_share for s in st), 4)})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("reports/pipeline"))
    a = ap.parse_args(argv)
    from k3sim.files import output_dir

    with output_dir(a.out) as out:   # a new --out that fails half-way is removed, not left half-written
        rows = encoder_sweep()
        atomic_write_text(out / "encoder_sweep.csv", _csv(rows))
        plot_sweep(rows, out / "encoder_sweep.png")
        cp_rows = encoder_cp_table()
        atomic_write_text(out / "encoder_cp.csv", _csv(cp_rows))
        summary = k3_runs(out)
        atomic_write_text(out / "k3_summary.json", json.dumps(summary, indent=1, default=float) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "extra"}, indent=1, default=float)[:4000])


if __name__ == "__main__":
    main()
