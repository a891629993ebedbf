"""Sweeps over sequence length and CP degree, crossover lengths, and the crossover plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from k3sim.cp.comm import KernelClock, default_kernel_time
from k3sim.cp.geometry import CPGeometry
from k3sim.cp.model import layer_at, layer_inputs
from k3sim.cp.traffic import KDA_STRATEGIES, MLA_STRATEGIES, ring_kv_recv_bytes_per_rank
from k3sim.errors import InputError

DEFAULT_SEQ_LENS = [2 ** n for n in range(12, 21)]     # 4K .. 1M
DEFAULT_CPS = [2, 4, 8, 16, 32]


def sweep(g: CPGeometry, hardware: Any, seq_lens: list[int], cps: list[int], *, state_dtype: str = "fp32",
          kernel_time=None, docs: int | None = None, intra=None) -> list[dict]:
    """One row per (S, P, layer kind, strategy, KV form); combinations a strategy refuses are skipped
    with the reason in `skipped`."""
    clock = KernelClock(hardware, kernel_time or default_kernel_time())
    rows: list[dict] = []
    plans = [("kda", s, "-") for s in KDA_STRATEGIES] + \
            [("mla", s, kv) for s in MLA_STRATEGIES for kv in (("latent", "expanded") if s != "ulysses" else ("expanded",))]
    for P in cps:
        for S in seq_lens:
            for kind, strat, kv in plans:
                base = {"seq_len": S, "cp": P, "layer": kind, "strategy": strat, "mla_kv": kv}
                try:
                    x = layer_inputs(g, hardware, S, P, state_dtype=state_dtype,
                                     mla_kv=kv if kv != "-" else "latent", docs=docs, clock=clock,
                                     intra=intra)
                    lc = layer_at(strat, kind, x)
                except InputError as err:
                    rows.append({**base, "skipped": err.reason})
                    continue
                rows.append({**base, "link": lc.link, "fwd_recv_bytes_per_rank": lc.fwd.recv_bytes,
                             "bwd_recv_bytes_per_rank": lc.bwd.recv_bytes, "messages_fwd": lc.fwd.messages,
                             "fwd_s": lc.fwd.time_s, "bwd_s": lc.bwd.time_s, "time_s": lc.time_s,
                             "exposed_comm_s": lc.fwd.exposed_comm_s + lc.bwd.exposed_comm_s, "skipped": ""})
    return rows


def label(row: dict) -> str:
    return row["strategy"] + (f" ({row['mla_kv']})" if row["layer"] == "mla" and row["strategy"] != "ulysses" else "")


def crossovers(rows: list[dict], P: int, layer: str, key: str = "time_s", min_gap: float = 0.05) -> list[dict]:
    """Lengths where the ordering of two strategies on `key` flips (log-linear interpolation in S).

    Pairs that never differ by more than `min_gap` (5 %, a modelling choice) on both sides are near-ties,
    not crossovers."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["cp"] == P and r["layer"] == layer and not r["skipped"]:
            series.setdefault(label(r), []).append((r["seq_len"], r[key]))
    out = []
    names = sorted(series)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            sa, sb = dict(series[a]), dict(series[b])
            common = sorted(set(sa) & set(sb))
            logr = [np.log(sa[s] / sb[s]) for s in common]
            if not logr or min(logr) > -min_gap or max(logr) < min_gap:
                continue
            for s0, s1 in zip(common, common[1:]):
                d0, d1 = np.log(sa[s0] / sb[s0]), np.log(sa[s1] / sb[s1])
                if d0 == 0 or d0 * d1 < 0:
                    f = 0.0 if d0 == d1 else d0 / (d0 - d1)
                    s_x = float(np.exp(np.log(s0) + f * (np.log(s1) - np.log(s0))))
                    faster_after = a if d1 < 0 else b
                    out.append({"layer": layer, "cp": P, "a": a, "b": b, "seq_len": s_x,
                                "faster_above": faster_after})
    return out


def kcp_vs_ring_bytes_crossover(g: CPGeometry, P: int, state_bytes: float) -> float:
    """S above which a KCP layer receives fewer bytes than ring attention on a d-wide MHA layer (4bSd rule):
    (P-1) H d_k (d_k + d_v) s = (P-1)/P 4 S d  ->  S = P H d_k (d_k + d_v) s / (4 d)."""
    return P * g.kda_state_elems_per_rank(True) * state_bytes / (2 * g.hidden_size * g.act_bytes)


def save_figure(fig, path: Path) -> Path:
    """Lay out, write the PNG beside `path` and rename it over `path` (no half-written plot), close `fig`.
    Every cp plot goes through here."""
    from k3sim.files import save_figure as save_atomically

    fig.tight_layout()
    return save_atomically(fig, path, dpi=110)


def plot_crossover(rows: list[dict], P: int, g: CPGeometry, path: Path, state_bytes: float) -> Path:
    """Per-layer time and received bytes vs S, one line per strategy, KDA and MLA panels, at CP degree P."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9), sharex=True)
    for col, layer in enumerate(("kda", "mla")):
        sel = [r for r in rows if r["cp"] == P and r["layer"] == layer and not r["skipped"]]
        for name in sorted({label(r) for r in sel}):
            pts = sorted((r["seq_len"], r["time_s"], r["fwd_recv_bytes_per_rank"]) for r in sel if label(r) == name)
            s = [p[0] for p in pts]
            ls = "--" if "expanded" in name else "-"
            axes[0, col].plot(s, [p[1] for p in pts], ls, marker="o", ms=3, label=name)
            axes[1, col].plot(s, [p[2] for p in pts], ls, marker="o", ms=3, label=name)
        axes[0, col].set_title(f"{layer.upper()} layer, fwd+bwd time per rank (P={P})")
        axes[1, col].set_title(f"{layer.upper()} layer, forward bytes received per rank")
    s_all = np.array(sorted({r["seq_len"] for r in rows}), dtype=float)
    ref = ring_kv_recv_bytes_per_rank(s_all, P, 2 * g.hidden_size, g.act_bytes)
    axes[1, 0].plot(s_all, ref, ":", color="gray", label=f"ring, softmax MHA d={g.hidden_size} (4bSd rule)")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel("seconds")
    axes[1, 0].set_ylabel("bytes")
    for ax in axes[1]:
        ax.set_xlabel("sequence length S (tokens)")
    fig.suptitle(f"{g.name}: context-parallel strategies at P={P}, TP={g.tp}, state {int(state_bytes * 8)}-bit")
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def winners(rows: list[dict], P: int, layer: str, tie: float = 0.02) -> list[dict]:
    """The fastest exact strategy at each S (LASP-2 is a reference, not exact for KDA), and the lengths
    where the winner changes; the incumbent keeps the lead while within `tie` (2 %, a modelling choice) of
    the fastest."""
    by_s: dict[int, list[dict]] = {}
    for r in rows:
        if r["cp"] == P and r["layer"] == layer and not r["skipped"] and r["strategy"] != "lasp2":
            by_s.setdefault(r["seq_len"], []).append(r)
    out, prev = [], None
    for S in sorted(by_s):
        best = min(by_s[S], key=lambda r: r["time_s"])
        held = next((r for r in by_s[S] if label(r) == prev), None)
        if held is not None and held["time_s"] <= (1 + tie) * best["time_s"]:
            best = held
        name = label(best)
        if name != prev:
            out.append({"layer": layer, "cp": P, "from_seq_len": S, "fastest": name, "time_s": best["time_s"]})
            prev = name
    return out


STEP_COMBOS = [("kcp", "allgather-kv", "latent"), ("kcp", "zigzag-ring", "latent"), ("kcp", "zigzag-ring", "expanded"),
               ("kcp", "ring", "latent"), ("ulysses", "ulysses", "expanded"), ("ulysses", "zigzag-ring", "latent")]


def step_times(rows: list[dict], g: CPGeometry, P: int) -> dict[str, list[tuple[int, float]]]:
    """Attention time of one step (all KDA + MLA layers, fwd + bwd, one sequence) per strategy combination."""
    idx = {(r["seq_len"], r["layer"], r["strategy"], r["mla_kv"]): r["time_s"] for r in rows
           if r["cp"] == P and not r["skipped"]}
    out: dict[str, list[tuple[int, float]]] = {}
    for kda, mla, kv in STEP_COMBOS:
        name = f"KDA {kda} + MLA {mla}" + (f" ({kv})" if mla != "ulysses" else "")
        for S in sorted({r["seq_len"] for r in rows}):
            a, b = idx.get((S, "kda", kda, "-")), idx.get((S, "mla", mla, kv))
            if a is not None and b is not None:
                out.setdefault(name, []).append((S, g.num_kda_layers * a + g.num_mla_layers * b))
    return out


def plot_step(rows: list[dict], g: CPGeometry, cps: list[int], path: Path) -> Path:
    """Step attention time vs S per combination, one panel per P, relative to the default combination."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cps), figsize=(6 * len(cps), 4.5), squeeze=False)
    for ax, P in zip(axes[0], cps):
        series = step_times(rows, g, P)
        ref = dict(series.get("KDA kcp + MLA allgather-kv (latent)", []))
        for name, pts in series.items():
            pts = [(s, t / ref[s]) for s, t in pts if s in ref]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"P = {P}: step attention time / default (kcp + allgather-kv latent)")
        ax.set_xlabel("sequence length S (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("time relative to the default")
    fig.suptitle(f"{g.name}: {g.num_kda_layers} KDA + {g.num_mla_layers} MLA layers, forward + backward, one sequence")
    return save_figure(fig, path)
