"""Hostile config files: each is refused in one line naming the file and field, exit 2, fast, and nothing is
written. Cases from issue 11 ("Found") and more of the same kinds."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from hostile_helpers import ROOT, assert_one_line, run_main

K3 = ROOT / "models" / "kimi-k3.yaml"


def _model(tmp_path, **edits):
    data = yaml.safe_load(K3.read_text())
    for path, value in edits.items():
        node = data
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("edits, field, words", [
    ({"num_layers": 1_000_000}, "num_layers", "10000"),           # ran > 10 min (quadratic); now bounded
    ({"vocab_size": 10 ** 30}, "vocab_size", "10000000"),          # printed an absurd plan
    ({"hidden_size": True}, "hidden_size", "booleans are not numbers"),
    ({"kda__num_heads": 10 ** 9}, "kda.num_heads", "4096"),
    ({"moe__num_routed_experts": 10 ** 7}, "moe.num_routed_experts", "65536"),
    ({"moe__expert_ffn_width": 0}, "moe.expert_ffn_width", "greater than or equal to 1"),
    ({"mla__kv_lora_rank": 2 ** 40}, "mla.kv_lora_rank", "1048576"),
])
def test_model_numbers_out_of_range(tmp_path, capsys, edits, field, words):
    p = _model(tmp_path, **edits)
    line = assert_one_line(*run_main(capsys, "model-info", "--model", p), str(p), f"field '{field}'", words)
    assert len(line) < 300


def test_ten_thousand_layers_load_and_count_in_under_a_second(tmp_path):
    """The per-layer parameter count rebuilt the layer-kind list on every call (time ~ layers^2)."""
    from k3sim.configs import load_model
    from k3sim.memory.params import count_params

    p = _model(tmp_path, num_layers=10_000)
    t0 = time.perf_counter()
    m = load_model(p)
    report = count_params(m)
    elapsed = time.perf_counter() - t0
    assert elapsed < 30, elapsed  # a hang guard: quadratic in layers took minutes; speed is a benchmark's
    # K3's full_attn_layers name 24 layers (all <= 93); every other layer of the 10,000 is KDA
    assert m.num_mla_layers == 24 and m.num_kda_layers == 10_000 - 24
    # per-layer sizes do not depend on depth: KDA params per KDA layer equal the 93-layer model's
    k3 = count_params(load_model(K3)).by_component()["kda"]["total"]
    assert report.by_component()["kda"]["total"] * 69 == k3 * 9976


def test_yaml_alias_bomb_refused_at_once_with_a_short_line(tmp_path, capsys):
    """Refused only after 65 s and 11 GB before; a smaller one echoed a 3.85 MB error line."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 12):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\nname: x\n")
    t0 = time.perf_counter()
    line = assert_one_line(*run_main(capsys, "model-info", "--model", p), str(p), "line 2", "aliases")
    assert time.perf_counter() - t0 < 30 and len(line) < 200  # a hang guard: it ran 65 s at 11 GB before


def test_unknown_hf_quantization_is_refused_with_the_known_list(tmp_path, capsys):
    """An AWQ 3-bit config was read as bf16 (5.56 TB instead of ~1.56 TB) without a word."""
    cfg = json.loads((ROOT / "tests/data/hf/kimi-k3/config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 3, "group_size": 128}
    cfg.get("text_config", {}).pop("quantization_config", None)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert_one_line(*run_main(capsys, "model-info", "--model", p), "field 'quantization_config'",
                    "unknown quantization scheme 'awq'", "compressed-tensors format mxfp4-pack-quantized", "fp8")


def _hardware(tmp_path, **edits):
    data = yaml.safe_load((ROOT / "hardware_profiles" / "h200.yaml").read_text())
    data.update(edits)
    p = tmp_path / "hw.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("edits, field, words", [
    ({"hbm_bytes": 1.0e30}, "hbm_bytes", "less than or equal"),            # printed an absurd plan
    ({"hbm_bandwidth_bytes_per_s": float("nan")}, "hbm_bandwidth_bytes_per_s", "finite"),
    ({"scaleup_domain_gpus": True}, "scaleup_domain_gpus", "booleans are not numbers"),
    ({"calibration_dir": "measured/no-such-run"}, "calibration_dir", "not a directory"),  # was exit 0
])
def test_hardware_profile_fields(tmp_path, capsys, edits, field, words):
    p = _hardware(tmp_path, **edits)
    assert_one_line(*run_main(capsys, "memory", "--model", K3, "--hardware", p, "--tp", "8", "--pp", "2",
                              "--ep", "8"), str(p), f"field '{field}'", words)


def test_missing_calibration_dir_is_an_error_for_kernel_times_too(tmp_path, capsys):
    """A profile whose calibration_dir is missing gave a datasheet time with exit 0."""
    p = _hardware(tmp_path, calibration_dir="measured/typo")
    assert_one_line(*run_main(capsys, "kernel-time", "gemm_bf16", "--hardware", p, "--set", "M=64",
                              "--set", "N=64", "--set", "K=64"), "calibration_dir", "measured/typo")


def _scenario(tmp_path, **sections):
    data = yaml.safe_load((ROOT / "scenarios" / "default.yaml").read_text())
    data["model"] = str(K3)
    for key, value in sections.items():
        section, _, field = key.partition("__")
        if value is None:
            data[section].pop(field)
        else:
            data[section][field] = value
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("edits, field, words", [
    ({"parallelism__tp": True}, "parallelism.tp", "booleans are not numbers"),     # was read as tp = 1
    ({"cluster__gpus_per_node": 3}, "cluster.gpus_per_node", "8-GPU NVLink domain"),  # was ignored
    ({"parallelism__tp": 16, "cluster__num_gpus": 32}, "parallelism.tp", "NVLink domain"),
    ({"workload__micro_batch_size": 4}, "workload.micro_batch_size", "mode train only"),  # was ignored
    ({"parallelism__zero_stage": 3}, "parallelism.zero_stage", "no effect in mode serve"),
    ({"workload__context_tokens": 10 ** 15}, "workload.context_tokens", "less than or equal"),
    ({"cluster__num_gpus": 10 ** 12}, "cluster.num_gpus", "less than or equal"),
])
def test_scenario_fields(tmp_path, capsys, edits, field, words):
    p = _scenario(tmp_path, **edits)
    out_dir = tmp_path / "report"
    assert_one_line(*run_main(capsys, "plan", "--scenario", p, "--out", out_dir), str(p), f"field '{field}'",
                    words)
    assert not out_dir.exists()


def test_fp8_training_on_a_profile_without_fp8_is_refused_naming_the_field(tmp_path, capsys):
    """`training.precision: fp8` on a GPU profile with no fp8 peak (issue 22, bad input): one line naming the
    scenario and the field, with the fix, exit 2, before any step is priced and nothing written."""
    hw = _hardware(tmp_path, name="h200-no-fp8", peak_flops_per_s={"bf16": 989.0e12, "fp16": 989.0e12})
    text = (ROOT / "scenarios" / "k3-h200-train-32k.yaml").read_text()
    text = text.replace("../models/kimi-k3.yaml", str(K3)).replace("hardware: h200", f"hardware: {hw}")
    p = tmp_path / "s.yaml"
    p.write_text(text.replace("workload:", "training: {precision: fp8}\nworkload:", 1))
    out_dir = tmp_path / "report"
    t0 = time.perf_counter()
    assert_one_line(*run_main(capsys, "plan", "--scenario", p, "--out", out_dir), str(p), "field 'training.precision'",
                    "h200-no-fp8", "training.precision: bf16")
    assert time.perf_counter() - t0 < 30 and not out_dir.exists()  # a hang guard: refused before any pricing


@pytest.mark.parametrize("model, training, words", [
    # DeepSeek-V3 has no KDA layers (issue 22, bad input: a recompute module the model does not have)
    ("deepseek-v3.yaml", "{recompute: selective, recompute_modules: [norms, kda_core]}", "has none; remove it"),
    # modules act only under selective recompute (the workload's checkpointing makes it full)
    ("kimi-k3.yaml", "{recompute_modules: [norms]}", "set training.recompute: selective"),
])
def test_recompute_modules_refused_naming_the_field(tmp_path, capsys, model, training, words):
    text = (ROOT / "scenarios" / "k3-h200-train-32k.yaml").read_text()
    text = text.replace("../models/kimi-k3.yaml", str(ROOT / "models" / model))
    p = tmp_path / "s.yaml"
    p.write_text(text.replace("workload:", f"training: {training}\nworkload:", 1))
    out_dir = tmp_path / "report"
    assert_one_line(*run_main(capsys, "plan", "--scenario", p, "--out", out_dir), str(p),
                    "field 'training.recompute_modules'", words)
    assert not out_dir.exists()


@pytest.mark.parametrize("edits, field, words", [
    # DualPipe's two directions meet in the middle: an even pp (deepseek-ai/DualPipe asserts num_ranks % 2 == 0)
    ((("pp: 16", "pp: 15"), ("virtual_stages: 2", "virtual_stages: 1"), ("num_gpus: 8192", "num_gpus: 7680")),
     "training.pipeline_schedule", "even number"),
    # and at least 2 x pp micro-batches (its num_chunks >= num_ranks * 2)
    ((("virtual_stages: 2", "virtual_stages: 1"), ("activation_checkpointing: true",
                                                   "activation_checkpointing: true\n  num_micro_batches: 16")),
     "num_micro_batches", "at least 2 x pp = 32"),
])
def test_dualpipe_with_an_odd_pp_or_too_few_micro_batches_is_one_line(tmp_path, capsys, edits, field, words):
    """Issue 22, bad input: DualPipe with an odd PP or too few micro-batches: one line naming the field, exit 2,
    nothing written."""
    text = (ROOT / "scenarios" / "k3-h200-train-32k.yaml").read_text().replace("../models/kimi-k3.yaml", str(K3))
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    p = tmp_path / "s.yaml"
    p.write_text(text.replace("workload:", "training: {pipeline_schedule: dualpipe}\nworkload:", 1))
    out_dir = tmp_path / "report"
    assert_one_line(*run_main(capsys, "plan", "--scenario", p, "--out", out_dir), str(p), f"field '{field}'", words)
    assert not out_dir.exists()


def test_a_directory_given_as_a_file_says_so(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    assert_one_line(*run_main(capsys, "model-info", "--model", tmp_path / "d"), "is a directory")


def test_an_oversized_echo_is_cut(tmp_path, capsys):
    """Error lines stay short whatever the input echoed (the CLI caps them at 300 characters)."""
    name = "x" * 20_000
    line = assert_one_line(*run_main(capsys, "memory", "--model", K3, "--hardware", name), "unknown hardware")
    assert len(line) <= 300 and "x…: unknown hardware profile" in line


def test_one_cutter_for_every_echo():
    """`k3sim.errors.shorten` is the single cutter behind InputError, config, trace and CLI echoes."""
    from k3sim.cli import one_line
    from k3sim.errors import InputError, shorten

    assert shorten("abcdef", 6) == "abcdef" and shorten("abcdefg", 6) == "abcde…"
    assert one_line("a\n  b\tc", 300) == "a b c" and one_line("x" * 400) == "x" * 299 + "…"
    assert str(InputError("bad", source="p" * 500, field="f")) == "p" * 119 + "…: field 'f': bad"
