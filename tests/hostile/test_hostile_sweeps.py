"""A sweep with no runnable point exits 2 and leaves its --out as it was (issue 11: `cp --sweep --seq-lens
1e18` exited 0 with a report of skipped rows and empty plots)."""

from __future__ import annotations

from hostile_helpers import assert_one_line, run_main


def test_cp_sweep_whose_every_point_is_skipped_writes_nothing(tmp_path, capsys):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "sweep.csv").write_text("previous report")
    # 2^30 tokens on 2 ranks: 2^29 tokens per rank, past the measured KDA kernels' range, for every strategy
    assert_one_line(*run_main(capsys, "cp", "--sweep", "--seq-lens", "1G", "--cps", "2", "--cp", "2",
                              "--out", kept), "--seq-lens:", "no (S, P) point of the sweep can run", "T=536870912")
    assert [p.name for p in kept.iterdir()] == ["sweep.csv"] and (kept / "sweep.csv").read_text() == "previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]  # no staging directory left beside it
