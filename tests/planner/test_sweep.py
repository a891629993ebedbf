"""Sweep: the grid, failed points kept, Pareto front, and identical rows serial / local processes / Dask."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest_helpers import kl_train  # noqa: E402

from k3sim.errors import InputError  # noqa: E402
from k3sim.planner.inputs import load  # noqa: E402
from k3sim.planner.sweep import grid, pareto_front, run_points, sweep  # noqa: E402
from k3sim.report.sweep import write_sweep  # noqa: E402


def test_grid_fills_cluster_and_keeps_global_batch(tmp_path):
    inp = load(kl_train(tmp_path))
    pts = grid(inp, {"tp": [1, 2], "pp": [1, 2], "ep": [8], "cp": [1], "virtual_stages": [1]})
    # scenario: 4 micro-batches x dp 4 x 1 sequence = 16 sequences per step
    assert len(pts) == 4
    for p in pts:
        assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == 16
        assert p["num_micro_batches"] * p["dp"] == 16
    assert [p["index"] for p in pts] == [0, 1, 2, 3]


def test_empty_grid_refused(tmp_path):
    inp = load(kl_train(tmp_path))
    with pytest.raises(InputError, match="sweep grid is empty"):
        grid(inp, {"tp": [32], "pp": [1]})  # 32 GPUs of TP alone exceed the 16-GPU cluster


def test_failed_points_are_rows_with_their_error(tmp_path):
    path = kl_train(tmp_path)
    # ep=7 divides neither the 256 experts nor the stage; v=2 with m not a multiple of pp
    pts = [{"index": 0, "tp": 2, "pp": 2, "virtual_stages": 1, "ep": 7, "cp": 1, "dp": 4, "num_micro_batches": 4},
           {"index": 1, "tp": 2, "pp": 2, "virtual_stages": 2, "ep": 8, "cp": 1, "dp": 4, "num_micro_batches": 3},
           {"index": 2, "tp": 2, "pp": 2, "virtual_stages": 1, "ep": 8, "cp": 1, "dp": 4, "num_micro_batches": 4}]
    rows = run_points(path, pts)
    assert [r["status"] for r in rows] == ["error", "error", "ok"]
    assert "ep=7 does not divide" in rows[0]["error"]
    assert "multiple of pp=2" in rows[1]["error"]
    assert rows[2]["step_time_s"] > 0 and rows[2]["fits"] in (True, False)


def test_pareto_front_by_hand():
    df = pd.DataFrame({"step_time_s": [1.0, 2.0, 3.0, 2.5, 1.0], "tokens_per_s_per_gpu": [10, 20, 15, 30, 5]})
    front = pareto_front(df, "step_time_s", "tokens_per_s_per_gpu")
    # (1, 10) beats (1, 5); (2, 20) beats (3, 15); (2.5, 30) is the fastest-per-GPU
    assert sorted(front.index.tolist()) == [0, 1, 3]


def test_same_rows_serial_processes_and_dask_cluster(tmp_path):
    from distributed import LocalCluster

    path = kl_train(tmp_path)
    pts = grid(load(path), {"tp": [1, 2], "pp": [1, 2], "ep": [1, 8], "cp": [1], "virtual_stages": [1]})
    serial = run_points(path, pts)
    procs = run_points(path, pts, workers=2, chunk_size=2)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as lc:
        dask = run_points(path, pts, scheduler=lc.scheduler_address, chunk_size=3)
    assert serial == procs == dask
    assert all(r["status"] == "ok" for r in serial)


def test_sweep_writes_parquet_and_front(tmp_path):
    path = kl_train(tmp_path)
    out = tmp_path / "out"
    res = sweep(path, given={"tp": [1, 2], "pp": [1, 2], "ep": [8], "cp": [1], "virtual_stages": [1]})
    assert not out.exists()  # the planner computes; the report writes
    write_sweep(res, out)
    back = pd.read_parquet(out / "sweep.parquet")
    assert len(back) == 4 and set(back["status"]) == {"ok"}
    assert (out / "pareto.png").stat().st_size > 0 and (out / "pareto.md").read_text().startswith("# Sweep")
    assert len(res.front) >= 1
    best = back[back["fits"]].sort_values("step_time_s").iloc[0]
    assert best["step_time_s"] == res.front["step_time_s"].min()


def test_serving_sweep_points_run_the_serving_simulation(root=None):
    from conftest_helpers import ROOT

    path = ROOT / "scenarios/k3-h200-serve-pd.yaml"
    inp = load(path)
    pts = grid(inp, {"max_batch": [8]})
    # 2 replicas: the scenario's own 1:1 split (0) and an explicit 1:1
    assert [(p["prefill_replicas"], p["decode_replicas"]) for p in pts] == [(0, 0), (1, 1)]
    rows = run_points(path, pts[:1], serving_requests=20)
    r = rows[0]
    assert r["status"] == "ok", r["error"]
    assert r["requests"] == 20 and r["gpus"] == 32
    assert r["goodput_requests_per_s_per_gpu"] == pytest.approx(r["goodput_requests_per_s"] / 32)
    assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]


def test_sweep_section_values_are_the_grid_and_unknown_fields_refused(tmp_path):
    # The scenario's sweep: section is the grid when no option overrides it: tp 1, 2 x pp 2 (dp fills 16 GPUs)
    path = kl_train(tmp_path, sweep="  tp: [1, 2]\n  pp: [2]\n  ep: [8]\n  cp: [1]\n  virtual_stages: [1]")
    inp = load(path)
    pts = grid(inp, {k: v for k, v in inp.sweep.model_dump().items() if v is not None})
    assert [(p["tp"], p["pp"], p["dp"]) for p in pts] == [(1, 2, 8), (2, 2, 4)]
    # A field the sweep does not honour is refused, not silently ignored (the old use_all_gpus was)
    bad = kl_train(tmp_path, sweep="  use_all_gpus: false")
    with pytest.raises(InputError) as err:
        load(bad)
    assert "use_all_gpus" in str(err.value)


# ------------------------------------------------------------------------------------------ the global batch
def test_named_micro_batches_keep_the_global_batch_and_set_the_micro_batch_size(tmp_path):
    """The scenario's 16 sequences per step (dp 4 x 4 micro-batches x 1): at tp2 pp2 (dp 4) 2 micro-batches
    are 2 sequences each, 4 are 1; 8 would be half a sequence, so the value is refused with the reason."""
    inp = load(kl_train(tmp_path))
    base = {"tp": [2], "pp": [2], "ep": [8], "cp": [1], "virtual_stages": [1]}
    pts = grid(inp, {**base, "num_micro_batches": [2, 4]})
    assert [(p["num_micro_batches"], p["micro_batch_size"], p["global_batch_sequences"]) for p in pts] == \
        [(2, 2, 16), (4, 1, 16)]
    with pytest.raises(InputError) as err:
        grid(inp, {**base, "num_micro_batches": [4, 8]})
    assert err.value.source == "--micro-batches" and "16 sequences is not divisible by dp x micro-batches = 4 x 8" \
        in str(err.value)


def test_micro_batches_below_the_pipeline_are_skipped_and_counted(tmp_path):
    from collections import Counter

    from k3sim.planner.sweep import SKIP_DIVIDE, SKIP_PIPELINE, SKIP_VIRTUAL, pipeline_shortfall

    assert pipeline_shortfall(4, 1, 4) is None and pipeline_shortfall(4, 2, 8) is None
    assert "fewer than the pp=4" in pipeline_shortfall(4, 1, 3)
    assert "multiples of pp=4" in pipeline_shortfall(4, 2, 6)
    inp = load(kl_train(tmp_path))
    skipped: Counter = Counter()
    lists = {"tp": [1, 2], "pp": [1, 2, 8], "virtual_stages": [1, 2], "ep": [8], "cp": [1]}
    pts = grid(inp, lists, skipped)
    # 2 x 3 x 2 = 12 combinations: pp1 v2 (2) have no pipeline; on 16 GPUs pp8 leaves dp 2 (tp1: m 8, fine for
    # v1 and v2) or dp 1 (tp2: m 16, fine); tp2 pp2 -> dp 4, m 4; tp1 pp2 -> dp 8, m 2 (v2: 2 % 2 = 0, fine)
    assert skipped[SKIP_VIRTUAL] == 2 and sum(skipped.values()) + len(pts) == 12
    assert all(p["num_micro_batches"] * p["dp"] * p["micro_batch_size"] == 16 for p in pts)
    skipped.clear()
    from k3sim.planner.sweep import TRAIN_DIMS, _train_lists, training_points

    one = _train_lists(inp, {**lists, "tp": [1], "pp": [8], "virtual_stages": [1], "global_batch_sequences": [8, 16, 12]})
    pts = training_points(inp, one, 16, skipped, {}, {d: set() for d in TRAIN_DIMS})
    # dp 2: 8 sequences -> m 4 < pp 8 (pipeline), 16 -> m 8, 12 -> m 6 < 8 (pipeline)
    assert skipped == {SKIP_PIPELINE: 2} and [(p["global_batch_sequences"], p["num_micro_batches"]) for p in pts] == [(16, 8)]
    with pytest.raises(InputError) as err:  # a given value in no point is refused with the first reason
        grid(inp, {**lists, "tp": [1], "pp": [8], "virtual_stages": [1], "global_batch_sequences": [8, 16]})
    assert err.value.source == "--global-batch" and "4 micro-batches are fewer than the pp=8" in str(err.value)
    skipped.clear()
    with pytest.raises(InputError, match="global batch of 7 sequences is not divisible"):
        grid(inp, {**lists, "tp": [2], "pp": [2], "virtual_stages": [1], "global_batch_sequences": [7]}, skipped)
    assert skipped[SKIP_DIVIDE] == 1


def test_every_row_and_the_front_carry_the_global_batch(tmp_path):
    """Two named global batches: tokens_per_step in every row, and one Pareto front per batch (the larger batch
    would otherwise win on tokens/s per GPU)."""
    path = kl_train(tmp_path)
    res = sweep(path, given={"tp": [1, 2], "pp": [1, 2], "ep": [8], "cp": [1], "virtual_stages": [1],
                             "global_batch_sequences": [16, 32]})
    df = res.table
    assert set(df["global_batch_sequences"]) == {16, 32}
    assert (df["tokens_per_step"] == df["global_batch_sequences"] * 4096).all()
    assert (df["num_micro_batches"] * df["dp"] * df["micro_batch_size"] == df["global_batch_sequences"]).all()
    assert set(res.front["global_batch_sequences"]) == {16, 32}
    for b, group in res.fitting.groupby("global_batch_sequences"):
        front_b = res.front[res.front["global_batch_sequences"] == b]
        assert front_b["tokens_per_s_per_gpu"].max() == group["tokens_per_s_per_gpu"].max()
    out = tmp_path / "out"
    write_sweep(res, out)
    md = (out / "pareto.md").read_text()
    assert "global_batch_sequences" in md and "tokens_per_step" in md and "One front per global batch" in md


def test_a_default_sweep_keeps_the_scenarios_tokens_per_step(tmp_path):
    res = sweep(kl_train(tmp_path), given={"tp": [1, 2], "pp": [1, 2], "ep": [8], "cp": [1], "virtual_stages": [1]})
    assert set(res.table["tokens_per_step"]) == {16 * 4096} and res.skipped == {}
