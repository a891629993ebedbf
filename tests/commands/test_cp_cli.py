"""`k3sim cp`: JSON keys, the 42 MiB fact through the CLI, sweep outputs, and bad input -> exit 2."""

from __future__ import annotations

import json

import pytest

BASE = ["cp", "--model", "models/kimi-k3.yaml", "--hardware", "h200"]


def run_json(cli, *args):
    proc = cli(*BASE, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cp_json_keys_and_kcp_bytes(cli):
    out = run_json(cli, "--seq-len", "1048576", "--cp", "8", "--strategy", "kcp", "--state-dtype", "bf16")
    for key in ("kda_layer_recv_bytes_per_rank", "mla_layer_recv_bytes_per_rank", "step_attention_time_s",
                "breakdown", "kda", "mla", "link"):
        assert key in out
    halo = 3 * 96 * 384 * 2                              # 3 conv rows of q, k, v
    assert out["kda_layer_recv_bytes_per_rank"] == 42 * 2 ** 20 + halo
    assert out["kda_layer_state_recv_bytes_per_rank"] == 42 * 2 ** 20
    assert out["mla_strategy"] == "allgather-kv" and out["mla_kv"] == "latent"
    assert out["step_attention_time_s"] > 0
    assert out["step_attention_time_s"] == pytest.approx(69 * out["kda_layer_time_s"] + 24 * out["mla_layer_time_s"],
                                                         rel=1e-12)
    short = run_json(cli, "--seq-len", "32K", "--cp", "8", "--state-dtype", "bf16")
    assert short["kda_layer_recv_bytes_per_rank"] == out["kda_layer_recv_bytes_per_rank"]


def test_cp_default_state_is_fla_fp32_and_mla_expanded(cli):
    out = run_json(cli, "--seq-len", "65536", "--cp", "4", "--mla-strategy", "ring", "--mla-kv", "expanded")
    assert out["state_dtype"] == "fp32"
    assert out["mla_layer_recv_bytes_per_rank"] == 3 * 16384 * 30720 * 2


def test_cp_table_output(cli):
    proc = cli(*BASE, "--seq-len", "65536", "--cp", "4", "--docs", "16", "--state-dtype", "bf16")
    assert proc.returncode == 0, proc.stderr
    assert "breakdown" in proc.stdout
    assert "18.00 MiB" in proc.stdout                    # 3 x 96 x 128 x 256 x 2 B of [S~|M] fragments
    assert "18.21 MiB" in proc.stdout                    # + 3 x 96 x 384 x 2 B conv halo
    assert "fold: 0 steps" in proc.stdout                # 16 docs of 4K: every rank edge is a doc edge
    assert "(69 KDA + 24 MLA)" in proc.stdout


def test_cp_sweep_writes_plot_and_table(cli, tmp_path):
    proc = cli(*BASE, "--sweep", "--seq-lens", "8K,32K,128K", "--cps", "4,8,16", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    for f in ("crossover.png", "crossover_p16.png", "sweep.csv", "intra_device.png", "summary.md",
              "published_h800.json"):
        assert (tmp_path / f).stat().st_size > 0, f
    assert res["facts"]["kcp_bf16_P8_S1048576_recv_bytes_per_rank"] == 42 * 2 ** 20


@pytest.mark.parametrize("args,needle", [
    (["--seq-len", "0"], "positive"),
    (["--seq-len", "1000", "--cp", "3"], "does not divide"),
    (["--seq-len", "24", "--cp", "8", "--mla-strategy", "zigzag-ring"], "2P = 16"),
    (["--seq-len", "65536", "--cp", "16", "--tp", "8", "--strategy", "ulysses"], "P <= heads"),
    (["--seq-len", "65536", "--strategy", "ring"], "does not apply to KDA"),
    (["--seq-len", "65536", "--mla-strategy", "kcp"], "does not apply to MLA"),
    (["--seq-len", "65536", "--state-dtype", "fp8"], "bf16 or fp32"),
    (["--seq-len", "lots"], "not a token count"),
    (["--seq-len", "65536", "--docs", "4", "--doc-mean-tokens", "1000"], "not both"),
    (["--seq-len", "65536", "--tp", "5"], "does not divide"),
    (["--seq-len", "65536", "--tp", "0"], "at least 1"),
    (["--seq-len", "-5"], "positive"),
    (["--seq-len", "abc"], "not a token count"),
    (["--seq-len", "inf"], "not a token count"),
    (["--seq-len", "nan"], "not a token count"),
    (["--seq-len", "0", "--doc-mean-tokens", "100"], "positive"),
    (["--sweep", "--seq-lens", "4K", "--cps", "2", "--cp", "4", "--out", "/tmp/k3sim-never"], "not among"),
    (["--sweep", "--docs", "4", "--out", "/tmp/k3sim-never"], "one document"),
    (["--sweep", "--strategy", "ulysses", "--out", "/tmp/k3sim-never"], "drop --strategy"),
    (["--sweep", "--state-dtype", "fp64", "--out", "/tmp/k3sim-never"], "bf16 or fp32"),
    (["--sweep", "--seq-len", "64K", "--mla-kv", "expanded", "--out", "/tmp/k3sim-never"], "drop --seq-len, --mla-kv"),
    (["--sweep", "--seq-lens", "-4K", "--cps", "2", "--cp", "2", "--out", "/tmp/k3sim-never"], "positive"),
    # an empty value is bad input, not the default
    (["--seq-len", ""], "--seq-len: not a token count: ''"),
    (["--seq-len", "65536", "--strategy", ""], "--strategy: unknown strategy ''"),
    (["--seq-len", "65536", "--mla-strategy", ""], "--mla-strategy: unknown strategy ''"),
    (["--seq-len", "65536", "--mla-kv", ""], "--mla-kv: MLA KV form"),
    (["--seq-len", "65536", "--state-dtype", ""], "--state-dtype: state dtype must be bf16 or fp32, got ''"),
    # beyond int64 (was a numpy traceback), a negative seed (was a numpy traceback)
    (["--seq-len", "1e30"], "--seq-len: token count out of range"),
    (["--sweep", "--seq-lens", "1e30", "--cps", "8", "--out", "/tmp/k3sim-never"],
     "--seq-lens: token count out of range"),
    (["--seq-len", "65536", "--doc-mean-tokens", "100", "--seed", "-1"], "--seed: seed must be a non-negative"),
    # the message names the option
    (["--seq-len", "65536", "--docs", "0"], "--docs: docs must be between 1"),
    (["--seq-len", "65536", "--doc-mean-tokens", "nan"], "--doc-mean-tokens: mean document length"),
    (["--seq-len", "65536", "--tp", "5"], "--tp: tp=5 does not divide the 96 KDA heads"),
])
def test_cp_bad_input_exits_2(cli, args, needle):
    proc = cli(*BASE, *args)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cp_sweep_bad_out_exits_2_and_writes_nothing(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = cli(*BASE, "--sweep", "--seq-lens", "8K", "--cps", "8", "--out", str(blocker / "sub"))
    assert proc.returncode == 2 and "--out" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
