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

