"""A sweep with no runnable point exits 2 and leaves its --out as it was (issue 11: `cp --sweep --seq-lens
1e18` exited 0 with a report of skipped rows and empty plots)."""

from __future__ import annotations

import pytest

from hostile_helpers import ROOT, assert_one_line, run_main


def test_cp_sweep_whose_every_point_is_skipped_writes_nothing(tmp_path, capsys):
    from k3sim.cp.report import KIND
    from k3sim.files import MANIFEST_NAME, mark_output

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "sweep.csv").write_text("previous report")
    mark_output(kept, kind=KIND, files=["sweep.csv"])  # a previous cp --sweep output
    manifest = (kept / MANIFEST_NAME).read_text()
    # 2^30 tokens on 2 ranks: 2^29 tokens per rank, past the measured KDA kernels' range, for every strategy
    assert_one_line(*run_main(capsys, "cp", "--sweep", "--seq-lens", "1G", "--cps", "2", "--cp", "2",
                              "--out", kept), "--seq-lens:", "no (S, P) point of the sweep can run", "T=536870912")
    assert sorted(p.name for p in kept.iterdir()) == [MANIFEST_NAME, "sweep.csv"]
    assert (kept / "sweep.csv").read_text() == "previous report" and (kept / MANIFEST_NAME).read_text() == manifest
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]  # no staging directory left beside it


# ------------------------------------------------------------------------------------------ sweep grids (issue 19)
TRAIN = ROOT / "scenarios/k3-h200-train-32k.yaml"   # 8,192 GPUs: TP8 PP16 v2 EP64 DP64
SERVE = ROOT / "scenarios/default.yaml"


def test_a_grid_past_its_bound_is_refused_from_the_list_lengths_alone():
    """10^8 points (eight lists of 10: the layout dimensions and the global batch) are refused from the product
    of the lengths: no point is built, so the refusal takes well under a second and allocates next to nothing
    (10^8 dicts would be GBs)."""
    import time
    import tracemalloc

    from k3sim.configs.bounds import BOUNDS
    from k3sim.errors import InputError
    from k3sim.planner.inputs import load
    from k3sim.planner.sweep import TRAIN_DIMS, grid

    inp = load(TRAIN)
    ten = list(range(1, 11))
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(InputError) as err:
        grid(inp, {d: ten for d in TRAIN_DIMS})
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 10 ** 6 and elapsed < 30, (elapsed, peak)  # no grid built: memory is the check, time a hang guard
    cap = int(BOUNDS["sweep_points_train"].hi)
    line = str(err.value)
    assert len(TRAIN_DIMS) == 8 and "100,000,000 points" in line and f"{cap:,}" in line and "give fewer values" in line


@pytest.mark.parametrize("argv, needles", [
    # 131,072 GPUs of DP for an 8,192-GPU cluster were evaluated as fitting and put on the Pareto front
    (["--tp", "8", "--pp", "16", "--virtual", "2", "--ep", "64", "--dp", "1024"],
     ["--dp:", "1,024 is in no point", "131,072 GPUs exceed the cluster's 8,192"]),
    (["--dp", "16384"], ["--dp:", "exceed the cluster's 8,192"]),
    (["--virtual", "2", "--pp", "1"], ["--virtual:", "virtual stages need a pipeline"]),
    # a non-ASCII digit passed str.isdigit and then raised in int(): a traceback
    (["--tp", "²"], ["--tp:", "ASCII digits"]), (["--pp", "1,٣"], ["--pp:", "ASCII digits"]),
    (["--tp", "8,8"], ["--tp:", "8 appears twice"]),
    (["--tp", "100000"], ["--tp:", "outside [1, 65,536]"]),
    (["--tp", "9" * 5000], ["--tp:", "is outside"]),
    (["--micro-batches", "0"], ["--micro-batches:", "positive integers"]),
    (["--tp", "1,2,3,4,5,6,7,8,9,10", "--pp", "1,2,3,4,5,6,7,8,9,10", "--ep", "1,2,3,4,5,6,7,8,9,10", "--cp",
      "1,2,3,4,5,6,7,8,9,10", "--dp", "1,2,3,4,5,6,7,8,9,10", "--micro-batches", "1,2,3,4,5,6,7,8,9,10",
      "--virtual", "1,2,3,4,5,6,7,8,9,10"],
     ["10,000,000 points", "training layouts one sweep runs"]),
])
def test_a_training_sweep_refuses_points_it_cannot_run(tmp_path, capsys, argv, needles):
    out = tmp_path / "sweep"
    assert_one_line(*run_main(capsys, "sweep", TRAIN, *argv, "--out", out), *needles)
    assert not out.exists()


def test_given_dp_that_fits_only_some_layouts_keeps_those_and_none_beyond_the_cluster():
    from k3sim.planner.inputs import load
    from k3sim.planner.sweep import grid

    inp = load(TRAIN)
    pts = grid(inp, {"tp": [8], "pp": [16], "virtual_stages": [2], "ep": [64], "cp": [1, 2], "dp": [32, 64]})
    gpus = inp.scenario.cluster.num_gpus
    assert pts and all(p["tp"] * p["pp"] * p["cp"] * p["dp"] <= gpus for p in pts)
    assert {(p["cp"], p["dp"]) for p in pts} == {(1, 32), (1, 64), (2, 32)}  # cp 2 x dp 64 = 16,384 GPUs: not a point


def test_a_serving_grid_past_its_bound_and_a_sweep_section_with_a_repeat_are_refused(tmp_path, capsys):
    big = ",".join(str(b) for b in range(1, 2001))
    assert_one_line(*run_main(capsys, "sweep", SERVE, "--max-batch", big, "--out", tmp_path / "o"),
                    "--max-batch:", "2,000 points", "serving points one sweep runs")
    path = tmp_path / "s.yaml"
    path.write_text(SERVE.read_text().replace("../models", str(ROOT / "models"))
                    .replace("workload:", "sweep: {max_batch: [16, 16]}\nworkload:"))
    assert_one_line(*run_main(capsys, "sweep", path, "--out", tmp_path / "o"), "field 'sweep.max_batch'",
                    "16 appears twice")
    path.write_text(SERVE.read_text().replace("../models", str(ROOT / "models"))
                    .replace("workload:", "sweep: {prefill_replicas: [1]}\nworkload:"))
    assert_one_line(*run_main(capsys, "sweep", path, "--out", tmp_path / "o"), "sweep.prefill_replicas:",
                    "one replica")
    assert not (tmp_path / "o").exists()
