"""Serving at scale in the step's calls: EP dispatch/combine, redundant expert slots and the busiest expert
GPU, MLA decode at MTP verification; hand-worked shapes."""

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.errors import InputError
from k3sim.step import Batch, StepLayout, forward_step
from k3sim.step.calls import Timer
from k3sim.step.layers import (EXPERT_SIDE, ep_group_tokens, ep_params, expert_load, expert_slots_per_gpu,
                               layer_calls, routed_expert_shape)
from k3sim.comm.routing import eplb_imbalance

HW = load_hardware("h200")
K3 = load_model("models/kimi-k3.yaml")
# DeepSeek-V3's expert counts (256 routed, top-8) on K3's shapes: only the counts matter here
DSV3 = K3.model_copy(update={"moe": K3.moe.model_copy(update={"num_routed_experts": 256, "num_active_experts": 8})})
MLA_LAYER = K3.layer_kinds.index("mla")
MOE_LAYER = K3.ffn_kinds.index("moe")


@dataclass
class KT:
    seconds: float
    source: str = "fake"
    detail: str = ""


def test_redundant_slots_spread_over_the_ep_ranks():
    # 256 + 32 = 288 slots: 9 per GPU on EP 32, 2 on EP 144 (EP need not divide the 256 experts)
    assert expert_slots_per_gpu(DSV3, StepLayout(ep=32, attention_dp=32, redundant_experts=32)) == 9
    assert expert_slots_per_gpu(DSV3, StepLayout(ep=144, attention_dp=144, redundant_experts=32)) == 2
    assert expert_slots_per_gpu(K3, StepLayout(tp=8, ep=8)) == 112  # no redundancy: 896 / 8


def test_routed_shape_of_the_busiest_gpu():
    # DP32 EP32, 64 decode tokens per DP rank: 2048 tokens meet; top-8 over 32 ranks is not a whole number
    # of local picks, so each (token, expert) pair is one pick: 2048 x 8 / 32 = 512 pairs on the mean GPU,
    # x 1.25 on a GPU carrying 1.25 x the mean = 640; 9 slots each
    lay = StepLayout(ep=32, attention_dp=32, redundant_experts=32)
    b = Batch.decode(64, 4096)
    assert routed_expert_shape(DSV3, lay, b) == {"B": 512, "E": 9, "K": 3584, "N": 3072, "topk": 1}
    assert routed_expert_shape(DSV3, lay, b, load=1.25)["B"] == 640
    # TP8 EP8 without attention DP: k / ep = 2 local picks per token of the DP rank's own 64
    s = routed_expert_shape(K3, StepLayout(tp=8, ep=8), b)
    assert (s["B"], s["E"], s["topk"]) == (64, 112, 2)
    assert routed_expert_shape(K3, StepLayout(tp=8, ep=8), b, load=1.5)["B"] == 96


def test_ep_group_tokens_span_the_dp_ranks_it_covers():
    b = Batch.decode(10, 100)
    assert ep_group_tokens(StepLayout(tp=2, ep=16, attention_dp=8), b) == 80  # all 8 DP ranks
    assert ep_group_tokens(StepLayout(tp=2, ep=8, attention_dp=8), b) == 40   # experts replicated twice
    assert ep_group_tokens(StepLayout(tp=8, ep=8), b) == 10                  # EP inside the TP group


def test_expert_load_is_the_eplb_imbalance_where_dp_ranks_meet():
    b = Batch.decode(64, 4096)
    lay = StepLayout(ep=32, attention_dp=32, redundant_experts=32, routing_zipf=0.8, routing_seed=4)
    im = expert_load(DSV3, lay, b)
    assert im == eplb_imbalance(256, 32, 8, 2048, redundant=32, skew=0.8, seed=4)
    assert im.max_over_mean > 1.0
    calls = layer_calls(DSV3, MOE_LAYER, lay.for_hardware(HW), b, "grouped_fp8")
    routed = next(c for c in calls if c.component == "routed_experts")
    # the busiest GPU's pairs: 2048 tokens x 8 / 32 ranks x max/mean, one pick each
    assert routed.params["B"] == math.ceil(2048 * im.max_over_mean * 8 / 32) > 512
    # no attention DP, no redundant slot, a uniform router: the expected (mean) load, as before
    flat = expert_load(K3, StepLayout(tp=8, ep=8), b)
    assert flat.max_over_mean == 1.0 and flat.samples == 0
    # a skewed router on the same layout is drawn
    assert expert_load(K3, StepLayout(tp=8, ep=8, routing_zipf=1.0), b).max_over_mean > 1.0


def test_dispatch_params_of_a_dp8_tp2_layout():
    # DP8 x TP2 = 16 GPUs, EP 16 over 2 nodes; 64 sequences verifying 1 draft (2 tokens each) per DP
    # rank: 128 tokens, split over its 2 TP ranks -> T = 64 per rank; LatentMoE sends the 3584-wide latent
    lay = StepLayout(tp=2, ep=16, attention_dp=8, redundant_experts=128, max_nodes_per_token=2,
                     routing_zipf=0.6, routing_seed=7, dispatch_dtype="fp8")
    b = Batch.decode(64, 4096, 2)
    want = {"T": 64, "D": 3584, "topk": 16, "E": 896, "R": 128, "ep": 16, "G": 8, "nodes_max": 2,
            "kernel": 1, "dtype_bytes": 1, "zipf_milli": 600, "seed": 7}  # kernel 1: low_latency (decode)
    assert ep_params(K3, lay, b, "dispatch") == want
    assert ep_params(K3, lay, b, "combine") == {**want, "dtype_bytes": 2}  # combine is always bf16
    # a batch with prefill takes DeepEP's normal kernel (0) under "auto"; an explicit kernel is kept
    mixed = Batch(decode_contexts=(4096,) * 8, prefill=((512, 0),))
    assert ep_params(K3, lay, mixed, "dispatch")["kernel"] == 0
    assert ep_params(K3, StepLayout(tp=2, ep=16, attention_dp=8, ep_kernel="nccl", dispatch_dtype="bf16"),
                     b, "dispatch")["kernel"] == 2


def test_dispatch_and_combine_bracket_the_experts_only_with_attention_dp():
    b = Batch.decode(16, 4096)
    lay = StepLayout(tp=2, ep=16, attention_dp=8).for_hardware(HW)
    calls = layer_calls(K3, MOE_LAYER, lay, b, "grouped_fp8")
    names = [c.component for c in calls]
    i, j = names.index("ep_dispatch"), names.index("ep_combine")
    assert [c.op for c in (calls[i], calls[j])] == ["ep_dispatch", "ep_combine"]
    assert names[i + 1:j] == ["routed_experts"]
    assert all(n.startswith(EXPERT_SIDE) for n in names[i:j + 1])
    assert calls[i].params["dtype_bytes"] == 1  # h200 has FP8 tensor cores: auto -> fp8
    # T x topk token copies: fp8 3584 values + 28 fp32 scales (one per 128) = 3696 B (dispatch), bf16 (combine)
    assert calls[i].proxy_bytes == 8 * 16 * 3696 and calls[j].proxy_bytes == 8 * 16 * 2 * 3584
    tp_only = layer_calls(K3, MOE_LAYER, StepLayout(tp=8, ep=8), b, "grouped_fp8")
    assert not any(c.component.startswith(("ep_dispatch", "ep_combine")) for c in tp_only)
    one_rank = layer_calls(K3, MOE_LAYER, StepLayout(attention_dp=8, ep=1), b, "grouped_fp8")
    assert not any(c.component.startswith(("ep_dispatch", "ep_combine")) for c in one_rank)  # experts local


def test_dispatch_dtype_is_the_profiles_choice():
    assert StepLayout().for_hardware(HW).dispatch_dtype == "fp8"
    no_fp8 = SimpleNamespace(name="nofp8", peak_flops_per_s={"bf16": 1e15})
    assert StepLayout().for_hardware(no_fp8).dispatch_dtype == "bf16"
    with pytest.raises(InputError, match="no FP8 peak"):
        StepLayout(dispatch_dtype="fp8").for_hardware(no_fp8)
    # an unresolved layout reaching the layers is a caller bug, named
    with pytest.raises(ValueError, match="for_hardware"):
        layer_calls(K3, MOE_LAYER, StepLayout(tp=2, ep=16, attention_dp=8), Batch.decode(4, 100), "grouped_fp8")


def test_mla_decode_folds_the_verified_tokens_into_heads():
    # K3 MLA: 96 heads / TP8 = 12 per GPU; q = 1 + 2 drafts = 3 query tokens per sequence -> H = 36;
    # B = 16 sequences (not 48 tokens); the latent cache (512 + 64 bf16 per position) read once per sequence
    b = Batch.decode(16, 4095, 3)
    calls = layer_calls(K3, MLA_LAYER, StepLayout(tp=8, ep=8), b, "grouped_fp8")
    att = next(c for c in calls if c.component == "mla_decode_attention")
    assert att.params == {"B": 16, "C": 4098, "H": 36}
    assert att.proxy_bytes == 16 * 4098 * 576 * 2
    q_absorb = next(c for c in calls if c.component == "mla_q_absorb")
    assert q_absorb.params["M"] == 48  # the absorption GEMMs still run every query token
    one = next(c for c in layer_calls(K3, MLA_LAYER, StepLayout(tp=8, ep=8), Batch.decode(16, 4095), "grouped_fp8")
               if c.component == "mla_decode_attention")
    assert one.params == {"B": 16, "C": 4096, "H": 12}  # q = 1: as before


def test_forward_with_attention_dp_times_the_ep_ops():
    seen = []

    def kt(op, params, hardware=None):
        seen.append(op)
        return KT(5e-6 if op.startswith("ep_") else 1e-6)

    lay = StepLayout(tp=2, ep=16, attention_dp=8)
    res = forward_step(K3, HW, lay.for_hardware(HW), Batch.decode(16, 4096), kernel_time=kt)
    rows = {r.component: r for r in res.rows}
    assert rows["ep_dispatch"].seconds == pytest.approx(K3.num_moe_layers * 5e-6)
    assert rows["ep_combine"].seconds == pytest.approx(K3.num_moe_layers * 5e-6)
    assert "ep_dispatch" in seen and "ep_combine" in seen
    assert Timer(HW, kt).time("ep_dispatch", {"T": 1})[0] == 5e-6
