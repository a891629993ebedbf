"""`k3sim cp --sweep`: the sweep table, crossover plots, intra-device plot, the published point, the
model-vs-measurement check when data exists, and a generated `summary.md` with the key figures; written
whole through `k3sim.files.output_dir` (kind `cp-sweep`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k3sim.cp import intra_device as ID
from k3sim.cp.flops import kcp_preprocess_factor
from k3sim.cp.geometry import CPGeometry
from k3sim.cp.sweep import (crossovers, kcp_vs_ring_bytes_crossover, plot_crossover, plot_step, save_figure,
                             step_times, sweep, winners)
from k3sim.cp.traffic import layer_traffic, ring_kv_recv_bytes_per_rank
from k3sim.errors import InputError

MIB = 2 ** 20


def _write(path: Path, text: str) -> None:
    from k3sim.files import atomic_write_text

    atomic_write_text(path, text)


def _csv(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    _write(path, pd.DataFrame(rows).to_csv(index=False))


def facts(g: CPGeometry) -> dict:
    """The issue's anchor figures, from the traffic formulas (bf16 state for KCP as the paper counts)."""
    out = {}
    for S in (32768, 1048576):
        f, _ = layer_traffic("kcp", "kda", g, S, 8, state_bytes=2.0, conv_halo=False)
        out[f"kcp_bf16_P8_S{S}_recv_bytes_per_rank"] = f.recv_bytes
    out["kcp_bf16_fragment_bytes_per_rank"] = g.kda_state_elems_per_rank(True) * 2.0
    out["kcp_bf16_fragment_bytes_per_head"] = out["kcp_bf16_fragment_bytes_per_rank"] / g.kda_heads_per_rank
    out["ring_4bSd_bytes_S1e6_d"] = 4 * 1e6 * g.hidden_size
    out["ring_recv_bytes_per_rank_S1e6_P8"] = ring_kv_recv_bytes_per_rank(1e6, 8, 2 * g.hidden_size, g.act_bytes)
    out["kcp_fewer_bytes_than_ring_above_S_P8_bf16"] = kcp_vs_ring_bytes_crossover(g, 8, 2.0)
    return out


def plot_intra(rows: list[dict], path: Path, title: str, measured: dict | None = None) -> None:
    """GPU fraction and ns/token per form and TP; `measured` {heads: seconds per token} marks fla's
    measured chunk_kda (the naive form) at the same length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tps = sorted({r["tp"] for r in rows})
    forms = list(ID.FORMS)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    w = 0.8 / len(forms)
    for i, f in enumerate(forms):
        sel = [next(r for r in rows if r["tp"] == tp and r["form"] == f) for tp in tps]
        xs = [j + i * w for j in range(len(tps))]
        axes[0].bar(xs, [r["gpu_fraction"] for r in sel], w, label=f)
        axes[1].bar(xs, [r["seconds_per_token"] * 1e9 for r in sel], w, label=f)
    if measured:
        pts = [(j, measured[rows[0]["heads_per_rank"] * rows[0]["tp"] // tp]) for j, tp in enumerate(tps)
               if rows[0]["heads_per_rank"] * rows[0]["tp"] // tp in measured]
        axes[1].plot([j for j, _ in pts], [v * 1e9 for _, v in pts], "k_", ms=22, mew=3,
                     label="measured fla chunk_kda (naive)")
    for ax in axes:
        ax.set_xticks([j + w for j in range(len(tps))])
        ax.set_xticklabels([f"TP={tp}\n{rows[0]['heads_per_rank'] * rows[0]['tp'] // tp} heads" for tp in tps])
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("mean fraction of SMs busy")
    axes[1].set_ylabel("prefill ns per token (one KDA layer, one rank)")
    fig.suptitle(title)
    save_figure(fig, path)


def plot_intra_fit(rows: list[dict], path: Path, hw_name: str) -> None:
    """Measured chunk_kda_fwd per token vs T, one colour per head count, with the fitted naive form
    (solid) and the fit that never saw that head count (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for h in sorted({r["H"] for r in rows}):
        sel = sorted((r for r in rows if r["H"] == h), key=lambda r: r["T"])
        T = [r["T"] for r in sel]
        line, = ax.plot(T, [r["measured_s"] / r["T"] * 1e9 for r in sel], "o", label=f"measured H={h}")
        ax.plot(T, [r["fit_all_s"] / r["T"] * 1e9 for r in sel], "-", color=line.get_color())
        ax.plot(T, [r["leave_head_out_s"] / r["T"] * 1e9 for r in sel], "--", color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens T")
    ax.set_ylabel("chunk_kda forward, ns per token")
    ax.set_title(f"naive chunkwise form vs measured fla chunk_kda on {hw_name}\n"
                 "solid: fit on all head counts; dashed: fit without this head count")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_kcp_validation(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for key in sorted({(r["H"], r["docs"]) for r in rows}):
        sel = sorted((r for r in rows if (r["H"], r["docs"]) == key), key=lambda r: r["T"])
        T = [r["T"] for r in sel]
        tag = f"H={key[0]} docs={key[1]}"
        line, = ax.plot(T, [r["measured_fwd_s"] for r in sel], "o-", label=f"fwd measured {tag}")
        ax.plot(T, [r["predicted_fwd_s"] for r in sel], "x--", color=line.get_color(), label=f"fwd predicted {tag}")
        fb = [r for r in sel if "measured_fwd_bwd_s" in r]
        if fb:
            line, = ax.plot([r["T"] for r in fb], [r["measured_fwd_bwd_s"] for r in fb], "s-",
                            label=f"fwd+bwd measured {tag}")
            ax.plot([r["T"] for r in fb], [r["predicted_fwd_bwd_s"] for r in fb], "x--", color=line.get_color(),
                    label=f"fwd+bwd predicted {tag}")
        one = [r for r in sel if "measured_single_gpu_fwd_s" in r]
        if one:
            ax.plot([r["T"] for r in one], [r["measured_single_gpu_fwd_s"] for r in one], "^:", color="gray",
                    label=f"fwd on one GPU, measured {tag}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("global tokens T")
    ax.set_ylabel("one KDA layer (s)")
    ax.set_title(f"fla KCP on {rows[0]['gpus']} GPUs: predicted vs measured")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def check_sweep_inputs(g: CPGeometry, seq_lens: list[int], cps: list[int], focus_cp: int) -> None:
    """Refuse a sweep that cannot produce its outputs, before anything is computed or written."""
    if not seq_lens:
        raise InputError("no sequence lengths to sweep", source="--seq-lens")
    if not cps:
        raise InputError("no CP degrees to sweep", source="--cps")
    bad = [S for S in seq_lens if S <= 0]
    if bad:
        raise InputError(f"sequence lengths must be positive, got {bad[0]}", source="--seq-lens")
    bad = [P for P in cps if P < 1]
    if bad:
        raise InputError(f"CP degrees must be at least 1, got {bad[0]}", source="--cps")
    if focus_cp not in cps:
        raise InputError(f"the plotted CP degree --cp {focus_cp} is not among --cps {','.join(map(str, cps))}",
                         source="--cp")
    for kind, n in (("kda", g.num_kda_layers), ("mla", g.num_mla_layers)):
        # every sweep strategy splits S into P (contiguous) or 2P (zigzag) parts; need one usable S per kind
        if n and not any(S % focus_cp == 0 for S in seq_lens):
            raise InputError(f"P = {focus_cp} divides none of the sweep lengths, nothing to plot for "
                             f"{kind.upper()} layers", source="--seq-lens")


KIND = "cp-sweep"  # the output kind of a `cp --sweep` directory (k3sim.files manifest)


def write_report(g: CPGeometry, hw: Any, seq_lens: list[int], cps: list[int], out: Path, *,
                 state_dtype: str = "fp32", focus_cp: int = 8, kernel_time=None) -> dict:
    """Write every sweep output into `out`, all or nothing, through `k3sim.files.output_dir` (kind
    `cp-sweep`): a failure leaves `out` as it was, or absent; files in `out` that k3sim did not write (a
    README) are never touched."""
    from k3sim.files import output_dir

    check_sweep_inputs(g, seq_lens, cps, focus_cp)
    out = Path(out)
    with output_dir(out, kind=KIND):
        return _write_report(g, hw, seq_lens, cps, out, state_dtype=state_dtype, focus_cp=focus_cp,
                             kernel_time=kernel_time)


def _write_report(g: CPGeometry, hw: Any, seq_lens: list[int], cps: list[int], out: Path, *,
                  state_dtype: str = "fp32", focus_cp: int = 8, kernel_time=None) -> dict:
    from k3sim.configs import load_hardware
    from k3sim.configs.dtypes import bytes_per_element
    from k3sim.cp import validate as V
    from k3sim.cp.published import published_table

    files: dict[str, str] = {}
    root = V.measured_root(hw)
    check = V.intra_device_check(hw, root)          # fitted to measured chunk_kda_fwd when it exists
    fitted = check["params"] if check else None
    rows = sweep(g, hw, seq_lens, cps, state_dtype=state_dtype, kernel_time=kernel_time, intra=fitted)
    _csv(out / "sweep.csv", rows)
    files["sweep"] = str(out / "sweep.csv")
    sb = bytes_per_element(state_dtype)
    focus = [focus_cp] + [P for P in cps if P * g.tp > hw.scaleup_domain_gpus][:1]
    win, cross = [], []
    for P in dict.fromkeys(focus):
        if P not in cps:
            continue
        name = "crossover.png" if P == focus_cp else f"crossover_p{P}.png"
        plot_crossover(rows, P, g, out / name, sb)
        files[name] = str(out / name)
    for P in cps:
        for layer in ("kda", "mla"):
            win += winners(rows, P, layer)
            cross += crossovers(rows, P, layer)
    _csv(out / "crossovers.csv", cross)
    files["crossovers"] = str(out / "crossovers.csv")
    step_ps = [P for P in dict.fromkeys(focus) if P in cps]
    plot_step(rows, g, step_ps, out / "step_time.png")
    files["step_time"] = str(out / "step_time.png")
    steps = {P: step_times(rows, g, P) for P in step_ps}

    params = fitted or ID.IntraParams.from_hardware(hw)
    intra = [r for T in (32768, 131072, 1048576) for r in ID.table(g.kda_heads, [1, 2, 4, 8], T, params)]
    _csv(out / "intra_device.csv", intra)
    meas = None if not check else {r["H"]: r["measured_s"] / r["T"] for r in check["rows"] if r["T"] == 131072}
    plot_intra([r for r in intra if r["T"] == 131072], out / "intra_device.png",
               f"{g.name}: one KDA layer, 128K-token prefill on one {hw.name} ({params.source})", meas)
    files["intra_device"] = str(out / "intra_device.png")
    if check:
        _csv(out / "intra_device_validation.csv", check["rows"])
        plot_intra_fit(check["rows"], out / "intra_device_fit.png", hw.name)
        files["intra_device_validation"] = str(out / "intra_device_validation.csv")
        files["intra_device_fit"] = str(out / "intra_device_fit.png")

    pub = published_table(load_hardware("h800"), hw, kernel_time=kernel_time, intra=fitted)
    _write(out / "published_h800.json", json.dumps(pub, indent=2))
    files["published"] = str(out / "published_h800.json")

    kcp = V.kcp_check(hw, root, kernel_time=kernel_time, intra=check["params"] if check else None)
    if kcp:
        _csv(out / "kcp_validation.csv", kcp["rows"])
        plot_kcp_validation(kcp["rows"], out / "kcp_validation.png")
        files["kcp_validation"] = str(out / "kcp_validation.png")

    fx = facts(g)
    result = {"facts": fx, "winners": win, "crossovers": cross, "published": pub, "files": files,
              "step_attention_time_s": {str(P): {k: dict(v) for k, v in st.items()} for P, st in steps.items()},
              "intra_device_params": vars(params),
              "intra_device_fit": None if not check else {k: check[k] for k in ("fit", "leave_head_out_mape",
                                                                               "leave_head_out_max")},
              "kcp_validation": None if not kcp else {k: v for k, v in kcp.items() if k != "rows"}}
    _write(out / "summary.md", summary_md(g, hw, result, intra, kcp, focus_cp))
    files["summary"] = str(out / "summary.md")
    return result


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def summary_md(g: CPGeometry, hw: Any, res: dict, intra: list[dict], kcp: dict | None, P: int) -> str:
    fx = res["facts"]
    L = [f"# k3sim cp: generated figures ({g.name} on {hw.name})", "",
         "Generated by `k3sim cp --sweep`; do not edit by hand. Reading: README.md.", "",
         "## Anchor figures (traffic formulas)", "",
         "| quantity | value |", "|---|---|",
         f"| KCP fragment per head, bf16 (128 x 256 x 2 B) | {fx['kcp_bf16_fragment_bytes_per_head'] / 1024:.0f} KiB |",
         f"| KCP fragment per rank per layer, bf16, {g.kda_heads} heads | "
         f"{fx['kcp_bf16_fragment_bytes_per_rank'] / MIB:.1f} MiB |",
         f"| KCP received per rank per layer, bf16, P = 8, S = 32K | "
         f"{fx['kcp_bf16_P8_S32768_recv_bytes_per_rank'] / MIB:.1f} MiB |",
         f"| same at S = 1M | {fx['kcp_bf16_P8_S1048576_recv_bytes_per_rank'] / MIB:.1f} MiB |",
         f"| ring, 4bSd rule at d = {g.hidden_size}, S = 10^6 | {fx['ring_4bSd_bytes_S1e6_d'] / 1e9:.1f} GB |",
         f"| ring received per rank at P = 8 ((P-1)/P of it) | {fx['ring_recv_bytes_per_rank_S1e6_P8'] / 1e9:.1f} GB |",
         f"| KCP (bf16) moves fewer bytes than that ring above S = | "
         f"{fx['kcp_fewer_bytes_than_ring_above_S_P8_bf16']:.0f} tokens |", "",
         f"## Fastest strategy per layer kind and where it changes (P = {P})", "",
         "| layer | fastest | from S |", "|---|---|---|"]
    L += [f"| {w['layer']} | {w['fastest']} | {w['from_seq_len']:,} |" for w in res["winners"] if w["cp"] == P]
    for Pst, st in res["step_attention_time_s"].items():
        names = list(st)
        lens = sorted({s for v in st.values() for s in v})
        L += ["", f"## Step attention time at P = {Pst} (all layers, fwd + bwd, one sequence, seconds)", "",
              "| S | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        L += [f"| {S:,} | " + " | ".join(f"{st[n][S]:.3g}" if S in st[n] else "-" for n in names) + " |" for S in lens]
    L += ["", f"## Pairwise time crossovers at P = {P}", "", "| layer | a | b | S | faster above |",
          "|---|---|---|---|---|"]
    L += [f"| {c['layer']} | {c['a']} | {c['b']} | {c['seq_len']:,.0f} | {c['faster_above']} |"
          for c in res["crossovers"] if c["cp"] == P]
    pub = res["published"]
    L += ["", "## Published point: fla PR #691 setting (32K, CP = 4, 64 heads, d = 128, H800)", "",
          "| source | fwd KCP rate | fwd a2a rate | fwd a2a/KCP time | fwd+bwd KCP rate | fwd+bwd a2a rate | "
          "fwd+bwd a2a/KCP time |", "|---|---|---|---|---|---|---|"]
    gd = pub["published_gdn"]
    L.append(f"| published, GDN (PR #691) | {gd['fwd']['kcp_rate_pct']:.1f}% | {gd['fwd']['a2a_rate_pct']:.1f}% | "
             f"{gd['fwd']['a2a_ms'] / gd['fwd']['kcp_ms']:.2f}x | {gd['fwd_bwd']['kcp_rate_pct']:.1f}% | "
             f"{gd['fwd_bwd']['a2a_rate_pct']:.1f}% | {gd['fwd_bwd']['a2a_ms'] / gd['fwd_bwd']['kcp_ms']:.2f}x |")
    L.append(f"| seed, KDA ('76% / 86%') | {pub['seed_kda']['fwd_pct']:.0f}% ? | | | "
             f"{pub['seed_kda']['fwd_bwd_pct']:.0f}% ? | | |")
    for p in pub["predicted_kda"]:
        f, fb = p["fwd"], p["fwd_bwd"]
        L.append(f"| model, KDA, {p['label']} ({p['kernel_source']}) | {f['kcp_rate_pct']:.1f}% | "
                 f"{f['a2a_rate_pct']:.1f}% | {f['a2a_over_kcp_time']:.2f}x | {fb['kcp_rate_pct']:.1f}% | "
                 f"{fb['a2a_rate_pct']:.1f}% | {fb['a2a_over_kcp_time']:.2f}x |")
    L += ["", "KCP pre-process factor (x a local forward) that would reproduce the seed's 76 % / 86 % "
          "(negative: no cost can):", "", "| prediction | as KCP rates | as speed-ups over all-to-all |", "|---|---|---|"]
    L += [f"| {p['label']} | {p['pre_factor_for_seed_fwd_rate']:.2f} / {p['pre_factor_for_seed_fwd_bwd_rate']:.2f} | "
          f"{p['pre_factor_for_seed_fwd_speedup']:.2f} / {p['pre_factor_for_seed_fwd_bwd_speedup']:.2f} |"
          for p in pub["predicted_kda"]]
    L += ["", f"Model default {kcp_preprocess_factor():.2f}; measured KCP implies "
          + (f"{kcp['implied_pre_factor_median']:.2f}." if kcp and kcp["implied_pre_factor_median"] else "n/a.")]
    L += ["", f"## Intra-device forms, one KDA layer, {g.kda_heads} heads / TP ({res['intra_device_params']['source']})",
          "", "| T | TP | heads/rank | form | time | ns/token | GPU-ns/token (x TP) | GPU fraction | segments |",
          "|---|---|---|---|---|---|---|---|---|"]
    L += [f"| {r['T']:,} | {r['tp']} | {r['heads_per_rank']} | {r['form']} | {_fmt_s(r['seconds'])} | "
          f"{r['seconds_per_token'] * 1e9:.2f} | {r['gpu_seconds_per_token'] * 1e9:.2f} | {r['gpu_fraction']:.2f} | "
          f"{r['segments']} |" for r in intra]
    if res["intra_device_fit"]:
        fit = res["intra_device_fit"]
        L += ["", f"Naive form fitted to measured chunk_kda_fwd: MAPE {fit['fit']['mape'] * 100:.1f}% "
                  f"(max {fit['fit']['max_rel_err'] * 100:.1f}%, {fit['fit']['points']} points, "
                  f"{fit['fit']['blocks_per_sm']} block/SM); leave-one-head-count-out MAPE "
                  f"{fit['leave_head_out_mape'] * 100:.1f}% (max {fit['leave_head_out_max'] * 100:.1f}%)."]
    else:
        L += ["", "No measured chunk_kda_fwd yet: parameters are the roofline guess."]
    if kcp:
        L += ["", "## KCP predicted vs measured (fla, forward, one KDA layer)", "",
              "| T | H | gpus | docs | measured | predicted | error | measured speed-up | predicted speed-up |"
              " fwd+bwd measured | fwd+bwd predicted |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in kcp["rows"]:
            L.append(f"| {r['T']:,} | {r['H']} | {r['gpus']} | {r['docs']} | {_fmt_s(r['measured_fwd_s'])} | "
                     f"{_fmt_s(r['predicted_fwd_s'])} | {r['fwd_err'] * 100:+.1f}% | "
                     f"{r.get('measured_speedup', float('nan')):.2f} | {r.get('predicted_speedup', float('nan')):.2f} | "
                     f"{_fmt_s(r['measured_fwd_bwd_s']) if 'measured_fwd_bwd_s' in r else '-'} | "
                     f"{_fmt_s(r['predicted_fwd_bwd_s']) if 'predicted_fwd_bwd_s' in r else '-'} |")
        fbm = "-" if kcp["fwd_bwd_mape"] is None else f"{kcp['fwd_bwd_mape'] * 100:.1f}%"
        L += ["", f"Forward MAPE {kcp['fwd_mape'] * 100:.1f}% (max {kcp['fwd_max_err'] * 100:.1f}%); "
                  f"fwd+bwd MAPE {fbm}; pre-process factor implied by the measurements (median): "
                  + (f"{kcp['implied_pre_factor_median']:.2f}." if kcp["implied_pre_factor_median"] else "n/a.")]
    else:
        L += ["", "No measured KCP data yet (`chunk_kda_cp_fwd.csv`)."]
    return "\n".join(L) + "\n"
