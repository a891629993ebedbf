"""Summary metrics of a serving run: latency percentiles, throughput, goodput under SLOs, Little's law.

TTFT = first token - arrival; TPOT = (completion - first token) / (output tokens - 1) (requests of one output
token have no TPOT); e2e = completion - arrival; queueing delay = first scheduled step - arrival.
Percentiles use numpy's linear interpolation. Goodput counts requests meeting both SLOs (DistServe's
definition: TTFT <= slo_ttft and TPOT <= slo_tpot; a one-token request meets the TPOT SLO trivially).

Little's law is checked on every run: the time-average number in system (integrated at every arrival and
departure) against completion rate x mean time in system over the same span. With every request departed
the two agree to rounding; a gap means the engine lost or double-counted a request.
"""

from __future__ import annotations

import math

LITTLE_TOLERANCE = 0.02  # the 2 %


def _pct(a, q: float) -> float:
    import numpy as np

    a = a[~np.isnan(a)]
    return float(np.percentile(a, q)) if len(a) else math.nan


def summarize(fleet, *, sim_seconds: float, gpus: int, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    """The issue's JSON keys (SI units), plus a few diagnostics."""
    import numpy as np

    c = fleet.records.columns()
    n = len(c["request"])
    arr, first, comp = c["arrival_s"], c["first_token_s"], c["completion_s"]
    out_tok = c["output_tokens"]
    ttft = first - arr
    e2e = comp - arr
    queue = c["scheduled_s"] - arr
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tok > 1, (comp - first) / np.maximum(out_tok - 1, 1), np.nan)
    span = sim_seconds if sim_seconds > 0 else math.nan
    good = int(np.sum((ttft <= slo_ttft_s) & ((out_tok <= 1) | (tpot <= slo_tpot_s)))) if n else 0
    sojourn = float(e2e.sum()) + fleet.rejected_sojourn_s
    departed = n + fleet.rejected
    mean_in_system = fleet.area / span if span == span else math.nan
    little_rhs = (departed / span) * (sojourn / departed) if departed and span == span else math.nan
    little_err = abs(mean_in_system - little_rhs) / little_rhs if little_rhs and little_rhs == little_rhs else 0.0
    return {
        "requests": n,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90), "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50), "tpot_p90_s": _pct(tpot, 90), "tpot_p99_s": _pct(tpot, 99),
        "e2e_p50_s": _pct(e2e, 50), "e2e_p90_s": _pct(e2e, 90), "e2e_p99_s": _pct(e2e, 99),
        "queue_p50_s": _pct(queue, 50), "queue_p90_s": _pct(queue, 90), "queue_p99_s": _pct(queue, 99),
        "throughput_requests_per_s": n / span if n else 0.0,
        "throughput_output_tokens_per_s_per_gpu": float(out_tok.sum()) / span / gpus if n else 0.0,
        "goodput_requests_per_s": good / span if n else 0.0,
        "token_hit_rate": fleet.hit_tokens / fleet.input_tokens if fleet.input_tokens else 0.0,
        "mean_requests_in_system": mean_in_system,
        "mean_e2e_s": float(e2e.mean()) if n else math.nan,
        "sim_seconds": sim_seconds,
        "little_law_relative_error": little_err,
        "requests_rejected": fleet.rejected,
        "preemptions": fleet.preemptions,
        "slo_ttft_s": slo_ttft_s,
        "slo_tpot_s": slo_tpot_s,
        "gpus": gpus,
    }

