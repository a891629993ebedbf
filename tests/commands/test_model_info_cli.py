"""`k3sim model-info` through the real CLI."""

from __future__ import annotations




def test_model_info_json_k3(cli_json, cli):
    info = cli_json("model-info", "--model", "models/kimi-k3.yaml")
    assert isinstance(info["total_params"], int) and isinstance(info["active_params"], int)
    assert abs(info["total_params"] / 2.8e12 - 1) < 0.03 and abs(info["active_params"] / 104e9 - 1) < 0.03
    assert info["layers"]["num_kda_layers"] == 69 and info["layers"]["num_mla_layers"] == 24
    assert info["mla_kv_bytes_per_token"] == 27648
    assert info["kda_state_bytes_per_request"] == 434110464
    assert {"routed_experts", "kda", "mla", "vision"} <= set(info["params_by_component"])


def test_model_info_hf_config_and_table(cli):
    proc = cli("model-info", "--model", "tests/data/hf/kimi-linear-48b/config.json")
    assert proc.returncode == 0, proc.stderr
    assert "kimi-linear-48b" in proc.stdout and "routed_experts" in proc.stdout
    # 20 KDA layers x 32 heads x 128 x 128 x 4 B = 40 MiB; 7 MLA layers x 576 x 2 B = 8064 B = 7.88 KiB;
    # conv 20 x 3 x 32 x 384 x 2 B = 1.41 MiB; pattern 3 KDA + 1 MLA six times, then 2 KDA + 1 MLA.
    assert "40.00 MiB" in proc.stdout and "7.88 KiB" in proc.stdout and "1.41 MiB" in proc.stdout
    assert "27 (20 / 7)" in proc.stdout


def test_model_info_bad_file(cli, tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("name: x\nhidden_size: 7168\nnum_layers: 2\nvocab_size: 10\ncolour: red\n")
    proc = cli("model-info", "--model", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert str(bad) in proc.stderr and "colour" in proc.stderr and "unknown field" in proc.stderr


def test_model_info_binary_file(cli, tmp_path):
    """A corrupt file (not UTF-8) is one line naming it, not a UnicodeDecodeError traceback."""
    bad = tmp_path / "model.safetensors.json"
    bad.write_bytes(b"\x00\xff\xfe\x89PNG\x00")
    proc = cli("model-info", "--model", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and str(bad) in err and "not a UTF-8 text file" in err


