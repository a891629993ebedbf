"""The step's call builders per mixer kind (`k3sim.step.mixers`): the registry, and hand-worked shapes of one
layer of each hybrid family at a TP rank (numbers worked out from the model files' fields in the comments)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import MODELLED_MIXERS, ModelConfig
from k3sim.kernels.ops import OPS
from k3sim.step import Batch, StepLayout, forward_step
from k3sim.step.layers import layer_calls, layer_signature
from k3sim.step.mixers import CORE, DECODE_CONTEXT, MIXER_CALLS, PER_CHUNK, PROXY_NOTES
from k3sim.step.mixers.gqa import prefill_shape

HW = load_hardware("h200")
QWEN = load_model("models/qwen3-next-80b-a3b.yaml")
NEMOTRON = load_model("models/nemotron-h-56b.yaml")


@dataclass
class KT:
    seconds: float
    source: str = "fake"
    detail: str = ""


def one_us(op, params, hardware=None):
    return KT(1e-6)


def by_component(calls):
    out: dict[str, list] = {}
    for c in calls:
        out.setdefault(c.component, []).append(c)
    return out


def test_every_registered_mixer_kind_has_a_call_builder():
    assert set(MIXER_CALLS) == set(MIXERS) == set(MODELLED_MIXERS)
    for kind, b in MIXER_CALLS.items():
        prefix = "gqa" if kind == "swa" else kind  # SWA layers are GQA layers with a window
        names = (*b.core, *b.per_chunk, *b.decode_context, *b.proxies)
        assert names and all(n.startswith(prefix + "_") for n in names), kind
        assert set(b.per_chunk) <= set(PER_CHUNK) and set(b.decode_context) <= set(DECODE_CONTEXT)
    assert {"gdn_recurrent", "mamba2_chunk_prefill", "lightning_recurrent", "gqa_decode_attention"} <= set(CORE)


def test_a_qwen3_next_gdn_layer_at_tp2_by_hand():
    # HK 16 key heads, HV 32 value heads of 128, hidden 2048, tp 2: 8 key and 16 value heads per rank
    calls = by_component(layer_calls(QWEN, 0, StepLayout(tp=2), Batch.decode(64, 32768), "grouped_bf16"))
    # q, k 2 x 8 x 128 + v, z 2 x 16 x 128 + beta, a 2 x 16 = 2048 + 4096 + 32
    assert calls["gdn_in_proj"][0].params == {"M": 64, "N": 6176, "K": 2048}
    assert calls["gdn_short_conv"][0].params == {"B": 64, "D": 2 * 8 * 128 + 16 * 128, "W": 4}
    assert calls["gdn_recurrent"][0].op == "recurrent_gdn_decode"
    assert calls["gdn_recurrent"][0].params == {"B": 64, "H": 16, "Hk": 8, "K": 128, "V": 128}
    assert calls["gdn_o_proj"][0].params == {"M": 64, "N": 2048, "K": 16 * 128}
    assert [c.op for c in calls["tp_all_reduce"]] == ["custom_all_reduce"] * 2  # after the mixer and the MoE
    pre = by_component(layer_calls(QWEN, 0, StepLayout(tp=2), Batch(prefill=((4096, 8192),)), "grouped_bf16"))
    assert pre["gdn_chunk_prefill"][0].op == "chunk_gdn_fwd"
    assert pre["gdn_chunk_prefill"][0].params == {"T": 4096, "H": 16, "Hk": 8, "K": 128, "V": 128}


def test_a_qwen3_next_gated_attention_layer_at_tp2_by_hand():
    # 16 query heads, 2 KV heads of 256, output gate, partial RoPE 1/4, q/k norms; tp 2: 8 query heads, 1 KV head
    calls = by_component(layer_calls(QWEN, 3, StepLayout(tp=2), Batch.decode(64, 32768), "grouped_bf16"))
    # q and its gate 2 x 8 x 256 + k, v 2 x 1 x 256
    assert calls["gqa_qkv_proj"][0].params == {"M": 64, "N": 4096 + 512, "K": 2048}
    assert [c.params for c in calls["gqa_qk_norm"]] == [{"T": 64 * 8, "D": 256}, {"T": 64 * 1, "D": 256}]
    assert calls["gqa_rope"][0].params == {"T": 64, "H": 9, "D": 64}
    assert calls["gqa_decode_attention"][0].params == {"B": 64, "C": 32769, "Hq": 8, "Hkv": 1, "D": 256}
    assert calls["gqa_out_gate"][0].op == "sigmoid_mul"
    assert calls["gqa_o_proj"][0].params == {"M": 64, "N": 2048, "K": 8 * 256}
    # tp 4 > 2 KV heads: each rank holds one replicated KV head (vLLM QKVParallelLinear)
    tp4 = by_component(layer_calls(QWEN, 3, StepLayout(tp=4), Batch.decode(8, 4096), "grouped_bf16"))
    assert tp4["gqa_qkv_proj"][0].params["N"] == 2 * 4 * 256 + 2 * 256
    assert tp4["gqa_decode_attention"][0].params["Hkv"] == 1


def test_the_softmax_router_and_the_gated_shared_expert():
    calls = by_component(layer_calls(QWEN, 0, StepLayout(tp=2), Batch.decode(64, 4096), "grouped_bf16"))
    assert calls["moe_router_topk"][0].op == "router_softmax_topk"
    assert calls["moe_router_topk"][0].params == {"T": 64, "E": 512, "topk": 10}
    assert calls["shared_expert_gate"][0].params == {"T": 64, "D": 2048}
    assert calls["shared_experts_gate_up"][0].params == {"M": 64, "N": 2 * 512 // 2, "K": 2048}
    k3 = load_model("models/kimi-k3.yaml")  # sigmoid scores, no gate
    k3_calls = by_component(layer_calls(k3, 1, StepLayout(tp=8, ep=8), Batch.decode(8, 4096), "grouped_bf16"))
    assert k3_calls["moe_router_topk"][0].op == "router_topk" and "shared_expert_gate" not in k3_calls


def test_a_nemotron_h_mamba2_layer_and_its_mlp_layer_at_tp8_by_hand():
    # Mamba2: 256 heads of 64, d_state 256, 8 groups, hidden 8192; tp 8: 32 heads, 1 group per rank
    b = Batch.decode(64, 8192)
    m = by_component(layer_calls(NEMOTRON, 0, StepLayout(tp=8), b, "none"))  # mamba2/none
    assert m["mamba2_in_proj"][0].params == {"M": 64, "N": 2 * 32 * 64 + 2 * 1 * 256 + 32, "K": 8192}
    assert m["mamba2_short_conv"][0].params == {"B": 64, "D": 32 * 64 + 2 * 256, "W": 4}
    assert m["mamba2_recurrent"][0].params == {"B": 64, "H": 32, "P": 64, "N": 256}
    assert m["mamba2_o_proj"][0].params == {"M": 64, "N": 8192, "K": 2048}
    assert "mamba2_norm_all_reduce" not in m  # 8 groups split over 8 ranks: each group's norm is local
    assert not {"ffn_norm", "dense_up", "moe_router"} & set(m)  # no FFN in a Mamba2 block
    pre = by_component(layer_calls(NEMOTRON, 0, StepLayout(tp=8), Batch(prefill=((2048, 0),)), "none"))
    assert pre["mamba2_chunk_prefill"][0].params == {"T": 2048, "H": 32, "K": 256, "V": 64}
    mlp = by_component(layer_calls(NEMOTRON, 1, StepLayout(tp=8), b, "none"))  # none/dense, squared ReLU
    assert "attn_norm" not in mlp and "dense_gate_up" not in mlp
    assert mlp["dense_up"][0].params == {"M": 64, "N": 32768 // 8, "K": 8192}
    assert mlp["dense_relu2"][0].params == {"T": 64, "N": 4096}
    assert mlp["dense_down"][0].params == {"M": 64, "N": 8192, "K": 4096}


def test_a_single_mamba2_group_is_normed_across_the_tp_ranks():
    granite = load_model("models/granite-4.0-h-small.yaml")  # 128 heads of 64, d_state 128, one group
    c = by_component(layer_calls(granite, 0, StepLayout(tp=8), Batch.decode(4, 4096), "grouped_bf16"))
    assert c["mamba2_in_proj"][0].params["N"] == 2 * 16 * 64 + 2 * 1 * 128 + 16  # the group replicated
    assert c["mamba2_norm_all_reduce"][0].params == {"bytes": 4 * 4, "gpus": 8}  # one fp32 per token


def small(pattern: list[str], **sections) -> ModelConfig:
    base = dict(name="tiny", hidden_size=1024, num_layers=2, vocab_size=1000, layer_pattern=pattern,
                dense_ffn_width=2048)
    return ModelConfig(**base, **sections)


SWA = small(["swa/dense x2"], swa=dict(num_heads=8, num_kv_heads=2, head_dim=128, window_tokens=1024))


def test_the_window_caps_swa_decode_and_prefill():
    calls = by_component(layer_calls(SWA, 0, StepLayout(), Batch.decode(4, 4096), "none"))
    assert calls["gqa_decode_attention"][0].params["C"] == 1024  # 4097 keys, the last 1024 seen
    calls = by_component(layer_calls(SWA, 0, StepLayout(), Batch.decode(4, 500), "none"))
    assert calls["gqa_decode_attention"][0].params["C"] == 501
    # 2048 queries after 8192 cached tokens each see 1024 keys: 2048 x 1024 pairs = 1024 x 1025 / 2 + (T - 1024)
    # x 1024 at T = 2048 + 511.5 -> 2560 (ceil), window 1024
    calls = by_component(layer_calls(SWA, 0, StepLayout(), Batch(prefill=((2048, 8192),)), "none"))
    p = calls["gqa_prefill_attention"][0].params
    assert (p["T"], p["window"]) == (2560, 1024)
    exact = 4.0 * 128 * 8 * 2048 * 1024  # 4 D FLOP per (query head, pair)
    assert OPS["gqa_prefill_fwd"].flop(p) == pytest.approx(exact, rel=1e-3)


def test_gqa_prefill_over_a_prefix_is_the_causal_square_of_equal_pairs():
    assert prefill_shape(4096, 0, None) == (4096, 4096)
    # 1000 queries after 3000 keys: 3,000,000 + 1000 x 1001 / 2 = 3,500,500 pairs; T (T + 1) / 2 >= that at 2646
    assert prefill_shape(1000, 3000, None) == (2646, 2646)
    assert prefill_shape(1000, 3000, 8192) == (2646, 2646)  # a window past prefix + chunk does not bind
    assert prefill_shape(300, 0, 1024) == (300, 300)


def test_a_falcon_style_layer_runs_attention_and_mamba2_in_parallel():
    falcon = small(["gqa+mamba2/dense x2"], gqa=dict(num_heads=8, num_kv_heads=2, head_dim=128),
                   mamba2=dict(num_heads=16, head_dim=64, state_size=128, n_groups=1))
    calls = layer_calls(falcon, 0, StepLayout(tp=2), Batch.decode(4, 4096), "none")
    names = [c.component for c in calls]
    assert names.count("attn_norm") == 1 and names.count("mixer_sum") == 1 and names.count("attn_residual") == 1
    assert {"gqa_qkv_proj", "gqa_decode_attention", "mamba2_in_proj", "mamba2_recurrent"} <= set(names)
    assert names.count("tp_all_reduce") == 3  # each mixer's row-parallel output, then the FFN's
    assert layer_signature(falcon, 0) == (("gqa", "mamba2"), "dense", 0)
    res = forward_step(falcon, HW, StepLayout(tp=2), Batch.decode(4, 4096), kernel_time=one_us)
    n = 2 * len(calls) + 1 + 4  # two layers; embedding; final norm, LM head, logits all-gather, sampling
    assert res.seconds == pytest.approx(n * 1e-6, rel=1e-12)


def test_mamba1_and_lightning_borrow_measured_kernels_and_say_so():
    jamba = load_model("models/jamba-1.5-mini.yaml")  # d_inner 8192, d_state 16
    c = by_component(layer_calls(jamba, 0, StepLayout(tp=2), Batch.decode(8, 4096), "grouped_bf16"))
    assert c["mamba_recurrent"][0].op == "mamba2_decode"
    assert c["mamba_recurrent"][0].params == {"B": 8, "H": 4096 // 64, "P": 64, "N": 16}  # H x P = d_inner / tp
    assert c["mamba_x_proj"][0].params == {"M": 8, "N": 256 + 2 * 16, "K": 4096}
    assert c["mamba_x_proj_all_reduce"][0].op == "custom_all_reduce"
    res = forward_step(jamba, HW, StepLayout(tp=2), Batch.decode(8, 4096))
    assert set(res.extras["proxy_kernels"]) == {"mamba_recurrent"}
    assert "mamba2_decode" in next(r.detail for r in res.rows if r.component == "mamba_recurrent")
    minimax = load_model("models/minimax-m1.yaml")  # 64 heads of 128
    c = by_component(layer_calls(minimax, 0, StepLayout(tp=8, ep=8), Batch(prefill=((1024, 0),)), "grouped_bf16"))
    assert c["lightning_chunk_prefill"][0].op == "mamba2_chunk_fwd"
    assert c["lightning_chunk_prefill"][0].params == {"T": 1024, "H": 8, "K": 128, "V": 128}
    assert c["lightning_norm_all_reduce"][0].params["bytes"] == 1024 * 4
    assert {"lightning_recurrent", "lightning_chunk_prefill", "mamba_recurrent", "mamba_chunk_prefill"} == \
        set(PROXY_NOTES)
