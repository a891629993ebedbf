"""`k3sim decode`: JSON keys, sweep outputs, and bad input (one line naming the option, exit 2)."""

import json

import pytest

from tests.conftest import run_cli

KEYS = {"expected_distinct_experts_per_layer", "bytes_per_step_per_gpu", "tpot_s", "tokens_per_s_per_gpu",
        "limiter", "breakdown"}


def test_decode_json_answers_the_issue_keys():
    p = run_cli("decode", "--model", "models/kimi-k3.yaml", "--hardware", "h200", "--batch", "64", "--tp", "8",
                "--pp", "2", "--ep", "8", "--context", "32768", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert KEYS <= set(d)
    assert d["expected_distinct_experts_per_layer"] == pytest.approx(613.2, abs=0.5)
    row = d["breakdown"][0]
    assert {"component", "bytes", "flops", "seconds", "source"} <= set(row)
    # the breakdown composes the step: its critical-path seconds sum to the step
    assert sum(r["seconds"] for r in d["breakdown"]) == pytest.approx(d["step_s"], rel=1e-9)


def test_decode_mtp_json():
    p = run_cli("decode", "--batch", "16", "--mtp", "2", "--acceptance", "0.8", "--rollback", "snapshot", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["speculative"]["tokens_per_step"] == pytest.approx(1 + 0.8 + 0.64)


def test_sweep_writes_table_and_plot(tmp_path):
    p = run_cli("decode", "--model", "models/kimi-linear-48b.yaml", "--tp", "1", "--pp", "1", "--ep", "1",
                "--context", "4096", "--sweep-batch", "--out", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (tmp_path / d["csv"].split("/")[-1]).exists() and (tmp_path / d["plot"].split("/")[-1]).exists()
    tps = [r["tokens_per_s_per_gpu"] for r in d["rows"]]
    assert tps[-1] > tps[0] * 10  # batching amortises the weights


@pytest.mark.parametrize("args, option", [
    (["--batch", "0"], "--batch"),
    (["--context", "2000000"], "--context"),
    (["--tp", "7"], "--tp"),
    (["--ep", "7"], "--ep"),
    (["--mtp", "2", "--acceptance", "1.5"], "--acceptance"),
    (["--mtp", "2", "--acceptance", "-0.1"], "--acceptance"),
    (["--rollback", "replay"], "--rollback"),
    (["--acceptance", "0.5"], "--acceptance"),
    (["--mtp", "2"], "--acceptance"),
    (["--mtp", "2", "--acceptance", "0.5", "--rollback", "undo"], "--rollback"),
    (["--mtp", "32", "--acceptance", "0.5"], "--mtp"),  # 2 x 32 + 1 tokens exceed the KDA kernel's 64
    (["--zipf", "nan"], "--zipf"),
    (["--expert-kernel", "magic"], "--expert-kernel"),
    (["--out", "somewhere"], "--out"),  # only --sweep-batch writes files
])
def test_bad_input_one_line_exit_2(args, option):
    p = run_cli("decode", *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0], p.stderr


def test_sweep_default_out_is_under_the_working_directory(tmp_path):
    """`--sweep-batch` without --out writes ./k3sim-out/decode/ (the README example wrote reports/decode)."""
    p = run_cli("decode", "--model", "models/kimi-linear-48b.yaml", "--tp", "1", "--pp", "1", "--ep", "1",
                "--context", "4096", "--sweep-batch", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["csv"] == "k3sim-out/decode/decode_kimi-linear-48b_tp1_pp1_ep1_ctx4096.csv"
    assert (tmp_path / "k3sim-out/decode/decode_kimi-linear-48b_tp1_pp1_ep1_ctx4096.png").is_file()


def test_sweep_out_that_is_a_file_is_one_line_and_nothing_written(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = run_cli("decode", "--model", "models/kimi-linear-48b.yaml", "--tp", "1", "--pp", "1", "--ep", "1",
                "--sweep-batch", "--out", str(f))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--out" in p.stderr
    assert f.read_text() == "x"


def test_uncalibrated_profile_says_how_much_is_a_datasheet_lower_bound():
    b200 = json.loads(run_cli("decode", "--hardware", "b200", "--batch", "8", "--json").stdout)
    h200 = json.loads(run_cli("decode", "--hardware", "h200", "--batch", "8", "--json").stdout)
    assert b200["datasheet_share_of_step"] == pytest.approx(1.0)
    assert h200["datasheet_share_of_step"] == 0.0
