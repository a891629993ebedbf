"""`k3sim memory` through the real CLI: the interface the checks rely on, and bad input."""

from __future__ import annotations

import json

import pytest


SERVE = ["memory", "--model", "models/kimi-k3.yaml", "--hardware", "h200", "--mode", "serve",
         "--tp", "8", "--ep", "8", "--context", "131072"]


def test_serve_k3_tp8_pp2_ep8(cli):
    out = run_cli_json(cli, *SERVE, "--pp", "2")
    assert out["kda_state_bytes_per_request"] == 434110464
    assert out["mla_kv_bytes_per_token"] == 27648
    assert isinstance(out["per_gpu_bytes"], dict) and out["per_gpu_bytes"]["total"] <= 141e9
    assert isinstance(out["max_concurrent_requests"], int) and out["max_concurrent_requests"] >= 1
    # Worst stage = layers 48-93: 13 MLA layers (48, 52, ..., 92, 93) cache 576 bf16 values per token on
    # every TP rank; 33 KDA layers hold fp32 state 96 x 128 x 128 and bf16 conv state 3 x 96 x 384, / tp.
    per_req = 13 * 576 * 2 * 131072 + 33 * (96 * 128 * 128 * 4 + 3 * 96 * 384 * 2) // 8
    assert out["worst_stage"] == 1 and out["per_request_bytes_per_gpu"] == per_req == 1_989_798_912
    b = out["per_gpu_bytes"]
    fixed = sum(v for k, v in b.items() if k not in ("kv_cache_and_state", "total", "free"))
    assert out["max_concurrent_requests"] == (141_000_000_000 - fixed) // per_req
    assert b["kv_cache_and_state"] == out["max_concurrent_requests"] * per_req
    assert b["total"] == fixed + b["kv_cache_and_state"] and b["free"] == 141_000_000_000 - b["total"]


def test_serve_k3_pp1_does_not_fit(cli):
    proc = cli(*SERVE, "--pp", "1", "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "does not fit" in line and "180.8 GB" in line


def test_hf_model_and_hardware_path(cli):
    out = run_cli_json(cli, "memory", "--model", "tests/data/hf/kimi-k3/config.json",
                       "--hardware", "hardware_profiles/b200.yaml", "--tp", "8", "--pp", "2", "--ep", "8")
    assert out["hardware"] == "b200" and out["mla_kv_bytes_per_token"] == 27648


def test_train_mode_table(cli):
    proc = cli("memory", "--model", "models/kimi-linear-48b.yaml", "--mode", "train",
                   "--pp", "2", "--ep", "8", "--dp", "8", "--context", "8192")
    assert proc.returncode == 0, proc.stderr
    assert "optimizer_states" in proc.stdout and "activations" in proc.stdout


@pytest.mark.parametrize("args, words", [
    (["--tp", "5"], ["tp=5", "96 KDA heads"]),
    (["--pp", "200"], ["pp", "93 layers"]),
    (["--tp", "0"], ["tp", "greater than or equal to 1"]),
    (["--mode", "fly"], ["--mode", "serve or train"]),
    (["--hardware", "h300"], ["h300", "unknown hardware"]),
    # A layout error names the option it came from.
    (["--tp", "7", "--pp", "2", "--ep", "8"], ["--tp: tp=7", "96 KDA heads"]),
    (["--tp", "1", "--dp", "3", "--ep", "3", "--pp", "2"], ["--ep: ep=3", "896 routed experts"]),
    (["--tp", "8", "--ep", "8", "--pp", "4", "--virtual-stages", "30"], ["--pp:", "120", "93 layers"]),
    (["--zero-stage", "5"], ["--zero-stage:", "0, 1, 2 or 3"]),
    (["--dp", "0"], ["--dp:", "greater than or equal to 1"]),
    (["--mode", "train", "--tp", "8", "--pp", "2", "--ep", "8", "--cp", "3", "--context", "131072"],
     ["--cp: cp=3 does not divide the 131072-token training sequence"]),
    # Workload options are checked by the Workload schema and named by option.
    (["--workspace-fraction", "nan"], ["--workspace-fraction:", "finite number"]),
    (["--workspace-fraction", "1"], ["--workspace-fraction:", "less than 1"]),
    (["--context", "-5"], ["--context:", "greater than or equal to 1"]),
    (["--prefill-chunk", "0"], ["--prefill-chunk:", "greater than or equal to 1"]),
    (["--mode", "train", "--micro-batch", "0"], ["--micro-batch:", "greater than or equal to 1"]),
])
def test_bad_input_one_line_exit_2(cli, args, words):
    proc = cli("memory", "--model", "models/kimi-k3.yaml", *args)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert all(w in err for w in words), err


def test_infinite_hbm_profile_one_line(cli, root, tmp_path):
    """An inf datasheet figure used to pass validation and crash the plan with OverflowError."""
    hw = tmp_path / "hw.yaml"
    text = (root / "hardware_profiles/h200.yaml").read_text()
    hw.write_text(text.replace("hbm_bytes: 141.0e+9", "hbm_bytes: .inf"))
    proc = cli(*SERVE, "--pp", "2", "--hardware", str(hw))
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert str(hw) in err and "field 'hbm_bytes'" in err and "finite" in err


def run_cli_json(cli, *args: str) -> dict:
    """tests/conftest.py's run_cli (the `cli` fixture) with --json, parsed."""
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
