"""`k3sim memory` through the real CLI: the interface the checks rely on, and bad input."""

from __future__ import annotations



import pytest


SERVE = ["memory", "--model", "models/kimi-k3.yaml", "--hardware", "h200", "--mode", "serve",
         "--tp", "8", "--ep", "8", "--context", "131072"]


def test_serve_k3_tp8_pp2_ep8(cli_json, cli):
    out = cli_json(*SERVE, "--pp", "2")
    assert out["kda_state_bytes_per_request"] == 434110464
    assert out["mla_kv_bytes_per_token"] == 27648
    assert isinstance(out["per_gpu_bytes"], dict) and out["per_gpu_bytes"]["total"] <= 150_109_880_320
    assert isinstance(out["max_concurrent_requests"], int) and out["max_concurrent_requests"] >= 1
    # Worst stage = layers 48-93: 13 MLA layers (48, 52, ..., 92, 93) cache 576 bf16 values per token on
    # every TP rank; 33 KDA layers hold fp32 state 96 x 128 x 128 and bf16 conv state 3 x 96 x 384, / tp.
    per_req = 13 * 576 * 2 * 131072 + 33 * (96 * 128 * 128 * 4 + 3 * 96 * 384 * 2) // 8
    assert out["worst_stage"] == 1 and out["per_request_bytes_per_gpu"] == per_req == 1_989_798_912
    b = out["per_gpu_bytes"]
    fixed = sum(v for k, v in b.items() if k not in ("kv_cache_and_state", "total", "free"))
    assert out["max_concurrent_requests"] == (150_109_880_320 - fixed) // per_req
    assert b["kv_cache_and_state"] == out["max_concurrent_requests"] * per_req
    assert b["total"] == fixed + b["kv_cache_and_state"] and b["free"] == 150_109_880_320 - b["total"]


def test_serve_k3_pp1_does_not_fit(cli):
    proc = cli(*SERVE, "--pp", "1", "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "does not fit" in line and "180.8 GB" in line


def test_hf_model_and_hardware_path(cli_json, cli):
    out = cli_json("memory", "--model", "tests/data/hf/kimi-k3/config.json",
                       "--hardware", "hardware_profiles/b200.yaml", "--tp", "8", "--pp", "2", "--ep", "8")
    assert out["hardware"] == "b200" and out["mla_kv_bytes_per_token"] == 27648


def test_train_mode_state_bytes_by_hand(cli_json):
    """Kimi-Linear 48B, pp 2, ep 8, dp 8, worst stage: 949,321,120 non-expert + 2,944,401,408 expert
    params on the GPU. Weights bf16: 2 x 3,893,722,528 = 7,787,445,056 B; gradients fp32: 4 x that =
    15,574,890,112 B; ZeRO-1 optimizer (12 B/param) shards non-expert params over dp 8 and expert params
    over dp / ep = 1: 12 x (949,321,120 / 8 + 2,944,401,408) = 36,756,798,576 B; logits of 8192 tokens x
    163,840 vocab x fp32 = 5,368,709,120 B."""
    out = cli_json("memory", "--model", "models/kimi-linear-48b.yaml", "--mode", "train",
                       "--pp", "2", "--ep", "8", "--dp", "8", "--context", "8192")
    got = {r["component"]: r["bytes"] for r in out["breakdown"]}
    assert out["params_per_gpu"] == 949_321_120 + 2_944_401_408
    assert got["weights"] == 7_787_445_056 and got["gradients"] == 15_574_890_112
    assert got["optimizer_states"] == 36_756_798_576 and got["logits"] == 5_368_709_120


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
    # serving past the model's max_position_embeddings (K3: 1,048,576) is refused, not planned
    (["--tp", "8", "--pp", "2", "--ep", "8", "--context", "1048577"],
     ["--context: 1,048,577 tokens exceeds the 1,048,576 the model supports"]),
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
    hw.write_text(text.replace("hbm_bytes: 150109880320", "hbm_bytes: .inf"))
    proc = cli(*SERVE, "--pp", "2", "--hardware", str(hw))
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert str(hw) in err and "field 'hbm_bytes'" in err and "finite" in err




def test_help_defaults_are_the_schemas(cli):
    """The options left unset fall back to the Workload/Parallelism schema defaults, so --help must show
    those (it showed hand-typed copies): 8192-token prefill chunks, 1 sequence, ZeRO-1, 10 % workspace."""
    from k3sim.configs import Parallelism, Workload

    proc = cli("memory", "--help")
    text = " ".join(proc.stdout.split())
    wf = Workload.model_fields
    for option, value in (("--prefill-chunk", wf["prefill_chunk_tokens"].default),
                          ("--micro-batch", wf["micro_batch_size"].default),
                          ("--zero-stage", Parallelism.model_fields["zero_stage"].default),
                          ("--workspace-fraction", wf["workspace_fraction"].default)):
        after = text.split(option, 1)[1]
        assert f"[default: {value}]" in after[: after.find("]") + 1], (option, after[:120])
    assert (wf["prefill_chunk_tokens"].default, wf["workspace_fraction"].default) == (8192, 0.10)
