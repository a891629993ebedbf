"""The engines' rules on the shipped models: the page-size unification worked by hand, the pool's state bytes per
kind, the K3 page rule, the refusals, the conservative keys of blocks that are not multiples of a trace id,
and the `k3` policy being today's decoupled one."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3sim.configs import ModelConfig, load_model
from k3sim.errors import InputError
from k3sim.prefix_cache.config import config_from_model
from k3sim.prefix_cache.engines import (
    ENGINE_POLICIES,
    block_rule,
    check_policy,
    engine_config,
    k3_block_tokens,
    model_sizes,
    vllm_block_tokens,
)
from k3sim.prefix_cache.keys import block_keys
from k3sim.serving.replay import replay
from k3sim.workloads import read_mooncake
from k3sim.workloads.request import TraceRequest

ROOT = Path(__file__).resolve().parents[2]
TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def model(name: str):
    return load_model(str(ROOT / "models" / f"{name}.yaml"))


def test_vllm_unification_qwen3_next_by_hand():
    """One GDN layer's state: 32 value heads x 128 x 128 x 4 B = 2,097,152 B, plus its conv state: (4 - 1) taps x
    (2 x 16 x 128 + 32 x 128) channels x 2 B = 49,152 B -> 2,146,304 B. One GQA layer's KV of a token: K and V
    x 2 KV heads x 256 x 2 B = 2,048 B. Align mode: 16 x ceil(2,146,304 / (16 x 2,048)) = 16 x 66 = 1,056.
    At TP 8: 4 value heads -> 262,144 + 3 x 1,024 x 2 = 268,288 B; the 2 KV heads are replicated (1 per rank) ->
    1,024 B; 16 x ceil(268,288 / 16,384) = 16 x 17 = 272. vLLM refuses 'all' for GDN models."""
    m = model("qwen3-next-80b-a3b")
    s1, s8 = model_sizes(m, 1), model_sizes(m, 8)
    assert (s1.layer_state_bytes, s1.layer_kv_bytes_per_token) == (2_146_304, 2048)
    assert (s8.layer_state_bytes, s8.layer_kv_bytes_per_token) == (268_288, 1024)
    assert vllm_block_tokens(s1, "align") == 1056 and vllm_block_tokens(s8, "align") == 272
    assert block_rule(m, "vllm-align").page_tokens == 1056
    with pytest.raises(InputError, match="refuses mamba_cache_mode 'all'") as e:
        check_policy(m, "vllm-all")
    assert e.value.source == "--policy"


def test_vllm_unification_nemotron_h_by_hand():
    """One Mamba2 layer: 256 heads x 64 x 256 (d_state) x 4 B = 16,777,216 B + conv (4 - 1) x (256 x 64 +
    2 x 8 groups x 256) x 2 B = 122,880 B -> 16,900,096 B; one GQA layer's KV: 2 x 8 x 128 x 2 B = 4,096 B per
    token. Align: 16 x ceil(16,900,096 / 65,536) = 16 x 258 = 4,128. All: ceil(16,900,096 / 4,096) = 4,126
    tokens per state, rounded up to lcm(chunk 128, 16) = 128: 128 x 33 = 4,224 (chunk_size 128 in the config)."""
    m = model("nemotron-h-56b")
    s = model_sizes(m, 1)
    assert (s.layer_state_bytes, s.layer_kv_bytes_per_token) == (16_900_096, 4096)
    assert vllm_block_tokens(s, "align") == 4128
    assert vllm_block_tokens(s, "all", 128) == 4224
    assert (block_rule(m, "vllm-all").page_tokens, block_rule(m, "vllm-align").page_tokens) == (4224, 4128)


def test_vllm_unification_k3_mla_kernel_block():
    """KDA layer 96 x 128 x 128 x 4 B + conv 3 x 96 x 384 x 2 B = 6,512,640 B; MLA's latent 576 x 2 B =
    1,152 B a token, 64-token kernel blocks: align 64 x ceil(6,512,640 / 73,728) = 64 x 89 = 5,696; all with
    vLLM's default chunk 2048: ceil(6,512,640 / 1,152) = 5,654 -> 2,048 x 3 = 6,144."""
    m = model("kimi-k3")
    assert (block_rule(m, "vllm-align").page_tokens, block_rule(m, "vllm-all").page_tokens) == (5696, 6144)


def test_k3_page_rule_and_groups():
    """The smallest of 1,024 / 2,048 / 4,096 / 6,144 tokens whose page holds one state group: Qwen3-Next 3 groups
    of 12 GDN layers, 12 x 2,146,304 B / (12 x 2,048 B a token) = 1,048 tokens -> 2,048; Nemotron-H
    ceil(54 / 10) = 6 groups of 9, 9 x 16,900,096 / 40,960 = 3,713 -> 4,096; K3 23 x 6,512,640 / 27,648 =
    5,418 -> 6,144 (the page of the K3 study)."""
    assert [k3_block_tokens(model_sizes(model(n))) for n in ("qwen3-next-80b-a3b", "nemotron-h-56b", "kimi-k3")] \
        == [2048, 4096, 6144]
    assert engine_config(model("nemotron-h-56b"), "k3").num_kda_groups == 6


def test_pool_state_bytes_per_kind():
    """Whole-model state of one request in the pool, per kind (registry state + conv state, per layer x layers):
    KDA 6,512,640 x 69; GDN 2,146,304 x 36; Mamba2 16,900,096 x 54; Mamba-1 (Jamba) 8,192 x 16 x 4 B +
    3 x 8,192 x 2 B = 573,440 x 28; lightning (MiniMax, no conv) 64 x 128 x 128 x 4 B x 70."""
    expect = {"kimi-k3": 6_512_640 * 69, "qwen3-next-80b-a3b": 2_146_304 * 36, "nemotron-h-56b": 16_900_096 * 54,
              "jamba-1.5-mini": 573_440 * 28, "minimax-m1": 4_194_304 * 70}
    for name, state in expect.items():
        cfg = engine_config(model(name), "none")
        assert cfg.kda_state_bytes_per_request == state, name
    k3 = engine_config(model("kimi-k3"), "k3")
    assert (k3.kda_state_bytes_per_request, k3.mla_kv_bytes_per_token) == (449_372_160, 27_648)  # as before


def test_sliding_window_kv_is_capped_by_its_window():
    """Toy: a GDN layer (4 value heads x 4 x 2 x 4 B = 128 B + conv 3 x 24 x 2 B = 144 B), a Mamba2 layer
    (4 x 2 x 3 x 4 B = 96 B + conv 3 x 14 x 2 B = 84 B), a GQA layer (2 x 2 x 4 x 2 B = 32 B a token) and an SWA
    layer of window 100 (32 B a token): the pool pages hold the GQA KV (32 B a token), and the SWA layer holds at
    most its window, 100 x 32 = 3,200 B, with the state."""
    toy = ModelConfig(
        name="swa-toy", hidden_size=16, num_layers=4, vocab_size=100, dense_ffn_width=32,
        layer_pattern=["gdn/dense", "mamba2/dense", "gqa/dense", "swa/dense"],
        gdn=dict(num_key_heads=2, num_value_heads=4, head_dim_k=4, head_dim_v=2),
        mamba2=dict(num_heads=4, head_dim=2, state_size=3, n_groups=1),
        gqa=dict(num_heads=4, num_kv_heads=2, head_dim=4),
        swa=dict(num_heads=4, num_kv_heads=2, head_dim=4, window_tokens=100))
    cfg = config_from_model(toy, "k3", 512, 1024)
    assert (cfg.mla_kv_bytes_per_token, cfg.kda_state_bytes_per_request) == (32, 272 + 180 + 3200)


def test_sglang_state_pool_share():
    """--mamba-full-memory-ratio 0.9: the state pool gets 0.9 / 1.9 of the capacity, in whole-state slots."""
    m = model("qwen3-next-80b-a3b")
    state = 2_146_304 * 36
    cfg = engine_config(m, "sglang-extra-buffer", capacity_bytes=1.9e12)
    assert cfg.num_state_pages == int(1.9e12 * 0.9 / 1.9 // state) and cfg.private_state_slots == 3
    assert cfg.num_pages == int(1.9e12 / 1.9 // (512 * 12 * 2048))


@pytest.mark.parametrize("policy", [p for p in ENGINE_POLICIES if p not in ("full-attention", "none")])
def test_state_policies_refused_on_an_attention_only_model(policy):
    with pytest.raises(InputError, match="has no recurrent layer") as e:
        check_policy(model("llama-3.3-70b"), policy)
    assert e.value.source == "--policy"
    for ok in ("full-attention", "none"):
        check_policy(model("llama-3.3-70b"), ok)


def test_unknown_policy_and_state_only_model_refused():
    with pytest.raises(InputError, match="unknown policy"):
        check_policy(model("kimi-k3"), "vllm-hybrid")
    pure = ModelConfig(name="mamba-only", hidden_size=16, num_layers=2, vocab_size=100, dense_ffn_width=32,
                       layer_pattern=["mamba2/dense x2"], mamba2=dict(num_heads=4, head_dim=2, state_size=3))
    with pytest.raises(InputError, match="no attention layer"):
        check_policy(pure, "vllm-align")


def test_block_keys_prove_a_shared_block_at_the_next_trace_id():
    """1,056-token blocks over 512-token ids: block 0 (tokens < 1,056) is proved by id 2 (ending at 1,536), block
    1 (< 2,112) by id 4 (ending at 2,560). A 2,200-token prompt has 4 full ids: block 0 keyed, block 1 not
    (its proving id 4 would be the partial last one). 272-token blocks: ids 0, 1, 1, 2 prove blocks 0-3, each
    key tagged with its block."""
    req = TraceRequest(0.0, 2200, 1, block_ids=[10, 11, 12, 13, 14])
    keys = block_keys(req, 1056)
    assert len(keys) == 1 and keys[0] >> 24 == 12
    longer = TraceRequest(0.0, 3000, 1, block_ids=[10, 11, 12, 13, 14, 15])
    assert [k >> 24 for k in block_keys(longer, 1056)] == [12, 14]
    small = block_keys(TraceRequest(0.0, 1100, 1, block_ids=[10, 11, 12]), 272)
    assert [k >> 24 for k in small] == [10, 11, 11] and len(set(small)) == 3  # 4th block's id 2 is partial
    assert block_keys(req, 1024) == [11, 13]  # multiples of the trace block: prefix_keys's


def test_k3_policy_is_todays_decoupled_policy():
    """`k3` on K3 is `decoupled` at 512 / 6144 (its page rule gives 6,144): the same replay, figure by figure."""
    m = model("kimi-k3")
    reqs = list(read_mooncake(TRACES / "conversation_head300.jsonl"))
    a = replay(reqs, engine_config(m, "k3"))
    b = replay(reqs, config_from_model(m, "decoupled", 512, 6144))
    for f in ("token_hit_rate", "request_hit_rate", "prefill_tokens_saved", "checkpoint_bytes_peak",
              "checkpoints_written", "evictions", "prefill_flop_saved"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.token_hit_rate > 0


def test_engine_policies_on_a_trace_slice_keep_the_invariants():
    """Every engine policy on Nemotron-H, bounded so that states are evicted, with the invariant check every
    20 steps; the upper bound is never beaten and `none` reuses nothing."""
    m = model("nemotron-h-56b")
    reqs = list(read_mooncake(TRACES / "conversation_head300.jsonl", limit=80))
    res = {p: replay(reqs, engine_config(m, p, capacity_bytes=3e11), check_every=20) for p in ENGINE_POLICIES}
    top = res["full-attention"].token_hit_rate
    assert top > 0 and res["none"].token_hit_rate == 0 == res["none"].checkpoints_written
    assert all(r.token_hit_rate <= top + 1e-12 for r in res.values())
    assert res["trtllm-periodic"].evictions > 0 and res["sglang-no-buffer"].state_pool_bytes_peak > 0
