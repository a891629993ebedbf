"""Training compute of every layer kind (issue 23 item 5): which measured op prices each core's backward, the
recompute modules of every kind's calls, the GEMMs that share a pre-norm's quantised output, FP8 for the new
kinds. Hand-set kernel times where a figure is checked (`fake_kernel_time`); the shipped models' own calls
(`k3sim.step.layers`) where a mapping is."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.step.batch import Batch
from k3sim.step.calls import Call, Timer
from k3sim.step.glue import GlueCalibration
from k3sim.step.layers import layer_calls
from k3sim.step.layout import StepLayout
from k3sim.step.modules import module_components, module_of, module_parts
from k3sim.step.training import (_call_costs, _input_of, backward_op, fp8_candidate, shared_inputs,
                                 training_layer_costs)

PROXY = GlueCalibration.proxy()
MODELS = ("qwen3-next-80b-a3b", "nemotron-h-56b", "granite-4.0-h-small", "jamba-1.5-mini", "minimax-m1",
          "llama-3.3-70b", "kimi-k3")


def fake_kernel_time(table):
    def kt(op, params, hardware=None, convention=None):
        return SimpleNamespace(seconds=table[op], source="measured", detail="")
    return kt


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200")


def test_backward_op_of_each_core():
    gdn = {"T": 4096, "H": 16, "Hk": 8, "K": 128, "V": 128}
    assert backward_op(Call("gdn_chunk_prefill", "chunk_gdn_fwd", gdn)) == ("chunk_gdn_fwd_bwd", gdn, 1.0)
    m2 = {"T": 4096, "H": 256, "K": 256, "V": 64}
    assert backward_op(Call("mamba2_chunk_prefill", "mamba2_chunk_fwd", m2)) == ("mamba2_chunk_fwd_bwd", m2, 1.0)
    assert backward_op(Call("kda_chunk_prefill", "chunk_kda_fwd", {"T": 8, "H": 2}))[0] == "chunk_kda_fwd_bwd"
    assert backward_op(Call("mla_prefill_attention", "sdpa_causal_fwd", {"T": 8, "H": 2, "D": 192}))[0] == \
        "sdpa_causal_fwd_bwd"
    # GQA: the causal SDPA pair over the query heads, whatever the KV heads
    full = {"T": 4096, "Hq": 8, "Hkv": 1, "D": 256, "window": 4096}
    assert backward_op(Call("gqa_prefill_attention", "gqa_prefill_fwd", full)) == \
        ("sdpa_causal_fwd_bwd", {"T": 4096, "H": 8, "D": 256}, 1.0)
    # a 1024-token window over 4096 tokens keeps 1024 x 1025 / 2 + 3072 x 1024 of the 4096 x 4097 / 2 causal pairs
    op, q, share = backward_op(Call("gqa_prefill_attention", "gqa_prefill_fwd", {**full, "window": 1024}))
    assert share == pytest.approx((524_800 + 3_145_728) / 8_390_656, rel=1e-12)
    for c in (Call("x", "gemm_bf16", {"M": 8, "N": 8, "K": 8}), Call("p", "moe_permute_fused", {"T": 8}),
              Call("n", "rmsnorm", {"T": 8, "D": 8})):
        assert backward_op(c) is None


def test_core_backward_is_the_measured_pair_minus_the_forward(h200):
    kt = fake_kernel_time({"chunk_gdn_fwd": 2e-4, "chunk_gdn_fwd_bwd": 7.5e-4, "gqa_prefill_fwd": 3e-4,
                           "sdpa_causal_fwd": 2e-4, "sdpa_causal_fwd_bwd": 9e-4, "mamba2_chunk_fwd": 1e-4,
                           "mamba2_chunk_fwd_bwd": 4e-4})
    timer = Timer(h200, kt)
    gdn = Call("gdn_chunk_prefill", "chunk_gdn_fwd", {"T": 4096, "H": 16, "Hk": 8})
    assert _call_costs(timer, gdn, PROXY) == pytest.approx((2e-4, 5.5e-4, 0.0))
    m2 = Call("mamba2_chunk_prefill", "mamba2_chunk_fwd", {"T": 4096, "H": 64})
    assert _call_costs(timer, m2, PROXY) == pytest.approx((1e-4, 3e-4, 0.0))
    # GQA: its own forward (3e-4), the backward from the SDPA pair: 9e-4 - 2e-4; a window takes its share of it
    gqa = Call("gqa_prefill_attention", "gqa_prefill_fwd", {"T": 4096, "Hq": 8, "Hkv": 1, "D": 256, "window": 4096})
    assert _call_costs(timer, gqa, PROXY) == pytest.approx((3e-4, 7e-4, 0.0))
    swa = Call("gqa_prefill_attention", "gqa_prefill_fwd", {"T": 4096, "Hq": 8, "Hkv": 1, "D": 256, "window": 1024})
    assert _call_costs(timer, swa, PROXY)[1] == pytest.approx(7e-4 * 3_670_528 / 8_390_656, rel=1e-12)


def _calls(model, i, tp=1):
    return layer_calls(model, i, StepLayout(tp=tp), Batch(prefill=((4096, 0),)), "grouped_bf16")


@pytest.mark.parametrize("name", MODELS)
def test_every_core_has_a_backward_and_a_recompute_module(root, name):
    """The shipped models' calls, one layer of each kind: every chunk / attention core has a measured backward and
    belongs to its kind's core module; short convs to it too; every norm of `norms` exists in the calls."""
    m = load_model(root / f"models/{name}.yaml")
    seen = {}
    for layer in m.layers:
        seen.setdefault(layer.mixer + "/" + str(layer.ffn), layer.index)
    for i in seen.values():
        for c in _calls(m, i):
            core = c.component.endswith(("_chunk_prefill", "_prefill_attention"))
            if core:
                assert backward_op(c) is not None, c
                attention = c.component.endswith("_prefill_attention")
                expected = "attention_core" if attention else ("kda_core" if c.op == "chunk_kda_fwd"
                                                               else "linear_attn_core")
                assert module_of(c.component) == expected, c.component
            if c.component.endswith("_short_conv") or c.component.endswith("_qkv_act"):
                assert module_of(c.component) in ("kda_core", "linear_attn_core"), c.component
            if c.component.endswith(("_swiglu", "_relu2")) and "experts" in c.component:
                assert module_of(c.component) == "moe_act"
            if c.op in ("rmsnorm", "gated_rmsnorm") and module_of(c.component) is None:
                assert c.component == "gqa_qk_norm", c.component   # FlashAttention keeps q, k after it


def test_module_parts_and_components():
    assert module_parts(("linear_attn_core",)) == ("linear_attn_core", "kda_core")
    assert module_parts(("kda_core", "linear_attn_core", "norms")) == ("kda_core", "linear_attn_core", "norms")
    comps = module_components("linear_attn_core")
    assert {"gdn_chunk_prefill", "mamba2_short_conv", "lightning_qkv_act", "kda_chunk_prefill"} <= set(comps)
    assert "gqa_prefill_attention" in module_components("attention_core")


def test_linear_attn_core_forward_is_its_calls(root, h200):
    """`module_forward_s["linear_attn_core"]` of a Qwen3-Next GDN layer is the forward of its short conv and chunk
    kernel, nothing else; its GQA layer has none and an attention core instead."""
    m = load_model(root / "models/qwen3-next-80b-a3b.yaml")
    costs = training_layer_costs(m, h200, tp=2, ep=2, tokens=4096, seq_len=4096, glue=PROXY)
    timer = Timer(h200, None, "graph")
    lay = StepLayout(tp=2, ep=2)
    calls = layer_calls(m, 0, lay, Batch(prefill=((4096, 0),)), "grouped_bf16")
    core = sum(_call_costs(timer, c, PROXY)[0] for c in calls if c.component in ("gdn_short_conv", "gdn_chunk_prefill"))
    gdn, gqa = costs[1], costs[4]
    assert (gdn.kind, gqa.kind) == ("gdn", "gqa")
    assert gdn.module_forward_s["linear_attn_core"] == pytest.approx(core, rel=1e-12) and core > 0
    assert "linear_attn_core" not in gqa.module_forward_s and gqa.module_forward_s["attention_core"] > 0
    for c in costs:
        assert all(math.isfinite(x) and x >= 0 for x in (c.forward_s, c.backward_input_s, c.backward_weight_s))


def test_shared_inputs_from_the_calls(root):
    qwen = load_model(root / "models/qwen3-next-80b-a3b.yaml")
    calls = _calls(qwen, 0, tp=2)
    keys = dict(zip((c.component for c in calls), shared_inputs(calls, qwen.hidden_size)))
    assert keys["gdn_in_proj"] == "attention input" and keys["gdn_o_proj"] == "gdn_o_proj"
    assert keys["moe_router"] == keys["shared_experts_gate_up"] == "ffn input"
    assert keys["shared_experts_down"] == "shared_experts_down"
    # lightning's output gate reads the attention input after the core ran: the table says so
    mm = load_model(root / "models/minimax-m1.yaml")
    calls = _calls(mm, 0)
    keys = dict(zip((c.component for c in calls), shared_inputs(calls, mm.hidden_size)))
    assert keys["lightning_qkv_proj"] == keys["lightning_out_gate"] == "attention input"
    # the Kimi layers keep the keys they had (the component table): every FP8 candidate's key unchanged
    k3 = load_model(root / "models/kimi-k3.yaml")
    for i in (0, 1, 3):
        calls = _calls(k3, i, tp=8)
        for c, key in zip(calls, shared_inputs(calls, k3.hidden_size)):
            if fp8_candidate(c):
                assert key == _input_of(c.component), c.component


def test_fp8_layer_costs_for_the_new_kinds(root, h200):
    """FP8 training of a GDN + GQA model: every linear either FP8 or named among the bf16 ones, all finite, and the
    routed experts' grouped GEMMs cheaper than or equal to bf16 (FP8 kept only where it is predicted faster)."""
    m = load_model(root / "models/qwen3-next-80b-a3b.yaml")
    kw = dict(tp=2, ep=8, tokens=8192, seq_len=4096, glue=PROXY)
    bf16 = training_layer_costs(m, h200, **kw)
    fp8 = training_layer_costs(m, h200, precision="fp8", **kw)
    for a, b in zip(bf16, fp8):
        assert a.layer == b.layer and math.isfinite(b.forward_s + b.backward_s)
        assert b.forward_s + b.backward_s <= (a.forward_s + a.backward_s) * (1 + 1e-9)
        assert all(n.startswith(("gdn_", "gqa_", "shared_", "routed_", "moe_", "dense_")) for n in b.bf16_linears)
