"""Arrival processes over a stream of requests: the trace's own timestamps (optionally scaled), Poisson, or
gamma-bursty at a rate.

Every function takes and yields an iterator, one request at a time, so a million-request trace never sits in
memory. Poisson and gamma draw inter-arrival gaps from one seeded generator in blocks of unit-mean draws scaled
by 1/rate: the same seed at a higher rate compresses the same gap sequence (common random numbers), so a rate
sweep compares like with like.

`synthetic_stream` is a seeded block-id workload generated lazily (the seeded generators of
`k3sim.workloads.synthetic` build token lists in memory, fine for thousands of requests, not for a million).
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

from k3sim.errors import InputError
from k3sim.workloads.request import TraceRequest

ARRIVALS = ("trace", "poisson", "gamma")
_BLOCK = 4096  # draws per numpy call (a speed choice, not a model parameter)


def _check_rate(rate: float, source: str = "--arrival-rate") -> None:
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise InputError(f"must be a finite positive number of requests/s (got {rate})", source=source)


def _gaps(rng, kind: str, cv: float) -> Iterator[float]:
    """Unit-mean inter-arrival gaps: exponential (Poisson) or gamma with coefficient of variation `cv`."""
    while True:
        if kind == "poisson":
            block = rng.exponential(1.0, _BLOCK)
        else:
            shape = 1.0 / (cv * cv)
            block = rng.gamma(shape, 1.0 / shape, _BLOCK)
        yield from block.tolist()


def retime(requests: Iterable[TraceRequest], kind: str, rate: float, *, seed: int = 0,
           cv: float = 1.0) -> Iterator[TraceRequest]:
    """The same requests (contents, lengths) at new arrival times: Poisson or gamma (burstier when cv > 1)."""
    import numpy as np

    if kind == "trace":
        yield from requests
        return
    if kind not in ("poisson", "gamma"):
        raise InputError(f"unknown arrival process '{kind}' (choose {', '.join(ARRIVALS)})", source="--arrival")
    _check_rate(rate)
    if kind == "gamma" and not (math.isfinite(cv) and cv > 0):
        raise InputError(f"must be a finite positive number (got {cv})", source="--arrival-cv")
    gaps = _gaps(np.random.default_rng(seed), kind, cv)
    t = 0.0
    for r in requests:
        t += next(gaps) / rate
        yield TraceRequest(t, r.input_tokens, r.output_tokens, block_ids=r.block_ids, block_tokens=r.block_tokens,
                           tokens=r.tokens, session_id=r.session_id, line=r.line)


def time_scaled(requests: Iterable[TraceRequest], scale: float) -> Iterator[TraceRequest]:
    """The same requests at their own arrival times multiplied by `scale` (0.5: twice the rate): the trace's
    conversation timing (bursts, think times, the order of turns) is kept, only compressed or stretched,
    where `retime` replaces it with a Poisson or gamma process at a rate."""
    import dataclasses

    check_time_scale(scale)
    for r in requests:
        yield dataclasses.replace(r, arrival_s=r.arrival_s * scale)


def check_time_scale(scale: float, source: str = "--time-scale") -> None:
    """A positive factor in the bounds table's `time_scale` range (k3sim/configs/bounds.py)."""
    from k3sim.configs.bounds import check_range

    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale <= 0:
        raise InputError(f"must be a positive factor of the trace's arrival times (0.5: twice the rate), "
                         f"got {scale}", source=source)
    check_range(scale, "time_scale", source)


def synthetic_stream(n: int, *, seed: int = 0, rate: float = 10.0, prompts: int = 64, zipf_a: float = 1.2,
                     prefix_blocks_mean: float = 4.0, unique_blocks_mean: float = 4.0, output_mean: float = 200.0,
                     block_tokens: int = 512) -> Iterator[TraceRequest]:
    """`n` Mooncake-style requests made on the fly: a shared prefix (one of `prompts` system prompts, Zipf
    popularity) then request-unique blocks; Poisson arrivals at `rate`. Every size is a modelling choice
    (shapes like the conversation trace's, scaled down), fixed so the seeded stream stays the same."""
    import numpy as np

    if n <= 0:
        raise InputError(f"must be positive (got {n})", source="--requests")
    _check_rate(rate)
    rng = np.random.default_rng(seed)
    lens = np.maximum(1, rng.poisson(prefix_blocks_mean, prompts))
    next_id = int(lens.sum())
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    t = 0.0
    done = 0
    while done < n:
        m = min(_BLOCK, n - done)
        gaps = rng.exponential(1.0 / rate, m)
        picks = np.minimum(rng.zipf(zipf_a, m) - 1, prompts - 1)
        uniq = np.maximum(1, rng.poisson(unique_blocks_mean, m))
        outs = np.maximum(1, rng.poisson(output_mean, m))
        for i in range(m):
            t += float(gaps[i])
            k = int(picks[i])
            ids = list(range(int(starts[k]), int(starts[k] + lens[k])))
            u = int(uniq[i])
            ids.extend(range(next_id, next_id + u))
            next_id += u
            yield TraceRequest(t, len(ids) * block_tokens, int(outs[i]), block_ids=ids, block_tokens=block_tokens)
        done += m
