"""`k3sim sweep`: a small training grid end to end, and its bad input (one line, exit 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "planner"))
from conftest_helpers import kl_train  # noqa: E402


def test_sweep_small_grid(cli, tmp_path):
    path = kl_train(tmp_path)
    out = tmp_path / "o"
    proc = cli("sweep", str(path), "--out", str(out), "--tp", "1,2", "--pp", "1,2", "--ep", "8", "--cp", "1",
               "--virtual", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["points"] == 4 and res["ok"] == 4 and res["errors"] == 0
    assert res["pareto"] and all(p["fits"] for p in res["pareto"])
    import pandas as pd

    df = pd.read_parquet(out / "sweep.parquet")
    assert list(df["index"]) == [0, 1, 2, 3]
    assert {"step_time_s", "tokens_per_s_per_gpu", "mfu", "status", "error"} <= set(df.columns)


@pytest.mark.parametrize("args, words", [
    (["--tp", "0"], ["--tp", "positive integers"]),
    (["--tp", "32"], ["sweep grid is empty"]),
    (["--scheduler", "localhost:8786"], ["--scheduler", "tcp://HOST:PORT"]),
    (["--workers", "0"], ["--workers", "at least 1"]),  # k3sim.configs.bounds BOUNDS["workers"]
])
def test_sweep_bad_input(cli, tmp_path, args, words):
    path = kl_train(tmp_path)
    proc = cli("sweep", str(path), "--out", str(tmp_path / "o"), *args)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and all(w in err for w in words), err
    assert not (tmp_path / "o").exists()


def test_sweep_prefill_split_beyond_the_fleet_refused(cli, root, tmp_path):
    # the default scenario serves with one replica: no P:D split exists (was 3 rows of -4 decode replicas, exit 0)
    proc = cli("sweep", str(root / "scenarios/default.yaml"), "--out", str(tmp_path / "o"), "--prefill-replicas", "5")
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "--prefill-replicas" in err and "one replica" in err, err
    assert not (tmp_path / "o").exists()



def test_sweep_keeps_tokens_per_step_and_counts_skipped_points(cli, tmp_path):
    """--micro-batches 2,4 at the scenario's 16 sequences per step: at tp2 pp2 (dp 4) micro-batches of 2 and 1
    sequences; at tp2 pp4 (dp 2) 4 micro-batches of 2 sequences, while 2 micro-batches are fewer than the 4
    pipeline ranks: skipped and counted. Every point trains 16 x 4096 = 65,536 tokens per step."""
    out = tmp_path / "o"
    proc = cli("sweep", str(kl_train(tmp_path)), "--out", str(out), "--tp", "2", "--pp", "2,4", "--ep", "8",
               "--cp", "1", "--virtual", "1", "--micro-batches", "2,4", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["points"] == 3 and res["skipped"] == {"micro-batches the pipeline schedule cannot run": 1}
    import pandas as pd

    df = pd.read_parquet(out / "sweep.parquet")
    assert list(zip(df["pp"], df["num_micro_batches"], df["micro_batch_size"])) == [(2, 2, 2), (2, 4, 1), (4, 4, 2)]
    assert set(df["tokens_per_step"]) == {65_536} and set(df["global_batch_sequences"]) == {16}
    assert all("tokens_per_step" in p and "global_batch_sequences" in p for p in res["pareto"])
    assert json.loads((out / "sweep.json").read_text())["skipped"] == res["skipped"]
    proc = cli("sweep", str(kl_train(tmp_path)), "--out", str(out), "--tp", "2", "--pp", "2", "--ep", "8",
               "--cp", "1", "--virtual", "1", "--global-batch", "16,32")
    assert proc.returncode == 0, proc.stderr
    assert "one front per global" in proc.stdout and "131,072" in proc.stdout and "65,536" in proc.stdout
