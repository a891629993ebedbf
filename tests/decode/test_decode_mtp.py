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


# ---- MTP for every model (issue 21 item 7): MLA-only K2 (DeepSeek-V3 architecture) -----------------------
K2 = load_model("models/kimi-k2.yaml")


def test_accepted_tokens_per_step_is_the_one_formula():
    from k3sim.decode import accepted_tokens_per_step

    assert accepted_tokens_per_step(2, 0.8) == pytest.approx(1 + 0.8 + 0.64)
    assert accepted_tokens_per_step(1, 0.85) == pytest.approx(1.85)  # DeepSeek-V3's one MTP draft
    assert accepted_tokens_per_step(0, 0.3) == 1.0  # no drafts: the verify's own token only
    assert accepted_tokens_per_step(3, 1.0) == 4.0
    assert expected_tokens_per_step is accepted_tokens_per_step
    for bad in [(-1, 0.5), (2, 1.01), (2, -0.1), (True, 0.5), (1.5, 0.5)]:
        with pytest.raises(ValueError):
            accepted_tokens_per_step(*bad)


def eh_proj_only(op, params, hardware=None):
    """1 ms for the MTP module's eh_proj GEMM (M x 7168 x 14336: no K2 layer has that shape), 0 elsewhere."""
    if op.startswith("gemm") and params.get("N") == 7168 and params.get("K") == 2 * 7168:
        return KT(1e-3)
    return KT(0.0)


def test_mla_only_model_pays_its_draft_passes_and_gets_the_credit():
    # Hand-worked: only eh_proj costs (1 ms per draft pass), so 2 drafts make the step 2 ms; a step advances
    # 1 + 0.5 + 0.25 = 1.75 tokens per sequence: TPOT 2/1.75 ms, 32 x 1.75 tokens per 2 ms over 8 GPUs.
    lay = StepLayout(tp=8, pp=1, ep=8)
    r = decode_step(K2, HW, lay, 32, 4096, spec=SpecConfig(2, 0.5), kernel_time=eh_proj_only, memory_cap=False)
    assert r.step_s == pytest.approx(2e-3)
    assert r.tpot_s == pytest.approx(2e-3 / 1.75)
    assert r.tokens_per_s_per_gpu == pytest.approx(32 * 1.75 / 2e-3 / 8)
    assert r.tokens_per_s_per_node == pytest.approx(8 * r.tokens_per_s_per_gpu)
    assert r.spec["draft_s"] == pytest.approx(2e-3) and r.spec["depth"] == 2
    assert r.spec["rollback"] == "kv-truncate" and r.spec["kda_tokens_per_sequence"] is None
    assert r.spec["verify_tokens_per_sequence"] == 3
    assert not any(x.component.startswith("kda_") for x in r.rows)  # no KDA rollback on an MLA-only model


def test_mla_verification_feeds_one_plus_mtp_tokens_per_sequence():
    seen = []

    def record(op, params, hardware=None):
        seen.append((op, dict(params)))
        return KT(1e-6)

    decode_step(K2, HW, StepLayout(tp=8, pp=1, ep=8), 16, 4096, spec=SpecConfig(3, 0.7), kernel_time=record,
                memory_cap=False)
    absorb_m = {p["M"] for op, p in seen if op.startswith("gemm") and p.get("K") == 128 and p.get("N") == 8 * 512}
    assert 16 * 4 in absorb_m  # the verify's q absorption over B x (1 + 3) query tokens
    assert 16 in absorb_m  # the draft pass: one token per sequence


def test_mtp_draft_seconds_for_any_model():
    from k3sim.decode import mtp_draft_seconds
    from k3sim.step import Timer

    lay = StepLayout(tp=8, pp=1, ep=8)
    t = Timer(HW, eh_proj_only)
    assert mtp_draft_seconds(K2, HW, lay, 32, timer=t) == pytest.approx(1e-3)
    assert mtp_draft_seconds(K2, HW, lay, 32, timer=t, mtp=3, context=8192) == pytest.approx(3e-3)
    assert mtp_draft_seconds(K2, HW, lay, 32, timer=t, mtp=0) == 0.0
    assert mtp_draft_seconds(K2, HW, lay, 0, timer=t, mtp=2) == 0.0
    with pytest.raises(ValueError):
        mtp_draft_seconds(K2, HW, lay, 32, timer=t, mtp=-1)
    # the real predictor: a draft pass costs, grows with the context its attention reads, and decode's
    # speculative block reports the same passes
    real = [mtp_draft_seconds(m, HW, lay, 32, mtp=1, context=c) for m in (K2, KL) for c in (1024, 65536)]
    assert all(x > 0 for x in real) and real[1] > real[0] and real[3] > real[2]
    r = decode_step(K2, HW, lay, 32, 1024, spec=SpecConfig(2, 0.8), memory_cap=False)
    assert r.spec["draft_s"] == pytest.approx(2 * real[0])


def test_hybrid_model_keeps_its_kda_rollback_and_pays_the_same_draft_module():
    r = decode_step(KL, HW, StepLayout(), 16, 4096, spec=SpecConfig(2, 0.5, "snapshot"), kernel_time=roofline_fake,
                    memory_cap=False)
    assert r.spec["rollback"] == "snapshot" and r.spec["kda_tokens_per_sequence"] == 3
    assert any(x.component == "kda_state_snapshots" for x in r.rows)
    assert r.spec["draft_s"] > 0


def test_step_splits_into_compute_and_exposed_communication():
    r = decode_step(K2, HW, StepLayout(tp=8, pp=2, ep=8), 32, 4096, memory_cap=False)
    assert r.comm_exposed_s > 0 and r.compute_s > 0
    assert r.compute_s + r.comm_exposed_s == pytest.approx(r.step_s)
    if "comm_exposed_s" in r.extras:  # the step model's own split (helper TBO) is what decode reports
        assert r.comm_exposed_s == pytest.approx(r.extras["comm_exposed_s"])
        assert r.comm_hidden_s == pytest.approx(r.extras["comm_hidden_s"])
