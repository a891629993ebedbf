"""Hostile hybrid-model inputs through the real CLI (issue 23): an unknown config.json model_type, a layer pattern
whose length is not the layer count, a TP that does not split a kind's heads or groups, and a hybrid training plan
that does not fit: each one line naming the key or option, exit 2, nothing on stdout. (Every consumer prices
every kind since issue 23: the refusals of kinds a consumer did not model are gone with them.)"""

from __future__ import annotations

import json

import pytest
import yaml

from hostile_helpers import ROOT, assert_one_line, run_main

NANO = ROOT / "models" / "nemotron-3-nano-30b-a3b.yaml"
QWEN3_NEXT = ROOT / "models" / "qwen3-next-80b-a3b.yaml"


def _json(tmp_path, data) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    return str(p)


def test_unknown_model_type_lists_the_known_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short path: the list of known types fits the 300-character line after it
    _json(tmp_path, {"model_type": "mamba_xl", "hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 10})
    p = "config.json"
    line = assert_one_line(*run_main(capsys, "model-info", "--model", p), p, "field 'model_type'",
                           "unknown model_type 'mamba_xl'", "qwen3_next", "nemotron_h", "granitemoehybrid",
                           "jamba", "falcon_h1", "minimax_m1", "deepseek_v3", "llama")
    assert len(line) < 300


def test_hf_pattern_length_is_not_the_layer_count(tmp_path, capsys):
    p = _json(tmp_path, {"model_type": "nemotron_h", "hidden_size": 64, "num_hidden_layers": 5,
                         "hybrid_override_pattern": "M*M-", "mamba_num_heads": 4, "mamba_head_dim": 16,
                         "ssm_state_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 128, "vocab_size": 100})
    assert_one_line(*run_main(capsys, "memory", "--model", p), p, "field 'hybrid_override_pattern'",
                    "has 4 characters but num_hidden_layers is 5")


def test_yaml_layer_pattern_length_is_not_num_layers(tmp_path, capsys):
    data = yaml.safe_load(QWEN3_NEXT.read_text())
    data["layer_pattern"] = data["layer_pattern"][:-1]
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(data))
    assert_one_line(*run_main(capsys, "model-info", "--model", p), str(p), "field 'layer_pattern'",
                    "describes 47 layers but num_layers is 48")


@pytest.mark.parametrize("model, tp, words", [
    (QWEN3_NEXT, "3", "tp=3 does not divide the 16 GDN key heads"),
    (NANO, "3", "tp=3 does not divide the 64 Mamba2 heads"),
    (ROOT / "models" / "jamba-1.5-mini.yaml", "3", "tp=3 does not divide the 8192 Mamba inner channels"),
    (ROOT / "models" / "minimax-m1.yaml", "3", "tp=3 does not divide the 64 lightning heads"),
])
def test_tp_that_does_not_split_a_kind(capsys, model, tp, words):
    assert_one_line(*run_main(capsys, "memory", "--model", model, "--tp", tp), "--tp:", words)


def test_tp_that_does_not_split_mamba2_groups_or_kv_heads(tmp_path, capsys):
    """Heads divide but the 2 B/C groups do not (only one group can be replicated); 8 KV heads and tp 6."""
    data = yaml.safe_load(NANO.read_text())
    data["mamba2"].update(num_heads=64, n_groups=2)
    p = tmp_path / "groups.yaml"
    p.write_text(yaml.safe_dump(data))
    assert_one_line(*run_main(capsys, "memory", "--model", p, "--tp", "4", "--ep", "4"), "--tp:",
                    "tp=4 does not divide the 2 Mamba2 groups")
    data = yaml.safe_load((ROOT / "models" / "llama-3.3-70b.yaml").read_text())
    data["gqa"].update(num_heads=48, num_kv_heads=8)
    p = tmp_path / "kv.yaml"
    p.write_text(yaml.safe_dump(data))
    assert_one_line(*run_main(capsys, "memory", "--model", p, "--tp", "6"), "--tp:",
                    "tp=6 does not divide the 8 GQA key/value heads")


def test_training_plan_of_a_hybrid_model_that_does_not_fit_is_one_line(capsys):
    # every kind trains now (memory.activations lists GDN's tensors); 80B of Adam states do not fit 8 GPUs of one stage
    assert_one_line(*run_main(capsys, "memory", "--model", QWEN3_NEXT, "--mode", "train", "--tp", "8", "--ep", "8",
                              "--context", "4096"), "does not fit", "largest: optimizer_states", "fits with --pp 2")
