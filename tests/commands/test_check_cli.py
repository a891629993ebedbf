"""`k3sim check ...` (k3sim/commands/check.py) under the CLI contract: bad input is one line, exit 2, nothing
written; the subcommands reproduce the committed tables, calibration file and training report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import ROOT, assert_one_line, run_main  # noqa: E402

RUNS = ROOT / "hardware_profiles" / "measured" / "h200"
TRAIN_B = RUNS / "20261201-wholestep-train-b"
SERVE = RUNS / "20261201-wholestep-serve"
FIT_POINT = "kimi-linear-48b-l5-8:4096x1"


@pytest.mark.parametrize("argv, needle", [
    (["train-predict", "x.csv", "--points", "k3-tp8-ep8-l5-8:4096"], "--points"),
    (["train-predict", "x.csv", "--points", "nope:4096x1"], "--points"),
    (["fit-glue", "RUN", "out.yaml", "--points", "k3-tp8-ep8-l5-8:4096x1,k3-tp8-ep8-l5-8:4096x1"],
     "given twice"),
    (["train", "RUN"], "OUT_DIR"),
    (["train", "/nonexistent/run", "out"], "not found"),
])
def test_wholestep_train_entry_point_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, needle):
    argv = [str(tmp_path / a) if a in ("x.csv", "out.yaml", "out") else a for a in argv]
    argv = [str(TRAIN_B) if a == "RUN" else a for a in argv]
    assert_one_line(*run_main(capsys, "check", *argv), needle)
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("argv, needle", [
    (["decode", "/nonexistent/run", "out"], "decode_step.csv not found"),
    (["decode", str(TRAIN_B), "out"], "not a serving whole-step run directory"),  # a training run
    (["decode", str(SERVE), "out", "--predictions", "missing.csv"], "--predictions"),
    (["train", str(SERVE), "out"], "not a training whole-step run directory"),  # a serving run
    (["fit-glue", "/nonexistent/run", "out.yaml", "--points", FIT_POINT], "kernels.csv not found"),
    (["fit-glue", str(TRAIN_B), "out.yaml", "--points", "kimi-linear-48b-l5-8:1024x3"], "not profiled"),
    (["decode-predict", "x.csv", "--plan", "nope:decode=10"], "--plan"),
])
def test_a_wrong_run_or_input_is_one_line_naming_it_and_nothing_is_written(tmp_path, capsys, argv, needle):
    argv = [str(tmp_path / a) if a in ("x.csv", "out.yaml", "out", "missing.csv") else a for a in argv]
    assert_one_line(*run_main(capsys, "check", *argv), needle)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["train-predict", "DIR", "--points", FIT_POINT],
    ["decode-predict", "DIR", "--plan", "kimi-linear-48b:decode=10"],
    ["fit-glue", str(TRAIN_B), "DIR", "--points", FIT_POINT],
    ["train", str(TRAIN_B), "FILE"],
    ["train-report", "FILE"],
])
def test_an_output_path_k3sim_may_not_replace_is_refused(tmp_path, capsys, argv):
    (tmp_path / "DIR").mkdir()
    (tmp_path / "FILE").write_text("the user's\n")
    argv = [str(tmp_path / a) if a in ("DIR", "FILE") else a for a in argv]
    assert_one_line(*run_main(capsys, "check", *argv))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR", "FILE"] and not any((tmp_path / "DIR").iterdir())
    assert (tmp_path / "FILE").read_text() == "the user's\n"


def test_check_without_a_subcommand_prints_its_help(capsys):
    code, out, err = run_main(capsys, "check")
    assert code == 0 and err == "" and out.startswith("Usage: k3sim check")
    for sub in ("decode-predict", "decode", "train-predict", "train", "fit-glue", "train-report"):
        assert f"  {sub} " in out, sub


@pytest.mark.parametrize("run", ["20261201-wholestep-train-b", "20261201-wholestep-train-e"])
def test_check_train_writes_the_committed_tables_of_a_run(tmp_path, capsys, run):
    code, out, err = run_main(capsys, "check", "train", RUNS / run, tmp_path / "t")
    assert code == 0 and err == "" and "error_glue" in out
    for name in (f"check_{run}.csv", f"families_{run}.csv"):
        assert (tmp_path / "t" / name).read_text() == (ROOT / "reports" / "training" / name).read_text(), name


def test_check_decode_writes_the_committed_tables(tmp_path, capsys):
    code, out, err = run_main(capsys, "check", "decode", SERVE, tmp_path / "d")
    assert code == 0 and err == "" and "kimi-linear-48b" in out
    for name in ("wholestep_check.csv", "wholestep_families.csv"):
        assert (tmp_path / "d" / name).read_text() == (ROOT / "reports" / "decode" / name).read_text(), name


def test_fit_glue_writes_the_committed_factors_and_the_command_that_made_them(tmp_path, capsys):
    out = tmp_path / "glue.yaml"
    committed = yaml.safe_load((RUNS / "training_glue.yaml").read_text())
    runs = [RUNS / r for r in dict.fromkeys(committed["runs"].values())]  # several runs, in the order given
    points = ",".join(committed["points"])
    code, text, err = run_main(capsys, "check", "fit-glue", *runs, out, "--points", points)
    assert code == 0 and err == "" and text.startswith(f"pooled over {len(committed['per_config'])} configuration")
    doc = yaml.safe_load(out.read_text())
    assert {k: doc[k] for k in ("fwd", "bwd", "points", "runs", "per_config")} == \
        {k: committed[k] for k in ("fwd", "bwd", "points", "runs", "per_config")}
    assert doc["command"] == f"k3sim check fit-glue {' '.join(map(str, runs))} {out} --points {points}"


@pytest.mark.parametrize("flags, columns", [
    ([], ["predicted_s", "glue_s"]),
    (["--glue"], ["predicted_s", "glue_s"]),
    (["--both"], ["predicted_plain_s", "predicted_glue_s", "glue_s"]),
])
def test_train_predict_writes_one_row_per_point_and_phase(tmp_path, capsys, flags, columns):
    import pandas as pd

    out = tmp_path / "p.csv"
    code, text, err = run_main(capsys, "check", "train-predict", out, "--points",
                               "k3-tp8-ep8-l5-8:4096x1,kimi-linear-48b-l5-8:2048x2", *flags)
    assert code == 0 and err == ""
    df = pd.read_csv(out)
    assert len(df) == 4 and set(df.phase) == {"fwd", "fwd_bwd"}
    assert list(df.columns) == ["config", "seq", "micro_batch", "phase", *columns]
    assert ("glue calibration" in text) == ("--glue" in flags)


def test_train_report_regenerates_the_committed_report(tmp_path, capsys):
    # the committed README and figure are the generator's answer on the committed runs, byte for byte
    code, text, err = run_main(capsys, "check", "train-report", tmp_path / "r")
    assert code == 0 and err == ""
    committed = ROOT / "reports" / "training"
    assert (tmp_path / "r" / "README.md").read_text() == (committed / "README.md").read_text()
    assert (tmp_path / "r" / "wholestep_train.png").read_bytes() == (committed / "wholestep_train.png").read_bytes()
    assert text.strip() == (committed / "README.md").read_text().strip()
