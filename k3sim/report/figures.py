"""Figures of the planning report (matplotlib, Agg). Each takes the plan's data and a path, returns the path.

Figures other packages already draw are theirs (CP crossover: k3sim.cp.sweep.plot_crossover; decode
roofline: k3sim.decode.sweep.roofline_plot); the rest are drawn here from the plan's rows. Nothing is clipped:
long titles and labels are wrapped, legends sit outside the data, and the PNG is cut to the drawn extent
(`bbox_inches="tight"`), so a title wider than the axes or a long tick label is kept whole.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

GiB = 2 ** 30
TITLE_CHARS = 90   # a title wraps beyond this many characters (about the width of an 8-inch axes at 9 pt)
LABEL_CHARS = 44   # a bar's tick label wraps beyond this


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, tight_layout: bool = True) -> Path:
    from k3sim.files import save_figure

    if tight_layout:  # a figure made with layout="constrained" lays itself out
        fig.tight_layout()
    return save_figure(fig, path, dpi=110, metadata={"Software": None}, bbox_inches="tight", pad_inches=0.15)


def _wrap(text: str, width: int = TITLE_CHARS) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def memory_figure(rows: list[tuple[str, float]], hbm_bytes: float, title: str, path: Path) -> Path:
    """One stacked bar of per-GPU bytes by component (in words) against the HBM capacity, in GiB as every
    table prints sizes, the HBM's datasheet GB beside it."""
    from k3sim.output import gib_with_gb, words

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.2 * ((len(rows) + 3) // 3)), layout="constrained")
    left = 0.0
    cmap = plt.get_cmap("tab20")
    for i, (name, b) in enumerate(rows):
        ax.barh([0], [b / GiB], left=[left / GiB], color=cmap(i % 20), label=f"{words(name)} {b / GiB:.1f} GiB")
        left += b
    ax.axvline(hbm_bytes / GiB, color="black", ls="--", label=f"HBM {gib_with_gb(hbm_bytes)}")
    ax.set_yticks([])
    ax.set_xlabel("GiB per GPU")
    ax.set_title(_wrap(title), fontsize=9)
    fig.legend(fontsize=7, loc="outside lower center", ncol=3)  # below the axis label, laid out with it
    return _save(fig, path, tight_layout=False)


def breakdown_figure(rows: list[tuple[str, float]], title: str, path: Path, unit: str = "s") -> Path:
    """Horizontal bars: where the step time goes."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    names = [_wrap(r[0], LABEL_CHARS) for r in rows][::-1]
    vals = [r[1] for r in rows][::-1]
    ax.barh(names, vals, color="tab:blue")
    total = sum(vals) or 1.0
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:.3g} {unit} ({100 * v / total:.0f} %)", va="center", fontsize=7)
    ax.set_xlabel(f"{unit} per step")
    ax.set_title(_wrap(title, 70), fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlim(0, max(vals) * 1.35 if vals else 1)
    return _save(fig, path)


def prefix_cache_figure(rows: list[dict], title: str, path: Path) -> Path:
    plt = _plt()
    ok = [r for r in rows if not r.get("note")]
    fig, ax = plt.subplots(figsize=(6, 3))
    names = [r["policy"] for r in ok]
    ax.bar(names, [r["token_hit_rate"] for r in ok], color="tab:green", label="token hit rate")
    ax.plot(names, [r["request_hit_rate"] for r in ok], "ko", label="request hit rate")
    ax.set_ylim(0, 1.05)  # a request hit rate of 1 is drawn whole, not on the frame
    ax.set_ylabel("hit rate")
    ax.set_title(_wrap(title, 60), fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: covers no point
    return _save(fig, path)


def gantt_figure(timeline, title: str, path: Path, max_ops: int = 6000) -> Path:
    """Per-device timeline of the pipeline engine's run: forward, backward (and W) ops by colour."""
    plt = _plt()
    prog = timeline.program
    dev = prog.device_of_op()
    colors = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green", "EF": "tab:purple", "EB": "tab:red"}
    fig, ax = plt.subplots(figsize=(11, 0.28 * prog.num_devices + 1.4))
    n = min(prog.num_ops, max_ops)
    bars: dict[str, list] = {}
    for i in range(n):
        kind = prog.labels[i][0]
        bars.setdefault(kind, []).append((dev[i], timeline.start[i], timeline.finish[i] - timeline.start[i]))
    for kind, items in bars.items():
        for d in range(prog.num_devices):
            segs = [(s, w) for dd, s, w in items if dd == d]
            if segs:
                ax.broken_barh(segs, (d - 0.4, 0.8), color=colors.get(kind, "gray"), linewidth=0)
        ax.plot([], [], color=colors.get(kind, "gray"), lw=6, label=kind)
    ax.set_ylim(prog.num_devices - 0.5, -0.5)
    ax.set_ylabel("pipeline rank")
    ax.set_xlabel("seconds")
    ax.set_title(_wrap(title + (f" (first {max_ops} ops)" if prog.num_ops > max_ops else ""), 120), fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0))  # beside the ranks: covers no op
    return _save(fig, path)


def pareto_figure(df, x: str, y: str, front, title: str, path: Path, xlabel: str, ylabel: str) -> Path:
    """All points of a sweep, the Pareto front highlighted."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(df[x], df[y], s=10, alpha=0.4, color="tab:gray", label="layouts that fit")
    if len(front):
        f = front.sort_values(x)
        ax.plot(f[x], f[y], "o-", color="tab:red", ms=5, label="Pareto front")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(_wrap(title, 80), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
