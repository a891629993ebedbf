"""Model what-ifs (`k3sim.configs.overrides`, `load_model(path, overrides=...)`): an overridden model is the
model of a file that says the same, `every:N` is the layer pattern written out, and every bad override is one
line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from k3sim.configs import overrides
from k3sim.configs.loaders import load_model
from k3sim.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
K3 = ROOT / "models" / "kimi-k3.yaml"
QWEN = ROOT / "models" / "qwen3-next-80b-a3b.yaml"
SKIP = {"source"}


def edited_copy(tmp_path: Path, src: Path, **changes) -> Path:
    """The model file with `changes` written into it by hand (dotted keys as nested mappings)."""
    data = yaml.safe_load(src.read_text())
    for key, value in changes.items():
        node = data
        *parents, last = key.split("__")
        for p in parents:
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
        node[last] = value
    out = tmp_path / src.name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@pytest.mark.parametrize("sets,changes", [
    (["kda.num_heads=48"], {"kda__num_heads": 48}),
    (["moe.num_active_experts=6", "hidden_size=4096"], {"moe__num_active_experts": 6, "hidden_size": 4096}),
    (["mla.kv_cache_dtype=fp8", "vision=null"], {"mla__kv_cache_dtype": "fp8", "vision": None}),
    (["full_attn_layers=[4, 8, 93]"], {"full_attn_layers": [4, 8, 93]}),
])
def test_an_override_is_the_model_of_the_edited_file(tmp_path, sets, changes):
    got = load_model(K3, overrides=sets)
    want = load_model(edited_copy(tmp_path, K3, **changes), overrides=())
    assert got.model_dump(exclude=SKIP) == want.model_dump(exclude=SKIP)
    assert got.model_dump(exclude=SKIP) != load_model(K3, overrides=()).model_dump(exclude=SKIP)
    assert got.source.endswith("with " + ", ".join(f"--set {s}" for s in sets))


@pytest.mark.parametrize("raw,value", [("48", 48), ("0.5", 0.5), ("true", True), ("null", None), ("", None),
                                       ("[4, 8]", [4, 8]), ("fp8", "fp8"), ("every:8", "every:8"),
                                       ("'48'", "48")])
def test_values_parse_as_yaml(raw, value):
    (ov,) = overrides.parse([f"hidden_size={raw}"])
    assert ov.key == "hidden_size" and ov.value == value and type(ov.value) is type(value)


def test_every_n_under_the_kimi_rule_lists_every_nth_layer():
    m = load_model(K3, overrides=["full_attn_layers=every:8"])
    assert m.full_attn_layers == [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88]
    assert (m.num_mla_layers, m.num_kda_layers) == (11, 82)
    assert m.layer_kinds[7] == "mla" and m.layer_kinds[8] == "kda" and m.ffn_kinds[0] == "dense"


def test_every_n_is_resolved_against_the_overridden_layer_count():
    m = load_model(K3, overrides=["full_attn_layers=every:4", "num_layers=48"])
    assert m.num_layers == 48 and m.full_attn_layers == list(range(4, 49, 4))


def test_every_4_gives_back_qwen3_nexts_own_pattern_and_every_8_halves_its_attention():
    base = load_model(QWEN, overrides=())
    assert load_model(QWEN, overrides=["full_attn_layers=every:4"]).layer_pattern == base.layer_pattern
    m = load_model(QWEN, overrides=["full_attn_layers=every:8"])
    assert [i for i, k in enumerate(m.layer_kinds) if k == "gqa"] == [7, 15, 23, 31, 39, 47]
    assert m.layer_pattern == ["gdn/moe x7", "gqa/moe"] * 6


def test_every_n_keeps_each_layers_ffn():
    jamba = ROOT / "models" / "jamba-1.5-mini.yaml"
    base, m = load_model(jamba, overrides=()), load_model(jamba, overrides=["full_attn_layers=every:4"])
    assert m.ffn_kinds == base.ffn_kinds and m.layer_kinds != base.layer_kinds
    assert [i for i, k in enumerate(m.layer_kinds) if k != "mamba"] == [3, 7, 11, 15, 19, 23, 27, 31]


def test_a_section_the_file_leaves_out_is_started_and_checked_like_a_file():
    with pytest.raises(InputError) as e:
        load_model(ROOT / "models" / "deepseek-v3.yaml", overrides=["kda.num_heads=32"])
    assert str(e.value).startswith("--set kda.num_heads=32: field 'kda.") and "Field required" in str(e.value)


@pytest.mark.parametrize("sets,needles", [
    (["kda.num_head=48"], ["--set kda.num_head=48", "unknown key 'kda.num_head'", "kda.num_heads"]),
    (["hidden=4096"], ["--set hidden=4096", "unknown key 'hidden'", "hidden_size"]),
    (["moe.bogus=1"], ["unknown key 'moe.bogus'", "moe.num_routed_experts"]),
    (["kda.num_heads=abc"], ["--set kda.num_heads=abc", "field 'kda.num_heads'", "valid integer"]),
    (["kda.num_heads=true"], ["--set kda.num_heads=true", "booleans are not numbers"]),
    (["kda.num_heads=4.5"], ["--set kda.num_heads=4.5", "field 'kda.num_heads'"]),
    (["full_attn_layers=every:0"], ["--set full_attn_layers=every:0", "N >= 1", "'0'"]),
    (["full_attn_layers=every:x"], ["--set full_attn_layers=every:x", "N >= 1"]),
    (["full_attn_layers=every:94"], ["every:94 gives no full-attention layer", "N <= 93"]),
    (["hidden_size"], ["--set hidden_size", "expected KEY=VALUE"]),
    (["=4"], ["expected KEY=VALUE"]),
    (["kda.num_heads=48", "kda.num_heads=32"], ["--set kda.num_heads=32", "given twice"]),
    (["kda={num_heads: 48}", "kda.num_heads=32"], ["'kda' and 'kda.num_heads' inside it are both given"]),
    (["kda.num_heads=[1"], ["--set kda.num_heads=[1", "malformed YAML"]),
    (["name=a: b"], ["--set name=a: b", "malformed YAML"]),
    (["num_layers=48"], ["--set num_layers=48", "field 'full_attn_layers'", "beyond num_layers 48"]),
])
def test_a_bad_override_is_one_line_naming_it(sets, needles):
    with pytest.raises(InputError) as e:
        load_model(K3, overrides=sets)
    line = str(e.value)
    assert "\n" not in line
    for n in needles:
        assert n in line, (n, line)


def test_a_newline_in_a_value_is_refused():
    with pytest.raises(InputError, match="one line"):
        overrides.parse(["name=a\nhidden_size: 1"])


@pytest.mark.parametrize("model,needle", [
    ("deepseek-v3", "has no kda section"),
    ("llama-3.3-70b", "linear kinds: none"),
    ("nemotron-h-56b", "one mixer per layer"),
])
def test_every_n_is_refused_where_the_model_has_no_linear_kind_to_put_between(model, needle):
    with pytest.raises(InputError) as e:
        load_model(ROOT / "models" / f"{model}.yaml", overrides=["full_attn_layers=every:8"])
    assert str(e.value).startswith("--set full_attn_layers=every:8: ") and needle in str(e.value)


def test_a_file_refused_by_itself_is_named_not_the_override(tmp_path):
    bad = tmp_path / "bad.yaml"
    data = yaml.safe_load(K3.read_text())
    data["kda"]["num_heads"] = "many"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as e:
        load_model(bad, overrides=["hidden_size=4096"])
    assert str(e.value).startswith(str(bad)) and "--set" not in str(e.value)


def test_the_running_commands_overrides_reach_every_load_until_cleared():
    overrides.install(overrides.parse(["kda.num_heads=48"]))
    try:
        assert load_model(K3).kda.num_heads == 48  # a scenario's model is loaded the same way
        from k3sim.configs.loaders import resolve_scenario

        assert resolve_scenario(ROOT / "scenarios" / "default.yaml")[1].kda.num_heads == 48
        assert load_model(K3, overrides=()).kda.num_heads == 96  # explicit none: the file as it is
    finally:
        overrides.clear()
    assert load_model(K3).kda.num_heads == 96


def test_an_hf_config_takes_the_schemas_keys():
    m = load_model(ROOT / "tests" / "data" / "hf" / "kimi-linear-48b", overrides=["kda.num_heads=16"])
    assert m.kda.num_heads == 16 and m.mla.num_heads == 32
