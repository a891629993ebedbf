"""The prefix-cache replay's step clock: a line through two steps of the step model, exact at both."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.serving.replay import ModelStepCost, StepCost


def _cost(fn) -> ModelStepCost:
    msc = ModelStepCost(None, "h200")
    msc._fn = fn  # a hand-made step model instead of the real one
    return msc


def test_line_recovers_a_linear_step_model_exactly():
    """Steps of 20 ms + 10 us per token: the line is 1e5 tokens/s and 20 ms, not 20 ms + one token's 10 us."""
    line = _cost(lambda nd, cs, pf: 0.02 + 1e-5 * (nd + sum(c for c, _ in pf))).line(8192)
    assert line.tokens_per_s == pytest.approx(1e5) and line.step_overhead_s == pytest.approx(0.02)


def test_line_passes_through_both_points_of_a_curved_model():
    def fn(nd, cs, pf):  # not a line: the prefill part grows with the square of the chunk
        return 0.03 + 2e-6 * cs / max(nd, 1) + sum(1e-5 * c + 1e-9 * c * c for c, _ in pf)

    msc = _cost(fn)
    line = msc.line(4096)
    assert line(0, 1) == pytest.approx(fn(1, msc.mean_context, ()))
    assert line(4096, 0) == pytest.approx(fn(0, 0, ((4096, 0),)))
    # a given rate keeps the one-token point; a given overhead keeps the derived rate
    given = msc.line(4096, tokens_per_s=5e4)
    assert given.tokens_per_s == 5e4 and given(0, 1) == pytest.approx(fn(1, msc.mean_context, ()))
    assert msc.line(4096, step_overhead_s=0.5) == StepCost(line.tokens_per_s, 0.5)


def test_no_line_when_a_chunk_is_not_slower_than_one_token():
    with pytest.raises(InputError, match="--tokens-per-s") as e:
        _cost(lambda nd, cs, pf: 0.01).line(8192)
    assert e.value.source == "--token-budget"
    with pytest.raises(InputError, match="one point, not a line"):
        _cost(lambda nd, cs, pf: 0.01 + 1e-5 * (nd + sum(c for c, _ in pf))).line(1)
