"""Saved training tensors of every mixer kind (issue 23 item 5), layer by layer by hand.

Each figure is worked out in the comments from the model file's shapes (elements per token x bytes: bf16 2 B,
fp32 4 B), not read back from the code. Lists per kind: `k3sim.memory.activations` (sources in its docstring).
"""

from __future__ import annotations

import pytest

from k3sim.configs import Parallelism, load_hardware, load_model
from k3sim.configs.kinds import MIXERS
from k3sim.configs.planning import resolve_recompute
from k3sim.errors import InputError
from k3sim.memory import activations as act
from k3sim.memory.plan import TRAINED_KINDS, train_plan

# Qwen3-Next (d 2048): the two pre-norms' inputs and outputs, 4 x 2048 bf16
QWEN_NORMS = 4 * 2048 * 2                                                    # 16,384 B
# its MoE FFN (512 experts top-10 of width 512, one gated shared expert of 512): fp32 router scores 512 and
# routing weights 10; bf16 shared gate/up 1024, shared SwiGLU out 512, the shared expert's output 2048 and its
# sigmoid gate 1 (the gate product's operands), per routed copy (x10) dispatched input 2048, gate/up 1024,
# SwiGLU out 512
QWEN_MOE = 4 * (512 + 10) + 2 * (1024 + 512 + 2048 + 1 + 10 * (2048 + 1024 + 512))      # 80,938 B
# GDN layer (16 key heads, 32 value heads of 128): conv input 2 x 16 x 128 + 32 x 128 = 8192; q, k after the
# in-kernel L2 norm 2048 each; v 4096; fla's WY matrix A 32 x 64 = 2048; beta 32; chunk output, output gate z,
# o_proj input 4096 each (bf16); fp32: q/k inverse norms 2 x 16, cumulative decay 32, softplus in and out 2 x 32
QWEN_GDN = 2 * (8192 + 2048 + 2048 + 4096 + 2048 + 32 + 3 * 4096) + 4 * (32 + 32 + 64)  # 62,016 B
# gated GQA layer (16 query heads, 2 KV heads of 256, q/k norms, output gate): q and k norm inputs 4096 + 512,
# q 4096, k 512, v 512, attention output, sigmoid gate, o_proj input 4096 each (bf16); fp32 LSE 16
QWEN_GQA = 2 * (4096 + 512 + 4096 + 512 + 512 + 3 * 4096) + 4 * 16                      # 44,096 B


@pytest.fixture
def qwen(root):
    return load_model(root / "models/qwen3-next-80b-a3b.yaml")


def per_rank(model, layer, tp, modules=(), precision="bf16"):
    return act.layer_activations(model, layer, modules, precision, tp).kept_bytes / tp


def test_every_kind_has_a_list():
    assert set(TRAINED_KINDS) == set(MIXERS) == set(act.MIXER_TENSORS)


def test_qwen3_next_gdn_layer_by_hand(qwen):
    assert (QWEN_NORMS, QWEN_GDN, QWEN_MOE) == (16_384, 62_016, 80_938)
    assert qwen.layer_kinds[0] == "gdn" and qwen.ffn_kinds[0] == "moe"
    assert act.layer_activation_bytes_per_token(qwen, 0) == QWEN_NORMS + QWEN_GDN + QWEN_MOE == 159_338
    # tp 2 splits the 16 key and 32 value heads (and, sequence parallel, everything else): half on each rank
    assert per_rank(qwen, 0, 2) == 159_338 / 2 == 79_669


def test_qwen3_next_gqa_layer_by_hand(qwen):
    assert qwen.layer_kinds[3] == "gqa"
    assert per_rank(qwen, 3, 1) == QWEN_NORMS + QWEN_GQA + QWEN_MOE == 141_418
    assert per_rank(qwen, 3, 2) == 141_418 / 2 == 70_709            # 8 query heads and 1 KV head per rank
    # tp 4 > 2 KV heads: each rank keeps one whole KV head (vLLM replicates it), so k, v and the k norm input are
    # 256 elements a rank, not 128: GQA per rank 1024 x 5 + 256 x 3 bf16 + 4 fp32 LSE = 11,792 B
    assert per_rank(qwen, 3, 4) == 2 * (5 * 1024 + 3 * 256) + 4 * 4 + (QWEN_NORMS + QWEN_MOE) / 4 == 36_122.5


def test_linear_attn_core_drops_exactly_the_gdn_kernel_tensors(qwen):
    la = act.layer_activations(qwen, 0, ("linear_attn_core",))
    # rebuilt: q, k, v, A (2048 + 2048 + 4096 + 2048 bf16) and the fp32 inverse norms and cumulative decay (32 + 32)
    assert la.recomputed_bytes == 2 * 10_240 + 4 * 64 == 20_736
    # kept: all else, plus the kernel's decay input g (32 fp32), held apart only when the kernel is rebuilt
    assert la.kept_bytes == 159_338 - 20_736 + 4 * 32 == 138_730
    # the GQA layer has no recurrent core: nothing rebuilt; its attention core frees the fp32 LSE (16 x 4 B)
    assert act.layer_activations(qwen, 3, ("linear_attn_core",)).recomputed_bytes == 0
    assert act.layer_activations(qwen, 3, ("attention_core",)).recomputed_bytes == 64
    # norms: the two pre-norm outputs and the gated norm's output (o_proj's input), 2048 + 2048 + 4096 bf16
    assert act.layer_activations(qwen, 0, ("norms",)).recomputed_bytes == 2 * 8192
    # moe_act: shared (512) and routed (10 x 512) SwiGLU outputs
    assert act.layer_activations(qwen, 0, ("moe_act",)).recomputed_bytes == 2 * 5632


def test_linear_attn_core_covers_kda_core(root):
    k3 = load_model(root / "models/kimi-k3.yaml")
    kda = act.layer_activations(k3, 1, ("kda_core",))
    lin = act.layer_activations(k3, 1, ("linear_attn_core",))
    assert lin == kda and kda.recomputed_bytes == 99_072          # tests/memory/test_memory_recompute.py's figure
    assert act.layer_activations(k3, 1, ("kda_core", "linear_attn_core")) == kda   # counted once
    assert act.module_parts(("linear_attn_core",)) == {"linear_attn_core", "kda_core"}


def test_qwen3_next_fp8_tensors(qwen):
    la = act.layer_activations(qwen, 0, (), "fp8")
    # linear-layer inputs in e4m3: the attention pre-norm output, o_proj's input, the MoE SwiGLU inputs and outputs,
    # the dispatched tokens; the MoE pre-norm output stays bf16 (the router reads it)
    assert set(la.fp8_tensors) == {"attn_norm_out", "gdn_o_proj_in", "shared_gate_up", "shared_act", "routed_in",
                                   "routed_gate_up", "routed_act"}
    assert act.layer_activations(qwen, 3, (), "fp8").e5m6_tensors == ()   # gated: o_proj reads the gated product


def test_mamba2_layers_by_hand(root):
    nem = load_model(root / "models/nemotron-h-56b.yaml")
    # layer 0 is Mamba2 without an FFN (d 8192; 256 heads of 64 -> d_inner 16384; 8 groups of state 256 -> B, C
    # 4096): layer input and norm output 2 x 8192; conv input and output 20480 each, raw dt 256, z, scan output,
    # o_proj input 16384 each (bf16); fp32 cumulative decay 256
    assert nem.layer_kinds[0] == "mamba2" and nem.ffn_kinds[0] == "none"
    mamba2 = 2 * (2 * 8192 + 2 * 20480 + 256 + 3 * 16384) + 4 * 256
    assert act.layer_activation_bytes_per_token(nem, 0) == mamba2 == 214_528
    assert per_rank(nem, 0, 8) == 214_528 / 8                         # 8 groups split over 8 ranks
    # layer 1 is an MLP without a mixer, squared ReLU of width 32768: FFN norm in and out 2 x 8192, up output and
    # activation output 32768 each
    assert nem.layer_kinds[1] == "none" and act.layer_activation_bytes_per_token(nem, 1) == 2 * 81_920 == 163_840
    granite = load_model(root / "models/granite-4.0-h-small.yaml")
    # Granite's single B/C group (state 128) is whole on every rank: at tp 2 a rank keeps 8192 / 2 + 2 x 128
    # conv channels (input and output), 256 elements more per pair of ranks than a split would, x 2 tensors
    assert per_rank(granite, 0, 2) == (act.layer_activation_bytes_per_token(granite, 0) + 2 * 2 * 256) / 2
    # linear_attn_core rebuilds the conv output (8192 + 256) and the fp32 cumulative decay (128 heads)
    assert act.layer_activations(granite, 0, ("linear_attn_core",)).recomputed_bytes == 2 * 8448 + 4 * 128


def test_mamba_and_lightning_layers_by_hand(root):
    jamba = load_model(root / "models/jamba-1.5-mini.yaml")
    # layer 0: Mamba (d_inner 8192, state 16, dt rank 256, RMSNorms on dt, B, C) + dense GLU of 14336, d 4096.
    # Mamba: conv input and output, z, delta, scan output, o_proj input 8192 each; x_proj output 256 + 32 (the
    # inner norms' inputs), dt norm output 256, B/C norm outputs 32 (bf16); fp32 scan chunk states 8192 x 32 / 2048
    mamba = 2 * (6 * 8192 + 288 + 256 + 32) + 4 * 128
    dense = 2 * (2 * 14336 + 14336)
    assert act.layer_activation_bytes_per_token(jamba, 0) == 2 * 4 * 4096 + mamba + dense == 218_752
    minimax = load_model(root / "models/minimax-m1.yaml")
    # lightning (64 heads of 128): qkv projection output and SiLU output 3 x 8192 each, core output, norm output,
    # sigmoid gate, o_proj input 8192 each
    light = act.MIXER_TENSORS["lightning"](minimax)
    assert sum(t.elements * 2 for t in light) == 2 * (2 * 24_576 + 4 * 8192) == 163_840
    assert act.layer_activations(minimax, 0, ("linear_attn_core",)).recomputed_bytes == 2 * 24_576


def test_llama_train_plan_without_recompute_by_hand(root):
    llama = load_model(root / "models/llama-3.3-70b.yaml")
    # one layer (d 8192; 64 query / 8 KV heads of 128, no gate; dense GLU 28672): norms 4 x 8192; q 8192, k 1024,
    # v 1024, attention output 8192 (bf16), fp32 LSE 64; gate/up 57344 and SwiGLU out 28672
    layer = 2 * 4 * 8192 + 2 * (8192 + 1024 + 1024 + 8192) + 4 * 64 + 2 * (57_344 + 28_672)
    assert act.layer_activation_bytes_per_token(llama, 0) == layer == 274_688
    plan = train_plan(llama, load_hardware("h200"), Parallelism(tp=8, pp=4), 4096, recompute="none",
                      allow_overflow=True)
    # stage 0: 20 layers, 4 micro-batches in flight (1F1B), 4096 tokens / tp 8
    assert plan.stages[0]["activation_bytes"] == 4 * 20 * 274_688 * 4096 // 8


def test_recompute_modules_follow_the_kinds(qwen, root):
    assert resolve_recompute(qwen, "selective", ("norms", "linear_attn_core", "attention_core"), True) == \
        ("selective", ("norms", "linear_attn_core", "attention_core"))
    with pytest.raises(InputError, match="KDA layers"):      # kda_core stays KDA's own
        resolve_recompute(qwen, "selective", ("kda_core",), True)
    llama = load_model(root / "models/llama-3.3-70b.yaml")
    with pytest.raises(InputError, match="recurrent"):
        resolve_recompute(llama, "selective", ("linear_attn_core",), True)
    assert resolve_recompute(llama, "selective", ("attention_core",), True)[1] == ("attention_core",)
