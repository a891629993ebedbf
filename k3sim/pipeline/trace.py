"""Timeline outputs: a Gantt chart (PNG) and a Chrome / Perfetto trace (JSON, opens in ui.perfetto.dev), each
a regular file written atomically (`k3sim.files`); the trace may also go to stdout (`-`), the PNG may not.

One track per pipeline device; ops named `<kind><chunk>.mb<micro-batch>` (F forward, B backward or
input gradient, W weight gradient, F&B an overlapped forward and backward of two micro-batches, named by
its forward, EF / EB encoder forward / backward); transfers on one track per link.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from k3sim.files import STDOUT, atomic_write_text, save_figure
from k3sim.pipeline.engine import Timeline

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868", "F&B": "#937860", "EF": "#8172B3", "EB": "#C44E52"}


def op_name(label: tuple[str, int, int, int]) -> str:
    kind, _stage, chunk, mb = label
    return f"{kind}.mb{mb}" if kind in ("EF", "EB") else f"{kind}{chunk}.mb{mb}"


def perfetto_events(tl: Timeline) -> list[dict]:
    """Chrome trace-event 'X' (complete) events in microseconds; pid 0 devices, pid 1 links."""
    prog = tl.program
    ev: list[dict] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "pipeline devices"}},
                      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "p2p links"}}]
    for d in range(prog.num_devices):
        ev.append({"ph": "M", "pid": 0, "tid": d, "name": "thread_name", "args": {"name": f"stage {d}"}})
    for i, name in enumerate(prog.link_names):
        ev.append({"ph": "M", "pid": 1, "tid": i, "name": "thread_name", "args": {"name": name}})
    for d, order in enumerate(prog.orders):
        for op in order:
            kind, stage, chunk, mb = prog.labels[op]
            ev.append({"ph": "X", "pid": 0, "tid": d, "name": op_name(prog.labels[op]), "cat": kind,
                       "ts": tl.start[op] * 1e6, "dur": (tl.finish[op] - tl.start[op]) * 1e6,
                       "args": {"stage": stage, "chunk": chunk, "micro_batch": mb}})
    for op in range(prog.num_ops):
        link = prog.out_link[op]
        if link >= 0 and tl.arrival[op] > tl.xfer_start[op]:
            ev.append({"ph": "X", "pid": 1, "tid": link, "name": "send " + op_name(prog.labels[op]), "cat": "p2p",
                       "ts": tl.xfer_start[op] * 1e6, "dur": (tl.arrival[op] - tl.xfer_start[op]) * 1e6})
    return ev


def write_perfetto(tl: Timeline, path: str | Path) -> Path:
    """The trace as JSON at `path` (atomic, a regular file only: `k3sim.files`), or on stdout for `-`."""
    text = json.dumps({"traceEvents": perfetto_events(tl), "displayTimeUnit": "ms"})
    if str(path) == STDOUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        atomic_write_text(path, text)
    return Path(path)


def write_gantt(tl: Timeline, path: str | Path, title: str = "", label_ops: bool | None = None) -> Path:
    """Horizontal bars per device; micro-batch numbers written in the bars when there are few ops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    prog = tl.program
    p = prog.num_devices
    step = tl.step_time_s or 1.0
    fig, ax = plt.subplots(figsize=(14, 0.45 * p + 1.6))
    if label_ops is None:
        label_ops = prog.num_ops <= 400
    for d, order in enumerate(prog.orders):
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for op in order:
            by_kind.setdefault(prog.labels[op][0], []).append((tl.start[op], tl.finish[op] - tl.start[op]))
        for kind, bars in by_kind.items():
            ax.broken_barh(bars, (d - 0.4, 0.8), facecolors=COLORS.get(kind, "grey"), edgecolor="white",
                           linewidth=0.3)
        if label_ops:
            for op in order:
                w = tl.finish[op] - tl.start[op]
                if w > step / 120:
                    ax.text(tl.start[op] + w / 2, d, str(prog.labels[op][3]), ha="center", va="center",
                            fontsize=6, color="white")
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {d}" for d in range(p)])
    ax.set_xlim(0, step)
    ax.set_xlabel("time (s)")
    kinds = sorted({lab[0] for lab in prog.labels}, key=list(COLORS).index)
    names = {"F": "forward", "B": "backward", "W": "weight grad", "F&B": "overlapped F&B", "EF": "encoder fwd",
             "EB": "encoder bwd"}
    ax.legend(handles=[Patch(color=COLORS[k], label=names[k]) for k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.18 if p > 4 else -0.35), ncol=len(kinds), fontsize=8, frameon=False)
    ax.set_title(title or f"step {step:.4g} s", fontsize=10)
    fig.tight_layout()
    out = save_figure(fig, path, dpi=130)
    plt.close(fig)
    return out
