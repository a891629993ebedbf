"""Summary metrics of a serving run: latency percentiles, throughput, goodput under SLOs, Little's law.

TTFT = first token - arrival; TPOT = (completion - first token) / (output tokens - 1) (requests of one output
token have no TPOT); e2e = completion - arrival; queueing delay = first scheduled step - arrival.
Percentiles use numpy's linear interpolation. Goodput counts requests meeting both SLOs (DistServe's
definition: TTFT <= slo_ttft and TPOT <= slo_tpot; a one-token request meets the TPOT SLO trivially).

Little's law is checked on every run: the time-average number in system (integrated at every arrival and
departure) against completion rate x mean time in system over the same span. With every request departed
the two agree to rounding; a gap means the engine lost or double-counted a request.

Overload (`overload`): a fleet fed faster than it serves has no steady state, and its latency percentiles are
those of a queue that grows with the trace's length (TTFTs of hours), not a property of the fleet. The run is
called overloaded when the requests waiting for a resource (arrived and not yet started, or prefilled and not
yet taken by a decode replica) grew over the second half of the arrival span by more than
`OVERLOAD_SIGMAS` x sqrt(arrivals in that half): a stable queue's count there is a draw from its stationary
distribution, a growing one rises by (arrival rate - service rate) x the half-span. The rate the fleet
sustains is then its measured completion rate from the half-span to the last moment a request still waited
(the fleet saturated throughout: the queue was never empty). Completions lag admissions by a service time, so
over the half-span alone the rate reads low when service times are long (measured on the default scenario, the
first 300 conversation-trace requests at their own times, 74 s of service each: 0.41 requests/s over the
arrivals' second half, 1.05 with the drain; 600 requests at 1.19 requests/s keep the queue flat).
"""

from __future__ import annotations

import math

LITTLE_TOLERANCE = 0.02  # the 2 %
# A modelling choice: three times the Poisson noise of the half-span's arrival count (sqrt(n)), so a stable
# queue's fluctuation is not called an overload, and a queue growing by a few percent of the arrivals is.
OVERLOAD_SIGMAS = 3.0


def _pct(a, q: float) -> float:
    import numpy as np

    a = a[~np.isnan(a)]
    return float(np.percentile(a, q)) if len(a) else math.nan


def overload(c: dict, first_arrival_s: float, last_arrival_s: float) -> dict:
    """Whether the run's queue grew without bound, from the finished requests' columns `c`
    (`RecordBook.columns()`) and the first and last arrival times: `overloaded`, `offered_rate_per_s` (arrivals
    over the arrival span), `sustainable_rate_per_s` (only when overloaded: completions per second from the
    half-span to the last moment a request waited, the fleet at its limit throughout), `queue_growth_requests`
    (waiting requests at the last arrival minus at the half-span) and `overload_threshold_requests`."""
    import numpy as np

    arr, sched, first, tstart = c["arrival_s"], c["scheduled_s"], c["first_token_s"], c["transfer_start_s"]
    n = len(arr)
    span = last_arrival_s - first_arrival_s
    out = {"overloaded": False, "offered_rate_per_s": (n - 1) / span if n > 1 and span > 0 else None,
           "sustainable_rate_per_s": None, "queue_growth_requests": None, "overload_threshold_requests": None}
    if n < 2 or not span > 0:
        return out  # one burst at one instant: a batch, not a rate
    pd = ~np.isnan(tstart)

    def waiting(t: float) -> int:
        """Arrived and not started, plus prefilled on a P pool and not yet taken by a D replica, at t."""
        front = np.count_nonzero(arr <= t) - np.count_nonzero(sched <= t)
        return int(front + np.count_nonzero(first[pd] <= t) - np.count_nonzero(tstart[pd] <= t))

    mid = first_arrival_s + span / 2
    growth = waiting(last_arrival_s) - waiting(mid)
    arrived = int(np.count_nonzero((arr > mid) & (arr <= last_arrival_s)))
    threshold = OVERLOAD_SIGMAS * math.sqrt(arrived)
    out.update(queue_growth_requests=growth, overload_threshold_requests=threshold)
    if arrived and growth > threshold:
        comp = c["completion_s"]
        drained = max(last_arrival_s, float(sched.max()), float(tstart[pd].max()) if pd.any() else 0.0)
        done = np.count_nonzero((comp > mid) & (comp <= drained))
        out.update(overloaded=True, sustainable_rate_per_s=float(done) / (drained - mid))
    return out


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
        **overload(c, fleet.first_arrival_s, fleet.last_arrival_s),
        "requests_rejected": fleet.rejected,
        "preemptions": fleet.preemptions,
        "slo_ttft_s": slo_ttft_s,
        "slo_tpot_s": slo_tpot_s,
        "gpus": gpus,
    }

