"""Speculative decoding: acceptance arithmetic and the two KDA rollback schemes' verify cost."""

from dataclasses import dataclass

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.decode import SpecConfig, decode_step, expected_tokens_per_step
from k3sim.step import StepLayout

HW = load_hardware("h200")
KL = load_model("models/kimi-linear-48b.yaml")


def test_expected_tokens_per_step():
    assert expected_tokens_per_step(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_step(4, 1.0) == 5.0
    assert expected_tokens_per_step(4, 0.0) == 1.0  # only the verify's own token


def test_spec_config_refuses_nonsense():
    for bad in [(0, 0.5, "replay"), (2, 1.5, "replay"), (2, 0.5, "undo")]:
        with pytest.raises(ValueError):
            SpecConfig(*bad)


def test_replay_walks_accepted_tokens_snapshot_writes_states():
    s = SpecConfig(3, 0.5, "snapshot")
    r = SpecConfig(3, 0.5, "replay")
    assert s.kda_tokens_per_sequence() == 4 and s.extra_state_writes() == 3
    assert r.kda_tokens_per_sequence() == 4 + 1 and r.extra_state_writes() == 0  # ceil(1.875 - 1) = 1


@dataclass
class KT:
    seconds: float
    source: str = "fake"
    detail: str = ""


def roofline_fake(op, params, hardware=None):
    """Memory-bound fake: recurrent decode = state read+write + 1.4 us per serial token; copies at 4 TB/s;
    everything else 1 us."""
    if op == "recurrent_kda_decode":
        state = params["B"] * params["H"] * 128 * 128 * 4 * 2
        return KT(state / 4e12 + 1.4e-6 * params["T"])
    if op == "hbm_copy":
        return KT(2 * params["bytes"] / 4e12)
    return KT(1e-6)


def test_verify_latency_sublinear_for_replay_superlinear_for_snapshots():
    lay = StepLayout()
    base = decode_step(KL, HW, lay, 128, 4096, kernel_time=roofline_fake, memory_cap=False).step_s

    def extra(n, rb):
        return decode_step(KL, HW, lay, 128, 4096, spec=SpecConfig(n, 0.7, rb), kernel_time=roofline_fake,
                           memory_cap=False).step_s - base

    rep = [extra(n, "replay") for n in (1, 2, 4, 8)]
    snap = [extra(n, "snapshot") for n in (1, 2, 4, 8)]
    assert all(s > r for s, r in zip(snap, rep))  # snapshots always cost more
    # snapshot extra grows at least linearly in n (state writes), replay's KDA share far less
    assert snap[3] / snap[0] > 4.0
    assert rep[3] / rep[0] < snap[3] / snap[0]


def test_tpot_divides_the_cycle_by_the_tokens_a_step_yields():
    lay = StepLayout()
    r = decode_step(KL, HW, lay, 16, 4096, spec=SpecConfig(2, 1.0, "replay"), kernel_time=roofline_fake,
                    memory_cap=False)
    assert r.tpot_s == pytest.approx(r.step_s / 3.0)
    assert r.tokens_per_s == pytest.approx(16 * 3.0 / r.step_s)
