"""The harness's CPU-side pieces: row-by-row CSV writing, provenance YAML, part validation, no-GPU error."""

from __future__ import annotations

import csv
import importlib.util

import pytest
import yaml

from k3sim.calibration import grids
from k3sim.calibration.records import OpWriter, write_provenance
from k3sim.calibration.timing import HEADROOM_MAX_S, HEADROOM_MIN_S, Timing, launch_headroom_s
from k3sim.errors import InputError


def test_rows_are_on_disk_before_the_writer_closes(tmp_path):
    w = OpWriter(tmp_path, "gemm_bf16", ["M", "N", "K"])
    w.ok({"M": 1, "N": 2, "K": 3}, Timing(1.5e-5, 1.4e-5, 1.6e-5, 25, 3.25e-5))
    # A run killed here must keep the row: read the file while the writer is still open.
    rows = list(csv.DictReader(open(tmp_path / "gemm_bf16.csv")))
    assert rows == [{"M": "1", "N": "2", "K": "3", "seconds": "1.5e-05", "seconds_p20": "1.4e-05",
                     "seconds_p80": "1.6e-05", "reps": "25", "status": "ok", "error": "", "host_s": "3.25e-05"}]
    w.failed({"M": 4, "N": 2, "K": 3}, RuntimeError("CUDA out of memory\nmore"))
    w.close()
    rows = list(csv.DictReader(open(tmp_path / "gemm_bf16.csv")))
    assert rows[1]["status"] == "failed" and rows[1]["seconds"] == ""
    assert rows[1]["error"] == "RuntimeError: CUDA out of memory more"


@pytest.mark.parametrize("host_s, expected", [
    (50e-6, 100e-6),             # twice the host's enqueue time
    (1e-6, HEADROOM_MIN_S),      # a cheap launch still gets the floor
    (0.1, HEADROOM_MAX_S),       # a slow host side is capped: its GPU work dwarfs the gap
    (float("nan"), HEADROOM_MIN_S),  # unknown (no warm-up call timed)
])
def test_launch_headroom_covers_the_host_enqueue_time(host_s, expected):
    assert launch_headroom_s(host_s) == pytest.approx(expected)


def test_a_second_writer_appends_without_a_second_header(tmp_path):
    for m in (1, 2):
        w = OpWriter(tmp_path, "hbm_copy", ["bytes"])
        w.ok({"bytes": m}, Timing(1.0, 1.0, 1.0, 5))
        w.close()
    lines = (tmp_path / "hbm_copy.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("bytes,seconds")


def test_extras_follow_the_timing_columns(tmp_path):
    w = OpWriter(tmp_path, "moe_grouped_bf16", ["B", "E", "K", "N", "topk"], ["distinct_experts"])
    w.ok(dict(B=8, E=896, K=3584, N=6144, topk=16), Timing(1e-3, 1e-3, 1e-3, 5), distinct_experts=122)
    w.close()
    header = (tmp_path / "moe_grouped_bf16.csv").read_text().splitlines()[0].split(",")
    assert header[-1] == "distinct_experts" and header[5] == "seconds"


def test_provenance_yaml_is_valid_yaml_with_quoted_strings(tmp_path):
    info = {"gpu_name": 'NVIDIA "H200"', "sm_count": 132, "command": "a: b --x 'y'"}
    write_provenance(tmp_path, info)
    assert yaml.safe_load((tmp_path / "provenance.yaml").read_text()) == info
    assert not (tmp_path / "provenance.yaml.tmp").exists()


def test_unknown_part_is_bad_input(tmp_path):
    from k3sim.calibration.runner import run_calibration

    with pytest.raises(InputError, match="unknown part"):
        run_calibration(tmp_path, ["gemm_bf16", "warp_drive"], "h200", 10)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="only meaningful without torch")
def test_no_torch_is_bad_input_and_writes_nothing(tmp_path):
    from k3sim.calibration.runner import run_calibration

    out = tmp_path / "run"
    with pytest.raises(InputError, match="PyTorch"):
        run_calibration(out, ["gemm_bf16"], "h200", 10)
    assert not out.exists()


def test_gemm_grid_holds_the_k3_layer_shapes_from_the_config():
    """The measured (N, K) pairs include K3's per-rank projections at TP8, derived from the model file."""
    from k3sim.configs import load_model

    m = load_model("models/kimi-k3.yaml")
    tp = 8
    kda_qkv = (3 * m.kda.num_heads * m.kda.head_dim_k // tp, m.hidden_size)
    latent_down = (m.moe.latent_width, m.hidden_size)
    expert_gate_up = (2 * m.moe.expert_ffn_width, m.moe.latent_width)
    expert_down = (m.moe.latent_width, m.moe.expert_ffn_width)
    for shape in (kda_qkv, latent_down, expert_gate_up, expert_down):
        assert shape in grids.GEMM_NK, shape
    assert m.kda.num_heads // tp in grids.KDA_HEADS and m.kda.num_heads in grids.KDA_HEADS


def test_multi_gpu_parts_on_one_gpu_fail_before_anything_is_written(tmp_path, monkeypatch):
    from k3sim.calibration import runner

    monkeypatch.setattr(runner, "_check_gpu", lambda: 1)
    out = tmp_path / "run"
    with pytest.raises(InputError, match="need at least 2 GPUs, found 1"):
        runner.run_calibration(out, ["gemm_bf16", "collectives"], "h200", 10)
    assert not out.exists()


def test_budget_for_a_part_not_run_is_bad_input(tmp_path):
    from k3sim.calibration.runner import run_calibration

    with pytest.raises(InputError, match=r"budgets given for parts not run: \['moe'\]"):
        run_calibration(tmp_path / "run", ["gemm_bf16"], "h200", 10, part_budgets_s={"moe": 5.0})


@pytest.mark.parametrize("argv, message", [
    (["--heads", "96,x"], "--heads: expected comma-separated positive integers"),
    (["--kcp-lengths", "0"], "--kcp-lengths: values must be positive"),
    (["--part-budgets", "kda_fwd"], "--part-budgets: expected PART=SECONDS"),
    (["--part-budgets", "hbm=nan"], "--part-budgets: budget must be a positive number"),
    (["--budget-s", "inf"], "--budget-s: must be a positive number"),
    (["--budget-s", "-1"], "--budget-s: must be a positive number"),
])
def test_harness_command_line_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    from k3sim.calibration.runner import main

    with pytest.raises(SystemExit) as ex:
        main(["--out", str(tmp_path / "run"), *argv])
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "run").exists()
