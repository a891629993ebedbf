"""The separable fast path against the step model it is built from, and the engine's memo bucketing."""

from __future__ import annotations

import random

import pytest

from k3sim.serving.engine import StepTimer, bucket


def test_bucket_keeps_chunk_boundaries_and_bounds_the_error():
    for x in (0, 1, 255, 512, 1024, 8192, 16384, 65536, 3 * 8192):
        assert bucket(x) == x
    for x in range(256, 200000, 97):
        assert abs(bucket(x) - x) / x < 2 ** -8


def test_separable_step_cost_matches_the_step_model():
    """Mixed steps (decodes with 1-3 prefill chunks at cached prefixes), decode-only and prefill-only steps:
    the fast path is within 1 % of `StepCostModel.step_seconds` (measured: < 0.4 %)."""
    from k3sim.configs import Parallelism, load_hardware, load_model
    from k3sim.serving.stepcost import step_seconds_for

    model, hw = load_model("models/kimi-k3.yaml"), load_hardware("h200")
    par = Parallelism(tp=8, pp=2, ep=8)
    fast, exact = step_seconds_for(model, hw, par), step_seconds_for(model, hw, par, fast=False)
    rng = random.Random(5)
    cases = [(1, 4096, ()), (37, 37 * 20000, ()), (0, 0, ((8192, 0),)), (100, 100 * 12000, ((8092, 4096),)),
             (60, 60 * 20000, ((3000, 9000), (5000, 0)))]
    for _ in range(6):
        nd = rng.choice([0, 3, 20, 150])
        chunks = tuple((rng.randint(1, 8000), 512 * rng.randint(0, 60)) for _ in range(rng.randint(1, 3)))
        cases.append((nd, nd * rng.randint(1000, 60000), chunks))
    for nd, cs, pf in cases:
        assert fast(nd, cs, pf) == pytest.approx(exact(nd, cs, pf), rel=0.01), (nd, cs, pf)


def test_step_timer_memoises_and_refuses_non_positive_costs():
    calls = []

    def f(nd, cs, pf):
        calls.append((nd, cs, pf))
        return 0.0 if nd == 99 else 1.0 + nd

    t = StepTimer(f)
    assert t(3, 3 * 5000) == 4.0 and t(3, 3 * 5000 + 1) == 4.0
    assert len(calls) == 1  # the second context sum falls in the same bucket
    with pytest.raises(ValueError):
        t(99, 10)


def test_stall_free_budget_bisects_to_the_slo():
    t = StepTimer(lambda nd, cs, pf: 0.1 + 1e-4 * (nd + sum(c for c, _ in pf)), slo_tpot_s=0.25)
    # 0.1 + 1e-4 x (10 + c) <= 0.25 -> c <= 1490 -> 1024 (multiple of 512)
    assert t.stall_free_budget(10, 10 * 4000, 8192, 512) == 1024
    assert t.stall_free_budget(2000, 2000 * 4000, 8192, 512) == 512  # never below one hash block


def test_stall_free_budget_prices_the_cached_prefix():
    # attention of the chunk over its cached prefix: 1e-4 s per chunk token + 1e-8 s per chunk x prefix token
    t = StepTimer(lambda nd, cs, pf: 0.1 + sum(1e-4 * c + 1e-8 * c * p for c, p in pf), slo_tpot_s=0.25)
    # no prefix: c <= 1500 -> 1024; prefix 32768: 1e-4 c (1 + 3.2768) <= 0.15 -> c <= 350 -> one block
    assert t.stall_free_budget(0, 0, 8192, 512) == 1024
    assert t.stall_free_budget(0, 0, 8192, 512, prefix=32768) == 512
    assert t.stall_free_budget(0, 0, 8192, 256, prefix=32768) == 256
    # between the floor and the cap: prefix 8192 -> 1e-4 c (1 + 0.8192) <= 0.15 -> c <= 824 -> 768
    assert t.stall_free_budget(0, 0, 8192, 256) == 1280
    assert t.stall_free_budget(0, 0, 8192, 256, prefix=8192) == 768
