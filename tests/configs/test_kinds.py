"""The layer-kind registry: every kind's parameters, state, conv state, KV and TP rules on toy shapes worked by
hand, and the layer pattern (`ModelConfig.layer_pattern`) with its refusals."""

from __future__ import annotations

import time

import pytest

from k3sim.configs import ModelConfig, load_model
from k3sim.configs.kinds import FFNS, MIXERS, MixerKind, canonical_entries, parse_pattern
from k3sim.errors import InputError


def test_every_registered_kind_has_its_section_and_a_unique_letter():
    """A new kind is a module plus a ModelConfig section of its name holding its schema."""
    for name, kind in MIXERS.items():
        field = ModelConfig.model_fields[name]
        assert kind.schema in getattr(field.annotation, "__args__", ()), name
        assert type(kind).tp_rules is not MixerKind.tp_rules and type(kind).params is not MixerKind.params, name
    letters = [k.letter for k in MIXERS.values()]
    assert len(set(letters)) == len(letters) and "-" not in letters
    assert list(MIXERS)[:2] == ["kda", "mla"] and set(FFNS) == {"dense", "moe"}


def test_gdn_toy_by_hand():
    g, cfg = MIXERS["gdn"], MIXERS["gdn"].schema(num_key_heads=2, num_value_heads=4, head_dim_k=4, head_dim_v=2)
    # d=16, key 2x4=8, value 4x2=8: qkvz 16*(16+16)=512, ba 16*8=128, conv (16+8)*4=96, dt_bias+A_log 8,
    # gated norm 2, out 8*16=128
    assert g.params(cfg, 16) == 512 + 128 + 96 + 8 + 2 + 128 == 874
    assert g.state_bytes(cfg) == 4 * 4 * 2 * 4 == 128 and g.state_bytes(cfg, tp=2) == 64  # value heads x dk x dv
    assert g.conv_state_bytes(cfg) == 3 * 24 * 2 == 144 and g.conv_state_bytes(cfg, tp=2) == 72
    assert g.kv_bytes_per_token(cfg) == 0 and g.recurrent
    assert g.tp_problem(cfg, 2) is None and g.tp_problem(cfg, 4) == "tp=4 does not divide the 2 GDN key heads"
    with pytest.raises(ValueError, match="not a multiple of num_key_heads"):
        g.schema(num_key_heads=3, num_value_heads=4, head_dim_k=4, head_dim_v=4)


def test_mamba2_toy_by_hand_and_group_replication():
    m = MIXERS["mamba2"]
    cfg = m.schema(num_heads=4, head_dim=2, state_size=3, n_groups=2)
    # d=16, inner 8, B/C 2*2*3=12: in_proj 16*(16+12+4)=512, conv (8+12)*4+20=100, dt_bias/A_log/D 12,
    # gated norm 8, out_proj 8*16=128
    assert m.params(cfg, 16) == 512 + 100 + 12 + 8 + 128 == 760
    assert m.state_bytes(cfg) == 4 * 2 * 3 * 4 == 96 and m.state_bytes(cfg, tp=2) == 48
    assert m.conv_state_bytes(cfg) == 3 * 20 * 2 == 120 and m.conv_state_bytes(cfg, tp=2) == 3 * (4 + 6) * 2
    one = cfg.model_copy(update={"n_groups": 1})
    # one group is held whole by both ranks: channels 4 + 2*1*3 = 10 per rank (not (8 + 6) / 2 = 7)
    assert m.conv_state_bytes(one) == 3 * 14 * 2 and m.conv_state_bytes(one, tp=2) == 3 * 10 * 2
    assert m.tp_problem(one, 4) is None  # 4 heads, one group replicated
    assert m.tp_problem(cfg, 4) == ("tp=4 does not divide the 2 Mamba2 groups (only a single group can be "
                                    "replicated over the ranks)")
    assert m.tp_problem(cfg, 8) == "tp=8 does not divide the 4 Mamba2 heads"
    no_norm = cfg.model_copy(update={"gated_norm": False, "proj_bias": True, "conv_bias": False})
    assert m.params(no_norm, 16) == 760 - 8 + 32 + 16 - 20  # Falcon-H1 without mamba_rms_norm; biases


def test_mamba1_and_lightning_toys_by_hand():
    m = MIXERS["mamba"]
    cfg = m.schema(inner_size=32, state_size=4, dt_rank=2, inner_norms=True)
    # in_proj 16*64=1024, conv 32*4+32=160, x_proj 32*(2+8)=320, dt_proj 2*32+32=96, A_log+D 32*4+32=160,
    # out_proj 32*16=512, dt/B/C norms 2+4+4=10
    assert m.params(cfg, 16) == 1024 + 160 + 320 + 96 + 160 + 512 + 10 == 2282
    assert m.state_bytes(cfg) == 32 * 4 * 4 and m.conv_state_bytes(cfg, tp=2) == 3 * 16 * 2
    assert m.tp_problem(cfg, 3) == "tp=3 does not divide the 32 Mamba inner channels"
    light = MIXERS["lightning"]
    lc = light.schema(num_heads=2, head_dim=4)
    assert light.params(lc, 16) == 16 * 24 + 16 * 8 + 8 + 8 * 16 == 648  # qkv, gate, norm, out
    assert light.state_bytes(lc) == 2 * 4 * 4 * 4 and light.state_bytes(lc, state_dtype="bf16") == 64
    assert light.conv_state_bytes(lc) == 0


def test_gqa_toy_by_hand_and_kv_head_replication():
    a = MIXERS["gqa"]
    cfg = a.schema(num_heads=4, num_kv_heads=2, head_dim=4, output_gate=True, qk_norm=True, qkv_bias=True)
    # q with gate 16*4*4*2=512, k+v 2*16*2*4=256, o 16*16=256, q/k norms 8, biases (4+4)*4=32
    assert a.params(cfg, 16) == 512 + 256 + 256 + 8 + 32 == 1064
    assert a.kv_bytes_per_token(cfg) == 2 * 2 * 4 * 2 == 32 and a.kv_bytes_per_token(cfg, tp=2) == 16
    assert a.kv_bytes_per_token(cfg, tp=4) == 16  # 4 ranks, 2 KV heads: one replicated head each
    assert a.tp_problem(cfg, 4) is None
    assert a.tp_problem(cfg, 8) == "tp=8 does not divide the 4 GQA query heads"
    odd = a.schema(num_heads=48, num_kv_heads=8, head_dim=4)
    assert a.tp_problem(odd, 12) == ("tp=12 does not divide the 8 GQA key/value heads (nor is it a multiple of "
                                     "them, which would replicate them)")
    swa = MIXERS["swa"]
    sc = swa.schema(num_heads=4, num_kv_heads=2, head_dim=4, window_tokens=1024)
    assert swa.kv_tokens(sc, 4096) == 1024 and swa.kv_tokens(sc, 100) == 100 and a.kv_tokens(cfg, 4096) == 4096
    with pytest.raises(ValueError, match="does not divide num_heads"):
        a.schema(num_heads=6, num_kv_heads=4, head_dim=4)


def _pattern_model(**kw):
    base = dict(name="p", hidden_size=16, num_layers=4, vocab_size=10, dense_ffn_width=32,
                gdn=dict(num_key_heads=2, num_value_heads=4, head_dim_k=4, head_dim_v=2),
                gqa=dict(num_heads=4, num_kv_heads=2, head_dim=4))
    base.update(kw)
    return ModelConfig(**base)


def test_layer_pattern_runs_parallel_mixers_and_canonical_spelling():
    m = _pattern_model(layer_pattern=["gdn/dense", "gdn/dense x2", "gqa/dense"])
    assert m.layer_pattern == ["gdn/dense x3", "gqa/dense"]  # adjacent runs merged: one spelling per model
    assert m.layer_kinds == ["gdn", "gdn", "gdn", "gqa"] and m.ffn_kinds == ["dense"] * 4
    assert (m.num_layers_with("gdn"), m.num_layers_with("gqa"), m.num_dense_layers) == (3, 1, 4)
    assert m.mixer_kinds == ("gdn", "gqa") and (m.num_kda_layers, m.num_mla_layers) == (0, 0)
    par = _pattern_model(num_layers=2, layer_pattern=["gqa+gdn/dense", "none/dense"])
    assert par.layers[0].mixers == ("gqa", "gdn") and par.layer_kinds == ["gqa+gdn", "none"]
    assert par.layers[1].mixers == () and par.layers[1].ffn == "dense"
    assert canonical_entries(["gdn/moe x2", "gdn/moe", "gqa/none"]) == ["gdn/moe x3", "gqa/none"]


def test_kimi_rule_and_the_same_layers_as_a_pattern_agree(root):
    """Kimi-Linear spelled with layer_pattern has the same layers, kinds and parameters as its full_attn_layers."""
    from k3sim.memory.params import count_params

    lin = load_model(root / "models/kimi-linear-48b.yaml")
    data = lin.model_dump(exclude={"full_attn_layers", "first_k_dense"})
    data["layer_pattern"] = [f"{k}/{f}" for k, f in zip(lin.layer_kinds, lin.ffn_kinds)]
    same = ModelConfig(**data)
    assert same.layer_kinds == lin.layer_kinds and same.ffn_kinds == lin.ffn_kinds
    assert same.layer_pattern[:3] == ["kda/dense", "kda/moe x2", "mla/moe"]
    assert count_params(same).by_component() == count_params(lin).by_component()


@pytest.mark.parametrize("kw, words", [
    (dict(layer_pattern=["gdn/dense x3"]), "layer_pattern describes 3 layers but num_layers is 4"),
    (dict(layer_pattern=["gdn/dense x3", "gqa/dens"]), "unknown FFN kind 'dens'"),
    (dict(layer_pattern=["gdm/dense x3", "gqa/dense"]), "unknown mixer kind 'gdm' (known: kda, mla, gdn"),
    (dict(layer_pattern=["gdn-dense x4"]), "expected '<mixer>/<ffn>'"),
    (dict(layer_pattern=["none/none x4"]), "needs a mixer or an FFN"),
    (dict(layer_pattern=["gdn/dense x4"]), "gqa section given but no layer_pattern entry uses gqa"),
    (dict(layer_pattern=["gdn/dense x3", "gqa/moe"]), "moe section missing but there are MoE layers"),
    (dict(layer_pattern=["gdn/dense x3", "gqa/dense"], first_k_dense=1), "first_k_dense cannot be combined"),
    (dict(layer_pattern=None), "gdn section given but no layer_pattern says which layers are GDN"),
    (dict(layer_pattern=["gdn/dense x999999999"]), "describes 999,999,999 layers but num_layers is 4"),
])
def test_layer_pattern_refusals(kw, words):
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as err:
        _pattern_model(**kw)
    assert words in str(err.value)
    assert time.perf_counter() - t0 < 5  # a huge repeat count is refused before any list is built


def test_pattern_errors_name_the_field_through_the_loader(tmp_path):
    import yaml

    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(dict(name="p", hidden_size=16, num_layers=4, vocab_size=10, dense_ffn_width=32,
                                     layer_pattern=["gqa/dense x5"],
                                     gqa=dict(num_heads=4, num_kv_heads=2, head_dim=4))))
    with pytest.raises(InputError) as err:
        load_model(p)
    assert err.value.field == "layer_pattern" and "describes 5 layers but num_layers is 4" in err.value.reason
    assert parse_pattern(["gqa/dense x4"], 4)[3].index == 3
