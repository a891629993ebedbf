"""Shipped model files and the Hugging Face loader: layer patterns and field-by-field equality."""

from __future__ import annotations

import pytest

from k3sim.configs import ModelConfig, load_model

MODELS = ["kimi-k3", "kimi-linear-48b", "kimi-k2", "deepseek-v3"]


def test_k3_layer_pattern(root):
    m = load_model(root / "models/kimi-k3.yaml")
    assert (m.num_layers, m.num_kda_layers, m.num_mla_layers) == (93, 69, 24)
    # Blocks of 3 KDA + 1 MLA, and both of the last two layers are MLA (torchtitan's note).
    assert m.layer_kinds[:8] == ["kda", "kda", "kda", "mla"] * 2
    assert m.layer_kinds[-3:] == ["kda", "mla", "mla"]
    assert m.ffn_kinds[0] == "dense" and m.num_moe_layers == 92
    assert m.num_attn_res_blocks == 8  # ceil(93 / 12)
    assert m.moe.routed_weight_format == "mxfp4"


def test_kimi_linear_and_k2_patterns(root):
    lin = load_model(root / "models/kimi-linear-48b.yaml")
    assert (lin.num_kda_layers, lin.num_mla_layers, lin.num_moe_layers) == (20, 7, 26)
    assert lin.layer_kinds[-1] == "mla" and lin.mla.q_lora_rank is None
    k2 = load_model(root / "models/kimi-k2.yaml")
    assert (k2.num_kda_layers, k2.num_mla_layers, k2.kda) == (0, 61, None)
    assert k2.num_attn_res_blocks == 0


@pytest.mark.parametrize("name", MODELS)
def test_hf_config_matches_our_yaml(root, name):
    """The HF loader must produce the same config as our YAML, field by field (torchtitan's style)."""
    # training_stack_fused_permute is a fact about the published training stack (cited in our YAML), not
    # something a checkpoint's config.json says
    skip = {"source", "training_stack_fused_permute"}
    ours = load_model(root / f"models/{name}.yaml").model_dump(exclude=skip)
    hf = load_model(root / f"tests/data/hf/{name}/config.json").model_dump(exclude=skip)
    mismatch = {k: (ours[k], hf[k]) for k in ours if ours[k] != hf[k]}
    assert mismatch == {}


def test_hf_k3_nested_text_config(root):
    m = load_model(root / "tests/data/hf/kimi-k3/config.json")
    assert m.kda.alpha_gate_rank is None  # use_full_rank_gate
    assert m.mla.output_gate and m.moe.latent_width == 3584 and m.moe.routed_weight_format == "mxfp4"
    assert m.vision is not None and m.vision.patch_size == 14
    assert m.weight_format == "bf16"  # only routed experts are quantized


def test_hf_k2_fp8(root):
    m = load_model(root / "tests/data/hf/kimi-k2/config.json")
    assert m.weight_format == "fp8" and m.moe.routed_weight_format == "fp8"


def test_model_config_in_code_has_defaults():
    m = ModelConfig(name="toy", hidden_size=8, num_layers=2, vocab_size=10, dense_ffn_width=16,
                    mla={"num_heads": 2, "kv_lora_rank": 4, "qk_nope_head_dim": 2,
                         "qk_rope_head_dim": 2, "v_head_dim": 2})
    assert m.layer_kinds == ["mla", "mla"] and m.ffn_kinds == ["dense", "dense"]
    assert m.mla.kv_cache_dtype == "bf16"


def test_deepseek_v3_published_totals(root):
    """DeepSeek-V3 (arXiv 2412.19437 sec. 4.2): 671B total, 37B activated per token, within 3 %; 61 MLA
    layers of which the first 3 are dense."""
    from k3sim.memory.params import count_params

    m = load_model(root / "models/deepseek-v3.yaml")
    assert (m.num_mla_layers, m.num_kda_layers, m.num_moe_layers) == (61, 0, 58)
    report = count_params(m)
    total, active = report.total_params, report.active_params
    assert abs(total / 671e9 - 1) < 0.03 and abs(active / 37e9 - 1) < 0.03


@pytest.mark.parametrize("name, limit", [("kimi-k3", 1_048_576), ("kimi-k2", 131_072), ("deepseek-v3", 163_840),
                                         ("kimi-linear-48b", 1_048_576)])
def test_hf_max_position_embeddings_is_the_context_limit(root, name, limit):
    """config.json's max_position_embeddings (K3 nested in text_config) becomes max_context_tokens, and it
    agrees with our hand-written YAML of the same model."""
    from k3sim.errors import InputError

    hf = load_model(root / f"tests/data/hf/{name}/config.json")
    assert hf.max_context_tokens == limit == load_model(root / f"models/{name}.yaml").max_context_tokens
    hf.check_context(limit)  # the limit itself is allowed
    with pytest.raises(InputError, match=f"--context: {limit + 1:,} tokens exceeds the {limit:,}"):
        hf.check_context(limit + 1)
