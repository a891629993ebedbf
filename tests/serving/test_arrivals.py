"""Arrival processes: rates, burstiness, common random numbers across rates, streaming."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from k3sim.errors import InputError
from k3sim.serving.arrivals import retime, synthetic_stream
from k3sim.workloads.request import TraceRequest


def _reqs(n):
    return (TraceRequest(0.0, 512, 1, block_ids=[i]) for i in range(n))


@pytest.mark.parametrize("kind, cv", [("poisson", 1.0), ("gamma", 3.0)])
def test_rate_and_variability(kind, cv):
    t = np.array([r.arrival_s for r in retime(_reqs(20000), kind, 4.0, seed=1, cv=cv)])
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_same_seed_scales_the_same_gaps():
    a = [r.arrival_s for r in retime(_reqs(50), "poisson", 1.0, seed=3)]
    b = [r.arrival_s for r in retime(_reqs(50), "poisson", 4.0, seed=3)]
    assert b == pytest.approx([x / 4 for x in a])


def test_streams_lazily():
    endless = (TraceRequest(0.0, 512, 1, block_ids=[i]) for i in itertools.count())
    first = list(itertools.islice(retime(endless, "poisson", 2.0), 5))
    assert len(first) == 5
    s = synthetic_stream(10 ** 9, seed=0)  # a billion requests: only what is consumed is made
    reqs = list(itertools.islice(s, 3000))
    assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(reqs))
    assert all(len(r.block_ids) == r.input_tokens // 512 for r in reqs)
    shared = sum(1 for r in reqs if r.block_ids[0] == reqs[0].block_ids[0])
    assert shared > 100  # Zipf popularity: the hot system prompt is shared


def test_bad_rates():
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InputError):
            list(retime(_reqs(1), "poisson", bad))
    with pytest.raises(InputError):
        list(retime(_reqs(1), "gamma", 1.0, cv=0))
