"""The step model's composition, checked with a fake kernel predictor whose times are hand-countable."""

from dataclasses import dataclass

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.step import Batch, StepCostModel, StepLayout, forward_step
from k3sim.step.calls import Call, Timer
from k3sim.step.layers import layer_calls

HW = load_hardware("h200")
KL = load_model("models/kimi-linear-48b.yaml")
K3 = load_model("models/kimi-k3.yaml")
COLL = ("all_reduce", "custom_all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


@dataclass
class KT:
    seconds: float
    source: str = "fake"
    detail: str = ""


def one_us(op, params, hardware=None):
    """Every compute call 1 us, every collective 10 us."""
    return KT(10e-6 if op in COLL else 1e-6)


def test_single_gpu_step_is_the_count_of_calls():
    # Kimi-Linear on one GPU (no collectives): every call is 1 us, so the step is 1 us x calls on the path
    b = Batch.decode(4, 1024)
    res = forward_step(KL, HW, StepLayout(), b, kernel_time=one_us)
    n = sum(len(layer_calls(KL, i, StepLayout(), b, res.expert_kernel)) for i in range(KL.num_layers))
    n += 1 + 3  # embedding; final norm, LM head, sampling (no logits all-gather at tp 1)
    expected = n * 1e-6
    assert res.seconds == pytest.approx(expected, rel=1e-12)


def test_tp_adds_one_all_reduce_per_sublayer_and_the_gathers():
    b = Batch.decode(4, 1024)
    kda_tp1 = layer_calls(KL, 0, StepLayout(), b, "grouped_bf16")
    kda_tp2 = layer_calls(KL, 0, StepLayout(tp=2), b, "grouped_bf16")  # KDA + dense FFN layer
    added = [c.op for c in kda_tp2 if c.op in COLL]
    assert added == ["custom_all_reduce", "custom_all_reduce"]  # after attention and after the FFN
    assert len(kda_tp2) == len(kda_tp1) + 2
    mla_tp2 = layer_calls(KL, 3, StepLayout(tp=2), b, "grouped_bf16")  # MLA + MoE (no latent)
    assert [c.op for c in mla_tp2 if c.op in COLL] == ["all_gather", "custom_all_reduce", "custom_all_reduce"]


def test_tp_all_reduce_leaves_vllms_custom_kernel_past_its_limits():
    from k3sim.step.layers import tp_all_reduce

    assert tp_all_reduce(4, 7168, 8).op == "custom_all_reduce"  # 57 KB inside one NVLink domain
    assert tp_all_reduce(585, 7168, 8).op == "custom_all_reduce"  # 8,386,560 B <= 8 MiB
    assert tp_all_reduce(586, 7168, 8).op == "all_reduce"  # 8,400,896 B > 8 MiB: NCCL
    assert tp_all_reduce(4, 7168, 16).op == "all_reduce"  # not a custom all-reduce world size


def test_fused_router_saves_one_gemm_per_moe_layer():
    b = Batch.decode(8, 4096)
    fused = layer_calls(K3, 1, StepLayout(tp=8, pp=2, ep=8), b, "grouped_bf16")
    split = layer_calls(K3, 1, StepLayout(tp=8, pp=2, ep=8, fuse_router=False), b, "grouped_bf16")
    assert len(split) == len(fused) + 1
    g = [c for c in fused if c.component == "moe_latent_down+router"][0]
    assert g.params == {"M": 8, "N": (3584 + 896) // 8, "K": 7168}


def test_latent_all_gather_hides_behind_the_shared_experts():
    def kt(op, params, hardware=None):
        if op == "all_gather":
            return KT(5e-6)
        return KT(1e-6)

    b = Batch.decode(8, 4096)
    lay = StepLayout(tp=8, pp=2, ep=8)
    res = forward_step(K3, HW, lay, b, kernel_time=kt)
    rows = {(r.stage, r.component): r for r in res.rows}
    # shared experts: gate_up, swiglu, down = 3 us per layer -> 5 us gather exposes 2 us per MoE layer
    moe_layers_stage0 = sum(1 for i in lay.stage_layers(K3.num_layers)[0] if K3.ffn_kinds[i] == "moe")
    assert rows[(0, "moe_latent_all_gather")].seconds == pytest.approx(2e-6 * moe_layers_stage0)


def test_attn_res_decode_reads_count_bytes_but_no_time():
    b = Batch.decode(8, 4096)
    res = forward_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), b, kernel_time=one_us)
    r = [x for x in res.rows if x.component == "attn_res_decode"]
    assert r and all(x.seconds == 0 and x.bytes > 0 and x.hidden for x in r)


def test_pp_stages_sum_to_the_step_and_hand_off_once():
    b = Batch.decode(8, 4096)
    res = forward_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), b, kernel_time=one_us)
    assert res.seconds == pytest.approx(sum(res.stage_seconds))
    hand = [r for r in res.rows if r.component == "pp_handoff"]
    assert len(hand) == 1 and hand[0].stage == 0
    # 8 tokens x 7168 x 2 B, plus the AttnRes blocks stage 0 finished (layers 0-46 -> blocks 0..3 = 4),
    # split over the 8 TP ranks
    assert hand[0].bytes == pytest.approx(8 * 7168 * 2 * (1 + 47 // 12 - 0) / 8)


def test_more_context_costs_more_only_through_mla():
    lay = StepLayout(tp=8, pp=2, ep=8)
    a = forward_step(K3, HW, lay, Batch.decode(16, 4096))
    b = forward_step(K3, HW, lay, Batch.decode(16, 65536))
    da, db = a.by_component(), b.by_component()
    grew = {k for k in da if db[k] > da[k] * 1.001}
    assert grew == {"mla_decode_attention"}


def test_cost_model_memoises_and_buckets():
    scm = StepCostModel(K3, HW, StepLayout(tp=8, pp=2, ep=8), kernel_time=one_us)
    t1 = scm.step_seconds(32, 32 * 4100)
    t2 = scm.step_seconds(32, 32 * 4110)  # within one 1.1 % bucket
    assert t1 == t2 and len(scm._memo) == 1
    assert scm.step_seconds(0, 0) == 0.0


def test_timer_falls_back_to_an_hbm_proxy_for_unregistered_ops():
    t = Timer(HW, one_us)
    row = t.row(Call("x", "no_such_kernel", {}, proxy_bytes=1e6), 0)
    assert row.source.startswith("proxy:hbm_copy") and row.bytes == 1e6 and row.seconds == 1e-6


def test_layout_refuses_bad_degrees():
    with pytest.raises(ValueError):
        StepLayout(tp=0)
    with pytest.raises(ValueError):
        StepLayout(tp=True)
    with pytest.raises(ValueError):
        StepLayout(expert_kernel="magic")


def test_stage_hand_off_crosses_nodes_only_when_a_stage_fills_its_node():
    from k3sim.step.forward import handoff_call

    b = Batch.decode(8, 4096)
    assert handoff_call(K3, StepLayout(tp=8, pp=2, ep=8), b, list(range(47))).params["gpus_per_node"] == 1
    assert "gpus_per_node" not in handoff_call(K3, StepLayout(tp=2, pp=2, ep=2), b, list(range(47))).params
