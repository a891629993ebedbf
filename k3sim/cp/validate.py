"""Model vs measurement: the intra-device form against measured `chunk_kda_fwd` at several head counts,
and the KCP layer model against fla's KCP measured on two GPUs (`chunk_kda_cp_fwd[_bwd].csv`).

Runs on whatever the calibration harness has written under `hardware_profiles/measured/<profile>/*/`;
returns None when there is nothing to compare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from k3sim.cp.comm import KernelClock, default_kernel_time
from k3sim.cp.flops import kcp_preprocess_factor
from k3sim.cp.geometry import kda_layer_geometry
from k3sim.cp.intra_device import IntraParams, fit_naive, naive
from k3sim.cp.layers import kcp_layer
from k3sim.cp.model import layer_inputs


def measured_root(hw: Any) -> Path | None:
    from k3sim.configs.profiles import measured_dir

    return measured_dir(hw)


# fla's KCP measured on two GPUs: validation data of the KCP model (its parts, `cp/kcp_parts.py`), not kernel
# registry ops (`kernels.ops.PRICED_BY_CP`: one answer for KCP), so read here rather than by the kernel store
KCP_MEASURED = {"chunk_kda_cp_fwd": ("T", "H", "gpus", "docs"), "chunk_kda_cp_fwd_bwd": ("T", "H", "gpus", "docs")}


def load_op(root: Path | None, op: str):
    """The ok rows of `<op>` over every run directory, one per shape: a shape measured by several runs
    takes the latest run's row (the kernel store's rule, `MeasurementStore.points`), with all its
    columns (e.g. KCP's `single_gpu_seconds`). None when nothing was measured. A registry op comes from
    the kernel store; the KCP validation files (`KCP_MEASURED`) are read and checked here."""
    if root is None or not any(root.glob(f"*/{op}.csv")):
        return None
    from k3sim.kernels.store import load_store

    store = load_store(root)
    if op in KCP_MEASURED:
        keys = list(KCP_MEASURED[op])
        df = _read_validation(root, op, keys)
    else:
        from k3sim.kernels.ops import OPS

        keys = list(OPS[op].params)
        df = store.ok(op)
    if df.empty:
        return None
    order = {r: i for i, r in enumerate(store.run_order())}
    df = df.assign(_order=df["run_id"].map(order)).sort_values("_order", kind="stable")
    df = df.drop_duplicates(keys, keep="last").drop(columns="_order").reset_index(drop=True)
    df[keys] = df[keys].astype("int64")
    return df


def _read_validation(root: Path, op: str, keys: list[str]):
    """The ok rows of every run's `<op>.csv` (through the one measured-file reader), with `run_id`; a file
    without the shape and timing columns, or an ok row whose shape is not positive whole numbers or whose
    seconds are not a positive number, is refused naming the file."""
    import io

    import pandas as pd

    from k3sim.errors import InputError, shorten
    from k3sim.kernels.store import read_measured

    frames = []
    for path in sorted(Path(root).glob(f"*/{op}.csv")):
        try:
            df = pd.read_csv(io.BytesIO(read_measured(path, "measured CSV")))
        except pd.errors.EmptyDataError:
            continue
        except (pd.errors.ParserError, UnicodeDecodeError) as err:
            raise InputError(f"corrupt CSV ({err.__class__.__name__})", source=str(path)) from None
        missing = [c for c in (*keys, "seconds", "status") if c not in df.columns]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)}: not a {op} measurement file", source=str(path))
        df = df[df["status"].astype(str).str.strip() == "ok"].copy()
        for col in (*keys, "seconds"):
            v = pd.to_numeric(df[col], errors="coerce")
            whole = col != "seconds"
            bad = ~(np.isfinite(v) & (v > 0)) | ((v != v.round()) if whole else False)
            if bad.any():
                raise InputError(f"ok row with {col}={shorten(repr(df[col][bad].iloc[0]), 30)}: a positive "
                                 f"{'whole ' if whole else ''}number is needed; fix or mark the row failed",
                                 source=str(path), field=col)
            df[col] = v
        frames.append(df.assign(run_id=path.parent.name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*keys, "seconds", "run_id"])


def _intra_points(root: Path | None):
    """(T, H, seconds) of the measured chunk_kda_fwd shapes (the latest run's row of each), or None."""
    df = load_op(root, "chunk_kda_fwd")
    if df is None:
        return None
    return df["T"].to_numpy(), df["H"].to_numpy(), df["seconds"].to_numpy(float)


def fit_intra(hw: Any, root: Path | None) -> IntraParams | None:
    """The naive form fitted on every measured head count (what `intra_device_check` reports as "params"),
    without its leave-one-head-out refits; None when nothing was measured."""
    pts = _intra_points(root)
    return None if pts is None else fit_naive(*pts, IntraParams.from_hardware(hw))[0]


def intra_device_check(hw: Any, root: Path | None) -> dict | None:
    """Fit the naive form on all head counts, then leave one head count out and predict it."""
    pts = _intra_points(root)
    if pts is None:
        return None
    T, H, s = pts
    base = IntraParams.from_hardware(hw)
    fitted, stats = fit_naive(T, H, s, base)
    rows = []
    for h in sorted(set(H)):
        keep = H != h
        if len(set(H[keep])) < 2:
            continue
        p_out, _ = fit_naive(T[keep], H[keep], s[keep], base)
        for t_, s_ in zip(T[~keep], s[~keep]):
            rows.append({"T": int(t_), "H": int(h), "measured_s": float(s_),
                         "fit_all_s": naive(int(t_), int(h), fitted).seconds,
                         "leave_head_out_s": naive(int(t_), int(h), p_out).seconds,
                         "roofline_guess_s": naive(int(t_), int(h), base).seconds})
    for r in rows:
        r["fit_all_err"] = r["fit_all_s"] / r["measured_s"] - 1
        r["leave_head_out_err"] = r["leave_head_out_s"] / r["measured_s"] - 1
    loho = np.abs([r["leave_head_out_err"] for r in rows]) if rows else np.array([np.nan])
    return {"params": fitted, "fit": stats, "leave_head_out_mape": float(np.mean(loho)),
            "leave_head_out_max": float(np.max(loho)), "rows": rows}


def kcp_check(hw: Any, root: Path | None, kernel_time=None, pre_factor: float | None = None,
              intra: Any = None) -> dict | None:
    """Predicted vs measured KCP layer time (fwd and fwd+bwd) on the measured GPU counts.

    The pre-process is predicted from the FLOP ratio (on the fitted GPU time when `intra` is given); with
    `intra` a second prediction uses the state-pass alternative, reported as `predicted_fwd_intra_s`."""
    fwd = load_op(root, "chunk_kda_cp_fwd")
    if fwd is None:
        return None
    fb = load_op(root, "chunk_kda_cp_fwd_bwd")
    clock = KernelClock(hw, kernel_time or default_kernel_time())
    rows = []
    key = ["T", "H", "gpus", "docs"]
    fbm = {} if fb is None else {tuple(int(v) for v in r[key]): float(r["seconds"]) for _, r in fb.iterrows()}
    for _, r in fwd.iterrows():
        T, H, P, docs = (int(r[k]) for k in key)
        g = kda_layer_geometry(H, f"kda-{H}h")
        x = layer_inputs(g, hw, T, P, state_dtype="fp32", docs=docs, clock=clock, conv_halo=False,
                         kcp_pre_factor=pre_factor, intra=intra)
        lc = kcp_layer(x)
        pre = next((row["seconds"] for row in lc.fwd.rows if row["component"].startswith("pre-process")), 0.0)
        row = {"T": T, "H": H, "gpus": P, "docs": docs, "measured_fwd_s": float(r["seconds"]),
               "predicted_fwd_s": lc.fwd.time_s, "fwd_err": lc.fwd.time_s / float(r["seconds"]) - 1,
               "predicted_preprocess_s": pre, "source": lc.fwd.rows[0]["source"]}
        if "single_gpu_seconds" in r and np.isfinite(r["single_gpu_seconds"]):
            row["measured_single_gpu_fwd_s"] = float(r["single_gpu_seconds"])
            row["measured_speedup"] = float(r["single_gpu_seconds"]) / float(r["seconds"])
            row["predicted_speedup"] = clock("chunk_kda_fwd", T=T, H=H)[0] / lc.fwd.time_s
        if (T, H, P, docs) in fbm:
            row["measured_fwd_bwd_s"] = fbm[(T, H, P, docs)]
            row["predicted_fwd_bwd_s"] = lc.time_s
            row["fwd_bwd_err"] = lc.time_s / fbm[(T, H, P, docs)] - 1
        if intra is not None:
            xi = layer_inputs(g, hw, T, P, state_dtype="fp32", docs=docs, clock=clock, conv_halo=False, intra=intra,
                              pre_model="state-pass")
            li = kcp_layer(xi)
            row["predicted_fwd_intra_s"] = li.fwd.time_s
            row["fwd_intra_err"] = li.fwd.time_s / float(r["seconds"]) - 1
            if "measured_fwd_bwd_s" in row:
                row["predicted_fwd_bwd_intra_s"] = li.time_s
                row["fwd_bwd_intra_err"] = li.time_s / row["measured_fwd_bwd_s"] - 1
        rows.append(row)
    errs = np.abs([r["fwd_err"] for r in rows])
    fb_errs = np.abs([r["fwd_bwd_err"] for r in rows if "fwd_bwd_err" in r])
    # the one free KCP parameter: the pre-process factor that would match each measured forward
    implied = []
    for r in rows:
        if r["predicted_preprocess_s"] > 0:
            k0 = kcp_preprocess_factor() if pre_factor is None else pre_factor
            base = r["predicted_fwd_s"] - r["predicted_preprocess_s"]
            implied.append((r["measured_fwd_s"] - base) / (r["predicted_preprocess_s"] / k0))  # pre is linear in k
    ie = np.abs([r["fwd_intra_err"] for r in rows if "fwd_intra_err" in r])
    ibe = np.abs([r["fwd_bwd_intra_err"] for r in rows if "fwd_bwd_intra_err" in r])
    return {"rows": rows, "fwd_mape": float(errs.mean()), "fwd_max_err": float(errs.max()),
            "fwd_intra_mape": float(ie.mean()) if len(ie) else None,
            "fwd_bwd_intra_mape": float(ibe.mean()) if len(ibe) else None,
            "fwd_bwd_mape": float(fb_errs.mean()) if len(fb_errs) else None,
            "implied_pre_factor_median": float(np.median(implied)) if implied else None}
