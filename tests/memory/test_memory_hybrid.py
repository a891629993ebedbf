"""Memory sizes and plans of the hybrid kinds: a toy worked by hand (GDN, Mamba2 with one replicated group, GQA
with replicated KV heads, SWA capped by its window, an FFN-only block), the shipped hybrid models through the
serving plan, and the training plan's refusal of kinds the activation model does not list."""

from __future__ import annotations

import pytest

from memory_toys import toy_gpu_fixture  # noqa: F401 (the `toy_gpu` fixture)

from k3sim.configs import ModelConfig, Parallelism, load_hardware, load_model
from k3sim.errors import InputError
from k3sim.memory import sizes
from k3sim.memory.params import count_params, layer_params
from k3sim.memory.plan import serve_plan, train_plan

MODELS = ["qwen3-next-80b-a3b", "qwen3.5-397b-a17b", "nemotron-h-56b", "nemotron-3-nano-30b-a3b",
          "granite-4.0-h-small", "jamba-1.5-mini", "minimax-m1", "llama-3.3-70b"]


def hybrid_toy() -> ModelConfig:
    """5 layers: GDN + MoE, Mamba2 (one group) alone, an MLP-only block, GQA + MoE, SWA + MoE (window 100)."""
    return ModelConfig(
        name="hybrid-toy", hidden_size=16, num_layers=5, vocab_size=100, dense_ffn_width=32,
        layer_pattern=["gdn/moe", "mamba2/none", "none/dense", "gqa/moe", "swa/moe"],
        gdn=dict(num_key_heads=2, num_value_heads=4, head_dim_k=4, head_dim_v=2),
        mamba2=dict(num_heads=4, head_dim=2, state_size=3, n_groups=1),
        gqa=dict(num_heads=4, num_kv_heads=2, head_dim=4),
        swa=dict(num_heads=4, num_kv_heads=2, head_dim=4, window_tokens=100),
        moe=dict(num_routed_experts=4, num_active_experts=2, expert_ffn_width=8, router_score="softmax",
                 router_bias=False))


def test_toy_params_by_layer():
    m = hybrid_toy()
    # GDN 874 (tests/configs/test_kinds.py); MoE 4 x 3 x 16 x 8 = 1536 routed + router 16 x 4 = 64; 2 norms
    assert layer_params(m, 0) == {"gdn": 874, "routed_experts": 1536, "router": 64, "norms": 32}
    # Mamba2 with one group: in_proj 16 x (16 + 6 + 4) = 416, conv (8 + 6) x 4 + 14 = 70, 12, norm 8, out 128
    assert layer_params(m, 1) == {"mamba2": 416 + 70 + 12 + 8 + 128, "norms": 16}  # one norm: no FFN
    assert layer_params(m, 2) == {"dense_ffn": 3 * 16 * 32, "norms": 16}        # no mixer
    gqa = 16 * 16 + 2 * 16 * 8 + 16 * 16
    assert layer_params(m, 3)["gqa"] == gqa and layer_params(m, 4)["swa"] == gqa
    r = count_params(m)
    assert r.by_component()["routed_experts"] == {"total": 3 * 1536, "active": 3 * 768}


def test_toy_request_bytes_by_hand(toy_gpu):
    m = hybrid_toy()
    # per request at tp 1: GDN state 128 + conv 144; Mamba2 state 4 x 2 x 3 x 4 = 96, conv 3 x 14 x 2 = 84;
    # GQA KV 32 B/token x 1000 tokens; SWA 32 B/token x its 100-token window
    assert sizes.recurrent_state_bytes_per_request(m) == 128 + 96
    assert sizes.all_conv_state_bytes_per_request(m) == 144 + 84
    assert sizes.kv_bytes_per_token(m) == 32 and sizes.kv_bytes_per_request(m, 1000) == 32 * 1000 + 32 * 100
    plan = serve_plan(m, toy_gpu, Parallelism(), 1000, prefill_chunk_tokens=10)
    assert plan.per_request_bytes_per_gpu == 128 + 144 + 96 + 84 + 32_000 + 3_200 == 35_652
    assert plan.recurrent_state_bytes_per_request == 224 and plan.kv_bytes_per_token == 32
    # tp 4 (4 query heads, 2 KV heads: one replicated each; GDN 2 key heads: refused) -> tp 2:
    # GDN state 64, conv 72; Mamba2 state 48, conv 3 x (4 + 2 x 1 x 3) x 2 = 60 (the one group on both ranks);
    # KV 16 B/token per layer
    two = serve_plan(m, toy_gpu, Parallelism(tp=2), 1000, prefill_chunk_tokens=10)
    assert two.per_request_bytes_per_gpu == 64 + 72 + 48 + 60 + 16_000 + 1_600
    # cp 2 splits the tokens of the KV, not the state
    cp = serve_plan(m, toy_gpu, Parallelism(cp=2), 1000, prefill_chunk_tokens=10)
    assert cp.per_request_bytes_per_gpu == 128 + 144 + 96 + 84 + (32_000 + 3_200) // 2
    with pytest.raises(InputError, match="tp=4 does not divide the 2 GDN key heads"):
        serve_plan(m, toy_gpu, Parallelism(tp=4), 1000)


def test_a_stage_of_mlp_blocks_holds_nothing_per_request(toy_gpu):
    """pp 5 puts one layer per stage: the MLP-only stage has no per-request bytes and never limits."""
    plan = serve_plan(hybrid_toy(), toy_gpu, Parallelism(pp=5), 1000, prefill_chunk_tokens=10)
    per_stage = [s["per_request_bytes"] for s in plan.stages]
    assert per_stage == [272, 180, 0, 32_000, 3_200]
    assert plan.worst_stage == 3  # the full-context GQA layer


@pytest.mark.parametrize("name", MODELS)
def test_every_hybrid_model_plans_serving_on_h200(root, name):
    m, hw = load_model(root / f"models/{name}.yaml"), load_hardware("h200")
    ep = 8 if m.moe is not None else 1
    plan = serve_plan(m, hw, Parallelism(tp=8, ep=ep), 32768)
    kinds = {k.kind: k for k in sizes.kind_sizes(m, tp=8)}
    expected = sum(k.layers * (k.state_bytes_per_layer + k.conv_state_bytes_per_layer
                               + k.kv_bytes_per_request_per_layer(32768)) for k in kinds.values())
    assert plan.per_request_bytes_per_gpu == expected > 0
    assert plan.max_concurrent_requests >= 1 and plan.per_gpu_bytes["total"] <= hw.hbm_bytes


def test_qwen3_next_tp8_request_by_hand(root):
    """tp 8 over 2 KV heads: one replicated head per rank, 1 KiB per token per attention layer; GDN 32 value
    heads / 8 = 4 per rank: 4 x 128 x 128 x 4 B = 256 KiB per layer; conv 3 x (4096 + 4096) / 8 x 2 B."""
    m = load_model(root / "models/qwen3-next-80b-a3b.yaml")
    plan = serve_plan(m, load_hardware("h200"), Parallelism(tp=8, ep=8), 131072)
    assert plan.per_request_bytes_per_gpu == 12 * 1024 * 131072 + 36 * (256 * 1024 + 3 * 1024 * 2)


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "nemotron-h-56b", "minimax-m1", "jamba-1.5-mini",
                                  "llama-3.3-70b"])
def test_training_plan_answers_for_every_kind(root, name):
    """Every mixer kind has its saved-tensor list (tests/memory/test_activations_kinds.py works them by hand)."""
    m = load_model(root / f"models/{name}.yaml")
    plan = train_plan(m, load_hardware("h200"), Parallelism(tp=8, ep=8 if m.moe else 1), 4096, allow_overflow=True)
    assert plan.per_gpu_bytes["activations"] > 0
