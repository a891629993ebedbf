"""Figures of the planning report (matplotlib, Agg). Each takes the plan's data and a path, returns the path.

Figures other packages already draw are theirs (CP crossover: k3sim.cp.sweep.plot_crossover; decode
roofline: k3sim.decode.sweep.roofline_plot); the rest are drawn here from the plan's rows.
"""

from __future__ import annotations

from pathlib import Path

GB = 1e9


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    from k3sim.files import save_figure

    fig.tight_layout()
    return save_figure(fig, path, dpi=110, metadata={"Software": None})


def memory_figure(rows: list[tuple[str, float]], hbm_bytes: float, title: str, path: Path) -> Path:
    """One stacked bar of per-GPU bytes by component against the HBM capacity."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    left = 0.0
    cmap = plt.get_cmap("tab20")
    for i, (name, b) in enumerate(rows):
        ax.barh([0], [b / GB], left=[left / GB], color=cmap(i % 20), label=f"{name} {b / GB:.1f} GB")
        left += b
    ax.axvline(hbm_bytes / GB, color="black", ls="--", label=f"HBM {hbm_bytes / GB:.0f} GB")
    ax.set_yticks([])
    ax.set_xlabel("GB per GPU")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.5), ncol=3)
    return _save(fig, path)


def breakdown_figure(rows: list[tuple[str, float]], title: str, path: Path, unit: str = "s") -> Path:
    """Horizontal bars: where the step time goes."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    names = [r[0] for r in rows][::-1]
    vals = [r[1] for r in rows][::-1]
    ax.barh(names, vals, color="tab:blue")
    total = sum(vals) or 1.0
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:.3g} {unit} ({100 * v / total:.0f} %)", va="center", fontsize=7)
    ax.set_xlabel(f"{unit} per step")
    ax.set_title(title, fontsize=9)
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
    ax.set_ylim(0, 1)
    ax.set_ylabel("hit rate")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
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
    ax.set_title(title + (f" (first {max_ops} ops)" if prog.num_ops > max_ops else ""), fontsize=9)
    ax.legend(fontsize=8, loc="upper right", ncol=5)
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
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
