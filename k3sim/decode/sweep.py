"""Decode over a range of batch sizes: the TPOT / throughput table and the roofline plot.

The plot marks the two batch sizes a serving team plans around: where the decode step turns
compute-bound (its FLOP at the datasheet peak outlast its HBM bytes at the datasheet bandwidth) and where
memory caps the batch (the memory planner's concurrent requests at this context).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from k3sim.configs.model import ModelConfig
from k3sim.decode.model import DecodeResult, decode_step
from k3sim.step import StepLayout

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
KIND = "decode-sweep-batch"  # the output kind of `decode --sweep-batch` (k3sim.files manifest)


def sweep_batches(model: ModelConfig, hw: Any, layout: StepLayout, context: int,
                  batches: Sequence[int] = DEFAULT_BATCHES, **kw) -> list[DecodeResult]:
    return [decode_step(model, hw, layout, b, context, **kw) for b in batches]


def sweep_table(results: list[DecodeResult], hw: Any):
    """One row per batch: TPOT, tokens/s (per GPU), bytes and FLOP per GPU step, roofline side, fits."""
    import pandas as pd

    from k3sim.configs.profiles import peak_flops

    peak, bw = peak_flops(hw, "bf16"), float(hw.hbm_bandwidth_bytes_per_s)
    rows = []
    for r in results:
        t_mem, t_flop = r.bytes_per_step_per_gpu / bw, r.flop_per_step_per_gpu / peak
        cap = r.max_batch_by_memory
        rows.append({"batch": r.batch, "context": r.context, "tpot_s": r.tpot_s, "step_s": r.step_s, "busiest_stage_s": max(r.stage_seconds),
                     "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "bytes_per_step_per_gpu": r.bytes_per_step_per_gpu,
                     "flop_per_step_per_gpu": r.flop_per_step_per_gpu,
                     "intensity_flop_per_byte": r.flop_per_step_per_gpu / max(1.0, r.bytes_per_step_per_gpu),
                     "roofline": "compute-bound" if t_flop > t_mem else "memory-bound",
                     "expected_distinct_experts_per_layer": r.expected_distinct_experts_per_layer,
                     "expert_kernel": r.expert_kernel,
                     # None: the weights alone do not fit (the memory planner's verdict), so no batch fits
                     "fits_memory": cap is not None and r.batch <= cap,
                     "max_batch_by_memory": cap, "limiter": r.limiter})
    return pd.DataFrame(rows)


def roofline_plot(df, hw: Any, path: Path, title: str) -> None:
    """Tokens/s per GPU and TPOT against batch, with the compute-bound turn and the memory cap marked;
    beside it the roofline (achieved FLOP/s against FLOP per byte)."""
    from k3sim.files import save_figure
    from k3sim.configs.profiles import peak_flops

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, rf) = plt.subplots(1, 2, figsize=(12, 4.6))
    ax.plot(df["batch"], df["tokens_per_s_per_gpu"], "o-", label="tokens/s per GPU")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decode batch per micro-batch (sequences)")
    ax.set_ylabel("tokens/s per GPU")
    ax2 = ax.twinx()
    ax2.plot(df["batch"], df["tpot_s"] * 1e3, "s--", color="tab:red", label="TPOT (ms)")
    ax2.set_ylabel("TPOT (ms)", color="tab:red")
    comp = df[df["roofline"] == "compute-bound"]
    if len(comp):
        b = int(comp["batch"].min())
        ax.axvline(b, color="tab:green", ls=":", label=f"compute-bound from B={b}")
    cap = df["max_batch_by_memory"].dropna()
    if len(cap):
        c = int(cap.iloc[0])
        if c >= 1:
            ax.axvline(c, color="black", ls="-.", label=f"memory cap B={c}")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=9)
    peak, bw = peak_flops(hw, "bf16"), float(hw.hbm_bandwidth_bytes_per_s)
    x = df["intensity_flop_per_byte"].clip(lower=1e-3)
    import numpy as np

    achieved = df["flop_per_step_per_gpu"] / df["busiest_stage_s"]

    xs = np.logspace(np.log10(max(1e-2, x.min() / 2)), np.log10(max(x.max() * 4, 2 * peak / bw)), 100)
    rf.plot(xs, np.minimum(peak, xs * bw), "k-", label="datasheet roofline")
    rf.scatter(x, achieved, c=np.log2(df["batch"]), cmap="viridis", label="decode step (colour: log2 B)")
    for b, xi, yi in zip(df["batch"], x, achieved):
        rf.annotate(str(b), (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    rf.set_xscale("log")
    rf.set_yscale("log")
    rf.set_xlabel("FLOP per HBM byte (per GPU step)")
    rf.set_ylabel("achieved FLOP/s per GPU")
    rf.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
