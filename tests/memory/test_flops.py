"""The one model-FLOP count (`k3sim.memory.flops`) worked by hand for K3, and the prefix cache and training
reading the same count."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3sim.configs.loaders import load_model
from k3sim.memory.flops import model_flop, training_flop_per_token
from k3sim.memory.params import count_params
from k3sim.prefix_cache.flops import prefill_flops

K3 = Path(__file__).parents[2] / "models" / "kimi-k3.yaml"

# K3 (models/kimi-k3.yaml): 93 layers = 24 MLA + 69 KDA; MLA 96 heads, d_qk = 128 nope + 64 rope = 192,
# d_v = 128; KDA 96 heads, d_k = d_v = 128; active parameters 104,189,598,304 (LM head 1,174,405,120 of them).
N_ACTIVE = 104_189_598_304
LM_HEAD = 1_174_405_120
# MLA, per token forward: 24 layers x 96 heads x (192 + 128) x S = 737,280 S; forward+backward 3 x: 2,211,840 S
MLA_COEFF = 24 * 96 * (192 + 128)
# KDA chunkwise forward per token and head (C = 64, D = 128): 5 x 2 C D + 3 x 2 D^2 + C^2 / 3
#   = 81,920 + 98,304 + 1,365.33 = 181,589.33; x 69 layers x 96 heads = 1,202,847,744 per token
KDA_FWD = 1_202_847_744
# training per token = 6 N + 3 x MLA + 3 x KDA
#   32K: 625,137,589,824 + 72,477,573,120 + 3,608,543,232 = 701,223,706,176
#   1M:  625,137,589,824 + 2,319,282,339,840 + 3,608,543,232 = 2,948,028,472,896
K3_TRAIN_32K = 701_223_706_176
K3_TRAIN_1M = 2_948_028_472_896


@pytest.fixture(scope="module")
def k3():
    return load_model(K3)


def test_k3_inputs(k3):
    rep = count_params(k3)
    assert rep.active_params == N_ACTIVE
    assert sum(r.active_params for r in rep.rows if r.component == "lm_head") == LM_HEAD
    assert (k3.num_mla_layers, k3.num_kda_layers) == (24, 69)


def test_k3_forward_terms(k3):
    f = model_flop(k3)
    assert f.causal_attention_flop_coefficient == MLA_COEFF == 737_280
    assert f.lm_head_flop_per_token == 2 * LM_HEAD
    assert f.linear_flop_per_token == pytest.approx(2 * (N_ACTIVE - LM_HEAD) + KDA_FWD, rel=1e-12)


@pytest.mark.parametrize("seq_len, expected", [(32_768, K3_TRAIN_32K), (1_048_576, K3_TRAIN_1M)])
def test_k3_training_flop_per_token(k3, seq_len, expected):
    assert training_flop_per_token(k3, seq_len) == pytest.approx(expected, rel=1e-12)


def test_k3_attention_share_at_1m(k3):
    # at 1M the causal MLA term is 2,319,282,339,840 / 2,948,028,472,896 = 78.7 % of the model FLOP
    f = model_flop(k3)
    assert 3 * f.causal_attention_flop_coefficient * 1_048_576 / K3_TRAIN_1M == pytest.approx(0.7867, abs=1e-4)


@pytest.mark.parametrize("seq_len", [32_768, 1_048_576])
def test_prefix_cache_and_training_agree(k3, seq_len):
    """Prefill of one sequence (exact causal count, no LM head) vs training's per-token count (Megatron's
    S / 2 keys per query, LM head on every token): 3 x (prefill + LM head) is training's forward+backward."""
    from k3sim.configs import load_hardware
    from k3sim.training import TrainingContext

    ctx = TrainingContext(k3, load_hardware("h200"), kernel_time=lambda *a, **k: None, layer_costs=lambda *a, **k: [])
    training = ctx.model_flop_per_token(seq_len) * seq_len
    prefill = 3 * (prefill_flops(k3)(seq_len) + 2 * LM_HEAD * seq_len)
    assert prefill == pytest.approx(training, rel=0.01)
    assert prefill != training   # S (S + 1) against S^2: the two forms differ by 1 / S, no more
    assert abs(prefill / training - 1) < 1.0 / seq_len


def test_prefill_numbers_unchanged(k3):
    # the prefix cache's polynomial before it read k3sim.memory.flops: 2 (N - LM head) + KDA per token =
    # 206,030,386,368 + 1,202,847,744 = 207,233,234,112, and 737,280 per token pair: prefill of 32K =
    # 207,233,234,112 x 32,768 + 737,280 x 32,768 x 32,769 = 7,582,291,146,571,776
    p = prefill_flops(k3)
    assert p.linear_flop_per_token == pytest.approx(207_233_234_112, rel=1e-12)
    assert p.attention_flop_per_token_pair == 737_280
    assert p(32_768) == pytest.approx(7_582_291_146_571_776, rel=1e-12)


def test_hybrid_kinds_count_their_attention_and_recurrence():
    """Qwen3-Next: 12 gated-GQA layers of 16 heads x 256 (each pair 2 x 256 FLOP in QK^T and PV: H (d_qk + d_v)
    = 16 x 512 per layer), 36 GDN layers of 32 value heads; MFU counted them as zero before issue 23."""
    from k3sim.configs.loaders import load_model
    from k3sim.kernels.ops import kda_fwd_flop_per_token_head
    from k3sim.memory.flops import causal_attention_flop_coefficient, recurrent_flop_per_token

    m = load_model(K3.parent / "qwen3-next-80b-a3b.yaml")
    assert causal_attention_flop_coefficient(m) == 12 * 16 * 512
    assert recurrent_flop_per_token(m) == pytest.approx(36 * 32 * kda_fwd_flop_per_token_head(D=128, V=128))
    assert recurrent_flop_per_token(m) > 0


def test_a_sliding_window_caps_the_pairs():
    """10 tokens, window 4: queries 0-3 see 1-4 keys (10 pairs), queries 4-9 see 4 each (24): 34 pairs, x2."""
    from k3sim.memory.flops import causal_pairs

    assert causal_pairs(10, 4) == 68
    assert causal_pairs(10, None) == 10 * 11 == causal_pairs(10, 64)
