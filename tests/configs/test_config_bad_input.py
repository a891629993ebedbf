"""Every bad input is one InputError line naming the file, the field and the reason."""

from __future__ import annotations

import json

import pytest
import yaml

from k3sim.configs import Parallelism, bytes_per_element, load_model, load_scenario, resolve_scenario
from k3sim.errors import InputError


def _write_model(tmp_path, root, edit, name="kimi-k3"):
    data = yaml.safe_load((root / f"models/{name}.yaml").read_text())
    edit(data)
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _err(fn, *args) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args)
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("edit, field, reason", [
    (lambda d: d.update(colour="red"), "colour", "unknown field"),
    (lambda d: d["kda"].update(num_heads=-96), "kda.num_heads", "greater than or equal to 1"),
    (lambda d: d.update(hidden_size=0), "hidden_size", "greater than or equal to 1"),
    (lambda d: d["mla"].update(kv_cache_dtype="fp5"), "mla.kv_cache_dtype", "unknown dtype"),
    (lambda d: d.update(full_attn_layers=[4, 94]), "full_attn_layers", "beyond num_layers"),
    (lambda d: d.pop("kda"), "kda", "missing"),
    (lambda d: d["moe"].update(num_active_experts=1000), "moe.num_active_experts", "exceeds"),
    (lambda d: d.pop("hidden_size"), "hidden_size", "required"),
])
def test_bad_model_fields(tmp_path, root, edit, field, reason):
    p = _write_model(tmp_path, root, edit)
    err = _err(load_model, p)
    assert err.source == str(p) and err.field == field and reason in err.reason


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\nhidden_size: 3\n")
    err = _err(load_model, p)
    assert "malformed YAML" in str(err) and str(p) in str(err)


def test_malformed_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"num_hidden_layers": 3,')
    assert "malformed JSON" in str(_err(load_model, p))


def test_not_a_mapping_and_missing_file(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    assert "mapping" in str(_err(load_model, p))
    assert "not found" in str(_err(load_model, tmp_path / "nope.yaml"))


def test_hf_missing_field(tmp_path, root):
    data = json.loads((root / "tests/data/hf/kimi-linear-48b/config.json").read_text())
    del data["kv_lora_rank"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    err = _err(load_model, p)
    assert err.field == "kv_lora_rank" and err.source == str(p)


def test_unknown_dtype():
    assert "fp5" in str(_err(bytes_per_element, "fp5"))


@pytest.mark.parametrize("layout, field, reason", [
    (dict(tp=5), "tp", "does not divide the 96 KDA heads"),
    (dict(tp=8, dp=3, ep=6), "ep", "does not divide the 896 routed experts"),
    (dict(tp=2, ep=32), "ep", "does not divide the tp*cp*dp=2"),
    (dict(pp=94), "pp", "exceeds the 93 layers"),
    (dict(pp=32, virtual_stages=3), "pp", "exceeds the 93 layers"),
])
def test_layout_must_divide_model(root, layout, field, reason):
    model = load_model(root / "models/kimi-k3.yaml")
    err = _err(Parallelism(**layout).check_against, model, "cli")
    assert err.field == field and reason in err.reason


def test_valid_layouts_pass(root):
    model = load_model(root / "models/kimi-k3.yaml")
    Parallelism(tp=8, pp=2, ep=8).check_against(model)
    Parallelism(tp=8, pp=16, virtual_stages=2, ep=64, dp=64).check_against(model)


def test_scenario_errors(tmp_path, root):
    data = yaml.safe_load((root / "scenarios/default.yaml").read_text())
    data["model"] = str(root / "models/kimi-k3.yaml")
    bad = dict(data, workload=dict(data["workload"], context_tokens=-1))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(bad))
    assert _err(load_scenario, p).field == "workload.context_tokens"
    bad = dict(data, cluster={"num_gpus": 12})
    p.write_text(yaml.safe_dump(bad))
    assert "multiple" in _err(load_scenario, p).reason
    bad = dict(data, parallelism={"tp": 8, "pp": 2, "ep": 6})
    p.write_text(yaml.safe_dump(bad))
    err = _err(resolve_scenario, p)
    assert err.field == "ep" and err.source == str(p)
    bad = dict(data, model="missing.yaml")
    p.write_text(yaml.safe_dump(bad))
    assert "not found" in str(_err(resolve_scenario, p))


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_binary_file_is_one_line(tmp_path, suffix):
    """A corrupt (non-UTF-8) file is an InputError naming it, not a UnicodeDecodeError traceback."""
    p = tmp_path / f"weights{suffix}"
    p.write_bytes(b"\x00\xff\xfe\x89PNG\x00")
    err = _err(load_model, p)
    assert err.source == str(p) and "not a UTF-8 text file" in err.reason


@pytest.mark.parametrize("old, new, field", [
    ("hbm_bytes: 150109880320", "hbm_bytes: .inf", "hbm_bytes"),
    ("hbm_bytes: 150109880320", "hbm_bytes: .nan", "hbm_bytes"),
    ("  bf16: 989.0e+12", "  bf16: .inf", "peak_flops_per_s.bf16"),
])
def test_hardware_infinite_or_nan_rejected(tmp_path, root, old, new, field):
    """inf used to pass PositiveFloat and crash the plan (int(inf)); a datasheet figure is finite."""
    from k3sim.configs import load_hardware

    text = (root / "hardware_profiles/h200.yaml").read_text()
    assert old in text
    p = tmp_path / "hw.yaml"
    p.write_text(text.replace(old, new))
    err = _err(load_hardware, p)
    assert err.source == str(p) and err.field == field


def _k3_hf(root):
    return json.loads((root / "tests/data/hf/kimi-k3/config.json").read_text())


@pytest.mark.parametrize("edit, field, reason", [
    (lambda d: d.update(text_config=[1, 2]), "text_config", "expected a mapping, got list"),
    (lambda d: d.update(quantization_config="mxfp4"), "quantization_config", "expected a mapping, got str"),
    (lambda d: d.update(vision_config=[1]), "vision_config", "expected a mapping, got list"),
    (lambda d: d["text_config"].update(linear_attn_config="kda"), "linear_attn_config", "expected a mapping"),
    (lambda d: d["text_config"]["linear_attn_config"].update(full_attn_layers=4),
     "linear_attn_config.full_attn_layers", "expected a list"),
    # bool("false") is True: a quoted flag must be rejected, not read as set.
    (lambda d: d["text_config"].update(tie_word_embeddings="false"), "tie_word_embeddings", "true or false"),
    (lambda d: d["text_config"]["linear_attn_config"].update(use_full_rank_gate="no"),
     "use_full_rank_gate", "true or false"),
])
def test_hf_wrong_types(tmp_path, root, edit, field, reason):
    data = _k3_hf(root)
    edit(data)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    err = _err(load_model, p)
    assert err.source == str(p) and err.field == field and reason in err.reason


def test_hf_null_flag_is_false(tmp_path, root):
    data = _k3_hf(root)
    data["text_config"]["mla_use_output_gate"] = None
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    assert load_model(p).mla.output_gate is False


# ---- files named in a scenario and profiles go through k3sim.reader (issue 19) -------------------------------

def _scenario_naming(tmp_path, root, **fields):
    data = yaml.safe_load((root / "scenarios/default.yaml").read_text())
    data["model"] = str(root / "models/kimi-k3.yaml")
    data.update(fields)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("make, needle", [
    (lambda d: (d / "m.yaml").symlink_to(d / "m.yaml"), "symbolic link loop"),
    (lambda d: (d / "m.yaml").symlink_to(d / "gone.yaml"), "which does not exist"),
    (lambda d: (d / "m.yaml").mkdir(), "is a directory"),
    (lambda d: (d / "m.yaml").symlink_to("/dev/zero"), "is a device"),
])
def test_a_scenario_model_that_is_there_but_unreadable_is_not_not_found(tmp_path, root, make, needle):
    """Was: "file not found ... (looked in ...)" for a symlink loop or a dangling link that is there."""
    make(tmp_path)
    err = _err(resolve_scenario, _scenario_naming(tmp_path, root, model="m.yaml"))
    assert needle in err.reason and "not found" not in err.reason


@pytest.mark.parametrize("make, needle", [
    (lambda d: (d / "gpu").mkdir(), "is a directory, expected a hardware profile"),
    (lambda d: (d / "gpu").symlink_to(d / "gpu"), "symbolic link loop"),
    (lambda d: (d / "gpu").symlink_to("/dev/null"), "is a device"),
])
def test_a_hardware_path_that_is_not_a_profile_says_what_it_is(tmp_path, make, needle, monkeypatch):
    """`--hardware d` for a directory d was "unknown hardware profile (known: ...)"."""
    from k3sim.configs import load_hardware

    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    assert needle in _err(load_hardware, "gpu").reason
    assert "unknown hardware profile" in _err(load_hardware, "no-such-gpu").reason  # a name stays a name


def test_a_config_over_the_cap_is_refused_before_reading(tmp_path):
    from k3sim.reader import MAX_CONFIG_BYTES

    p = tmp_path / "big.yaml"
    with open(p, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: refused from its size
    assert f"{MAX_CONFIG_BYTES + 1:,} bytes is too large for a model YAML" in _err(load_model, p).reason
