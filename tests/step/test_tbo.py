"""Two-batch overlap: the two-resource list schedule on hand-worked cases, the micro-batch split, and
forward_step under `tbo` with fake kernel times (compute and communication per call known)."""

from dataclasses import dataclass

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.step import Batch, StepLayout, forward_step
from k3sim.step import forward as fwd
from k3sim.step.forward import (TBO_VARIANTS, Comm, LayerParts, split_batch, stream_order, tbo_schedule,
                                tbo_variant)
from k3sim.step.layers import layer_calls

HW = load_hardware("h200")
KL = load_model("models/kimi-linear-48b.yaml")
K3 = load_model("models/kimi-k3.yaml")
OVERLAP, FIVE = TBO_VARIANTS["overlap"], TBO_VARIANTS["five_stage"]


@dataclass
class KT:
    seconds: float
    source: str = "fake"
    detail: str = ""


def layer(prep=0.0, core=3.0, dispatch=2.0, experts=4.0, combine=2.0, frac=1.0):
    return LayerParts(prep=prep, core=core, experts=experts,
                      dispatch=Comm(dispatch, frac), combine=Comm(combine, frac))


# ---- the schedule, by hand --------------------------------------------------------------------------

def test_stream_order_is_sglangs_stage_executor():
    # delta 0: A and B alternate; delta 2: A runs two stages ahead, B finishes the last two
    assert stream_order(3, 0) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert stream_order(4, 2) == [(0, 0), (0, 1), (0, 2), (1, 0), (0, 3), (1, 1), (1, 2), (1, 3)]


def test_overlap_two_layers_by_hand():
    # per micro-batch and layer: attention 3, dispatch 2, experts 4, combine 2.
    # stream: A.attn 0-3 | B.attn 3-6 | A.exp 6-10 | B.exp 10-14 | A.attn 14-17 | B.attn 17-20 | A.exp 20-24 |
    #         B.exp 24-28 | wait B's last combine 28-30
    # comm:   A.D 3-5 | B.D 6-8 | A.K 10-12 | B.K 14-16 | A.D 17-19 | B.D 20-22 | A.K 24-26 | B.K 28-30
    s = tbo_schedule([layer(), layer()], [layer(), layer()], OVERLAP)
    assert s.makespan_s == pytest.approx(30.0)
    assert s.compute_s == pytest.approx(28.0) and s.comm_s == pytest.approx(16.0)
    assert s.exposed_s[(1, 1, "combine")] == pytest.approx(2.0)
    assert sum(s.exposed_s.values()) == pytest.approx(2.0)
    assert s.hidden_s == pytest.approx(14.0)
    assert s.sm_cost_s == 0.0
    comm = [(mb, j, p, a, b) for r, mb, j, p, a, b in s.timeline if r == "comm"]
    assert comm[:4] == [(0, 0, "dispatch", 3, 5), (1, 0, "dispatch", 6, 8), (0, 0, "combine", 10, 12),
                        (1, 0, "combine", 14, 16)]
    # the same work run one micro-batch after the other: 2 x 2 x (3 + 2 + 4 + 2) = 44
    assert s.makespan_s < 44.0


def test_five_stage_two_layers_by_hand():
    # attention split in two: prep 1, core 2; stages per layer [prep] [core] [D, shared] [wD, exp, K] [wK]
    # stream (A two stages ahead): A1 0-1, A2 1-3, A.D 3-5, B1 3-4, A waits D 4-5, A.exp 5-9, A.K 9-11,
    # B2 9-11, B.D 11-13, A1' 11-12, B waits 12-13, B.exp 13-17, B.K 17-19, A2' 17-19, A.D' 19-21, B1' 19-20,
    # A waits 20-21, A.exp' 21-25, A.K' 25-27, B2' 25-27, B.D' 27-29 (B waits 27-29), B.exp' 29-33,
    # B.K' 33-35 (B waits 33-35): makespan 35, exposed 1 + 1 + 1 + 2 + 2 = 7
    la = [layer(prep=1.0, core=2.0), layer(prep=1.0, core=2.0)]
    s = tbo_schedule(la, list(la), FIVE)
    assert s.makespan_s == pytest.approx(35.0)
    want = {(0, 0, "dispatch"): 1.0, (1, 0, "dispatch"): 1.0, (0, 1, "dispatch"): 1.0, (1, 1, "dispatch"): 2.0,
            (1, 1, "combine"): 2.0}
    for key, v in s.exposed_s.items():
        assert v == pytest.approx(want.get(key, 0.0)), key
    assert s.hidden_s == pytest.approx(16.0 - 7.0)


def test_sm_share_stretches_the_overlapped_compute():
    # all-to-alls holding a quarter of the SMs: compute inside them runs at 0.75. Every compute part but
    # A's first attention starts inside an all-to-all of 2 -> 1.5 done inside, +0.5 each: 7 x 0.5 = 3.5.
    # A.attn 0-3, B.attn 3-6.5, A.exp 6.5-11, B.exp 11-15.5, A.attn 15.5-19, B.attn 19-22.5, A.exp 22.5-27,
    # B.exp 27-31.5, B's last combine 31.5-33.5
    la = [layer(frac=0.75), layer(frac=0.75)]
    s = tbo_schedule(la, list(la), OVERLAP)
    assert s.sm_cost_s == pytest.approx(3.5)
    assert s.makespan_s == pytest.approx(33.5)
    assert s.makespan_s == pytest.approx(s.compute_s + s.sm_cost_s + sum(s.exposed_s.values()))


@pytest.mark.parametrize("variant", [OVERLAP, FIVE])
def test_zero_communication_is_the_sum_of_both_halves(variant):
    a = [layer(prep=1.0, core=2.0, dispatch=0.0, combine=0.0), layer(prep=0.5, dispatch=0.0, combine=0.0)]
    b = [layer(prep=1.0, core=1.0, dispatch=0.0, combine=0.0), layer(prep=0.5, dispatch=0.0, combine=0.0)]
    s = tbo_schedule(a, b, variant)
    assert s.makespan_s == pytest.approx((1 + 2 + 4) + (0.5 + 3 + 4) + (1 + 1 + 4) + (0.5 + 3 + 4))
    assert s.hidden_s == 0.0


def test_comm_longer_than_the_compute_is_exposed():
    # dispatch 10 cannot hide behind B's 3 of attention: the stream waits; hidden + exposed = all comm
    la = [layer(dispatch=10.0, combine=10.0)]
    s = tbo_schedule(la, list(la), OVERLAP)
    # A.attn 0-3, A.D 3-13, B.attn 3-6, B.D 13-23, A waits to 13, A.exp 13-17, A.K 23-33, B waits to 23,
    # B.exp 23-27, B.K 33-43; A waits K to 33 (shared, output 0), B to 43
    assert s.makespan_s == pytest.approx(43.0)
    assert s.hidden_s + sum(s.exposed_s.values()) == pytest.approx(40.0)
    assert sum(s.exposed_s.values()) == pytest.approx(43.0 - 14.0)


# ---- the split ------------------------------------------------------------------------------------

def test_split_halves_decodes_and_cuts_prefill_by_tokens():
    a, b = split_batch(Batch.decode(5, 1000))
    assert (a.num_decode, b.num_decode) == (3, 2)
    a, b = split_batch(Batch(prefill=((7, 100),)))
    assert a.prefill == ((3, 100),) and b.prefill == ((4, 103),)  # B's piece attends to A's 3 tokens
    a, b = split_batch(Batch(decode_contexts=(10, 20, 30), prefill=((4, 0), (6, 10))))
    assert a.decode_contexts == (10, 20) and b.decode_contexts == (30,)
    assert a.prefill == ((4, 0), (1, 10)) and b.prefill == ((5, 11),)
    assert a.tokens + b.tokens == 13
    assert split_batch(Batch.decode(1, 4096)) is None  # nothing to split
    assert split_batch(Batch(prefill=((1, 50),))) is None
    a, b = split_batch(Batch.decode(4, 100, tokens_per_decode=3))
    assert a.decode_tokens == b.decode_tokens == 6


def test_auto_variant_follows_the_forward_mode():
    lay = StepLayout(tbo=True)
    assert tbo_variant(lay, Batch.decode(8, 100)).name == "five_stage"
    assert tbo_variant(lay, Batch(decode_contexts=(5,), prefill=((64, 0),))).name == "overlap"


# ---- forward_step under tbo -----------------------------------------------------------------------

def one_us_no_comm(op, params, hardware=None):
    """Every compute call 1 us (weights dominate: the time does not shrink with the batch); no comm."""
    return KT(0.0 if fwd.is_communication(op) else 1e-6)


def test_one_sequence_under_tbo_is_no_tbo():
    lay = StepLayout(tp=1, ep=8, attention_dp=8)
    b = Batch.decode(1, 4096)
    on = forward_step(K3, HW, StepLayout(tp=1, ep=8, attention_dp=8, tbo=True), b, kernel_time=one_us_no_comm)
    off = forward_step(K3, HW, lay, b, kernel_time=one_us_no_comm)
    assert on.seconds == off.seconds and on.stage_seconds == off.stage_seconds
    assert [(r.component, r.seconds, r.bytes) for r in on.rows] == [(r.component, r.seconds, r.bytes) for r in off.rows]
    assert "tbo" not in on.extras


def test_zero_communication_tbo_streams_the_weights_twice():
    # Kimi-Linear on one GPU, 8 decodes: no communication at all. Under tbo the embedding, layer 0 (dense,
    # run on the whole batch as SGLang runs the first_k_dense layers) and the LM head run once; every MoE
    # layer runs once per micro-batch with the same calls: tbo = no tbo + the MoE layers' calls x 1 us.
    b = Batch.decode(8, 1024)
    off = forward_step(KL, HW, StepLayout(), b, kernel_time=one_us_no_comm)
    on = forward_step(KL, HW, StepLayout(tbo=True), b, kernel_time=one_us_no_comm)
    moe_calls = sum(len(layer_calls(KL, i, StepLayout(), b, off.expert_kernel)) for i in range(1, KL.num_layers))
    assert on.seconds == pytest.approx(off.seconds + moe_calls * 1e-6, rel=1e-12)
    assert on.seconds > off.seconds
    assert on.bytes_per_gpu > off.bytes_per_gpu  # the expert and attention weights are read twice
    assert on.extras["comm_exposed_s"] == 0.0 and on.extras["comm_hidden_s"] == 0.0


def test_tokens_proportional_compute_splits_for_free():
    # compute proportional to the tokens (no weights): the two halves cost what the whole batch costs
    def per_token(op, params, hardware=None):
        if fwd.is_communication(op):
            return KT(0.0)
        if "M" in params:
            return KT(1e-9 * params["M"])
        if "B" in params or "T" in params:
            return KT(1e-9 * params.get("B", 1) * params.get("T", 1))
        return KT(0.0)  # no token axis (proxies priced by bytes, sampling): not part of this fake

    b = Batch.decode(8, 1024)
    off = forward_step(KL, HW, StepLayout(), b, kernel_time=per_token)
    on = forward_step(KL, HW, StepLayout(tbo=True), b, kernel_time=per_token)
    assert on.seconds == pytest.approx(off.seconds, rel=1e-9)


def _ep_kernel(compute_s, comm_s, ep_s):
    def kt(op, params, hardware=None):
        if op.startswith("ep_") or op == "all_to_all":
            return KT(ep_s)
        return KT(comm_s if fwd.is_communication(op) else compute_s)
    return kt


def test_tbo_hides_the_all_to_all_and_accounts_for_it(monkeypatch):
    # K3 attention-DP 8 x EP 8, 16 decodes: every MoE layer has a dispatch and a combine (20 us each), TP
    # collectives none (tp 1). All SMs kept (the SM share is tested on the schedule above).
    monkeypatch.setattr(fwd, "comm_sm_fraction", lambda call, hw: 1.0)
    kt = _ep_kernel(1e-6, 0.0, 20e-6)
    b = Batch.decode(16, 4096)
    off = forward_step(K3, HW, StepLayout(tp=1, ep=8, attention_dp=8), b, kernel_time=kt)
    on = forward_step(K3, HW, StepLayout(tp=1, ep=8, attention_dp=8, tbo=True), b, kernel_time=kt)
    n_moe = K3.num_moe_layers
    assert off.extras["comm_exposed_s"] == pytest.approx(n_moe * 2 * 20e-6)  # serial: all exposed
    assert off.extras["comm_hidden_s"] == pytest.approx(0.0, abs=1e-15)
    total = n_moe * 2 * 2 * 20e-6  # two micro-batches, each its own dispatch + combine
    assert on.extras["comm_exposed_s"] + on.extras["comm_hidden_s"] == pytest.approx(total)
    assert on.extras["comm_hidden_s"] > 0.5 * total
    assert on.extras["tbo"]["variant"] == "five_stage"
    for s, t in enumerate(on.stage_seconds):  # rows (all-to-alls at their exposed share) sum to the stage
        assert sum(r.seconds for r in on.rows if r.stage == s) == pytest.approx(t, rel=1e-9)
    # the two halves one after the other, every all-to-all exposed: what runs once on the whole batch
    # (embedding, dense layer 0, final norm, LM head, sampling: 1 us a call) plus twice the rest
    once = (1 + len(layer_calls(K3, 0, off.layout, b, off.expert_kernel)) + 3) * 1e-6
    assert on.seconds < once + 2 * (off.seconds - once)


def test_sm_fraction_of_each_kernel():
    from k3sim.comm import ep
    from k3sim.step.calls import Call

    # H200: 132 SMs; DeepEP normal holds NORMAL_SMS (20: 112/132 left), low-latency none, NCCL its channels
    frac = lambda code: fwd.comm_sm_fraction(Call("ep_dispatch", "ep_dispatch", {"kernel": code}), HW)  # noqa: E731
    assert HW.num_sms == 132
    assert frac(ep.KERNEL_CODES["normal"]) == pytest.approx((132 - ep.NORMAL_SMS) / 132)
    assert frac(ep.KERNEL_CODES["low_latency"]) == 1.0
    assert frac(ep.KERNEL_CODES["nccl"]) == pytest.approx((132 - ep.NCCL_P2P_CHANNELS) / 132)
    assert fwd.comm_sm_fraction(Call("a2a", "all_to_all", {"bytes": 8, "gpus": 8}), HW) == frac(2)


def test_prefill_tbo_pays_the_sm_share_of_the_normal_kernels():
    # a prefill batch takes DeepEP's normal kernels (ep_kernel auto), which hold SMs while they run: the
    # compute they overlap is stretched, a row of its own; the rows still sum to the stage
    kt = _ep_kernel(5e-6, 0.0, 20e-6)
    b = Batch(prefill=((512, 0),))
    lay = StepLayout(tp=1, ep=8, attention_dp=8, tbo=True)
    on = forward_step(K3, HW, lay, b, kernel_time=kt)
    assert on.extras["tbo"]["variant"] == "overlap"
    sm = sum(r.seconds for r in on.rows if r.component == "tbo_comm_sms")
    assert sm > 0.0
    assert sm == pytest.approx(sum(s["sm_cost_s"] for s in on.extras["tbo"]["stages"]))
    assert sum(r.seconds for r in on.rows) == pytest.approx(on.seconds, rel=1e-9)
    total = K3.num_moe_layers * 2 * 2 * 20e-6
    assert on.extras["comm_exposed_s"] + on.extras["comm_hidden_s"] == pytest.approx(total)


def test_micro_batches_of_an_extend_batch_both_take_the_normal_kernel():
    # 3 decodes + a 1-token chunk: A draws 2 decodes and no prefill token, but it is still part of an
    # extend batch: both halves dispatch with DeepEP's normal kernel (code 0)
    from k3sim.comm import ep

    seen = []

    def kt(op, params, hardware=None):
        if op == "ep_dispatch":
            seen.append(params["kernel"])
        return KT(1e-6)

    b = Batch(decode_contexts=(100, 100, 100), prefill=((1, 0),))
    forward_step(K3, HW, StepLayout(tp=1, ep=8, attention_dp=8, tbo=True), b, kernel_time=kt)
    assert seen and set(seen) == {ep.KERNEL_CODES["normal"]}
