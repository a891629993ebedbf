"""The collective harness on CPU with gloo: two real processes time every op under the barrier and stream
conventions (graph needs a GPU and is recorded as failed), with the convention in each row.

Skipped where torch is missing: CI installs only '.[test]', which has no torch (the harness needs it only on
the GPU machine)."""

from __future__ import annotations

import csv

import pytest

torch = pytest.importorskip("torch")


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import time
    from pathlib import Path

    import torch.distributed as dist

    from k3sim.calibration import distributed as D

    D._DEVICE = "cpu"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        D.collectives(Path(out), time.monotonic() + 60, rank, world, sizes=[1024, 65536], ops=("all_gather",))
    finally:
        dist.destroy_process_group()


def test_gloo_collectives_three_conventions(tmp_path):
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'rendezvous'}"
    # fork: the children inherit the imported torch (a spawn re-imports it: ~5 s each on a small machine)
    mp.start_processes(_worker, args=(2, init, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    barrier = list(csv.DictReader(open(tmp_path / "all_gather.csv")))
    stream = list(csv.DictReader(open(tmp_path / "all_gather.stream.csv")))
    graph = list(csv.DictReader(open(tmp_path / "all_gather.graph.csv")))
    assert [(r["bytes"], r["gpus"], r["convention"], r["status"]) for r in barrier] == \
        [("1024", "2", "barrier", "ok"), ("65536", "2", "barrier", "ok")]
    assert [r["convention"] for r in stream] == ["stream", "stream"] and all(r["status"] == "ok" for r in stream)
    assert all(r["status"] == "failed" and "needs a GPU" in r["error"] for r in graph)
    for r in barrier + stream:
        s, p20, p80 = float(r["seconds"]), float(r["seconds_p20"]), float(r["seconds_p80"])
        assert 0 < p20 <= s <= p80 < 1.0
