"""How well the EP all-to-all model (`k3sim.comm.ep`) holds on the DeepEP tables it is calibrated on, and on
the ones it never saw: `k3sim check deepep [--json]`.

- fit: the six parameters on all 20 fit rows (V1 normal 4 EP sizes x 2 phases, V1 low-latency 6 x 2) and each
  row's relative error;
- leave-one-out: each fit row predicted by the fit on the other 19;
- leave-EP-out: each EP size's rows (up to four: both kernels, both phases) predicted by the fit on the rest;
- held-out checks, never fit inputs: the low-latency table before DeepEP PR #173 (every pair over RDMA, the
  model with NVLink off for those kernels) and the DeepEP V2 figures (8K tokens, another implementation; the
  SM100 rows on the b200 profile's links), each predicted by the full fit.
Errors are (predicted - published) / published, the published figure as a time (`TableRow.seconds`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


def _err(pred: float, row) -> float:
    return pred / row.seconds - 1.0


def _row_out(row, pred: float) -> dict[str, Any]:
    return {"table": row.table, "kernel": row.kernel, "phase": row.phase, "ep": row.ep, "tokens_per_rank": row.tokens,
            "hardware": row.hardware, "reported": row.reported, "published_s": row.seconds, "predicted_s": pred,
            "rel_err": _err(pred, row)}


def _summary(errs: list[float]) -> dict[str, float]:
    a = [abs(e) for e in errs]
    return {"count": len(a), "mape": sum(a) / len(a) if a else float("nan"),
            "max_abs_rel_err": max(a, default=float("nan"))}


def leave_one_out(rows) -> list[dict[str, Any]]:
    """Each fit row predicted by the fit on the others."""
    from k3sim.comm.ep import fit

    return [_row_out(r, fit(rows[:i] + rows[i + 1:]).predict(r)) for i, r in enumerate(rows)]


def leave_ep_out(rows) -> list[dict[str, Any]]:
    """Each EP size's fit rows predicted by the fit on the other sizes."""
    from k3sim.comm.ep import fit

    out = []
    for ep in sorted({r.ep for r in rows}):
        cal = fit([r for r in rows if r.ep != ep])
        out += [_row_out(r, cal.predict(r)) for r in rows if r.ep == ep]
    return out


def report(root=None) -> dict[str, Any]:
    """The whole check as data (stable keys, SI units): the calibration, per-row errors and their summaries."""
    from k3sim.comm.ep import CALIBRATION, fit, table_rows

    rows = table_rows(root)
    fit_rows = [r for r in rows if r.role == "fit"]
    cal = fit(fit_rows)
    loo, leo = leave_one_out(fit_rows), leave_ep_out(fit_rows)
    fitted = [_row_out(r, cal.predict(r)) for r in fit_rows]
    checks = [_row_out(r, cal.predict(r)) for r in rows if r.role == "check"]
    params = asdict(cal)
    params["latency"] = {ph: {"a_s": a, "b_s_per_log2_ep": b} for ph, (a, b) in cal.latency.items()}
    return {"calibration": CALIBRATION, "parameters": params,
            "fit": {"rows": fitted, **_summary([r["rel_err"] for r in fitted])},
            "leave_one_out": {"rows": loo, **_summary([r["rel_err"] for r in loo])},
            "leave_ep_out": {"rows": leo, **_summary([r["rel_err"] for r in leo])},
            "checks": {"rows": checks, **{t: _summary([r["rel_err"] for r in checks if r["table"] == t])
                                          for t in sorted({r["table"] for r in checks})}}}


def table(rep: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The per-row table `k3sim check deepep` prints: published time and the fit, LOO, leave-EP-out errors."""
    key = lambda r: (r["table"], r["phase"], r["ep"], r["hardware"], r["reported"])  # noqa: E731
    loo = {key(r): r["rel_err"] for r in rep["leave_one_out"]["rows"]}
    leo = {key(r): r["rel_err"] for r in rep["leave_ep_out"]["rows"]}
    pct = lambda v: "" if v is None else f"{100 * v:+.1f} %"  # noqa: E731
    cols = ["table", "phase", "EP", "published", "published us", "predicted us", "fit", "LOO", "leave-EP-out"]
    body = []
    for r in rep["fit"]["rows"] + rep["checks"]["rows"]:
        where = "" if r["hardware"] == "h800" else f" [{r['hardware']}]"
        body.append([r["table"], r["phase"], r["ep"], r["reported"] + where,
                     f"{r['published_s'] * 1e6:.1f}", f"{r['predicted_s'] * 1e6:.1f}",
                     pct(r["rel_err"]) if key(r) in loo else f"check {pct(r['rel_err'])}",
                     pct(loo.get(key(r))), pct(leo.get(key(r)))])
    return cols, body
