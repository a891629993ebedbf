"""`sweep_report` writes its four files all or none."""

import os
from pathlib import Path

import pytest

from k3sim.prefix_cache import plots
from k3sim.prefix_cache.config import CacheConfig
from k3sim.prefix_cache.run import sweep_report

MLA_B, KDA_B = 27648, 449372160


def _sweep(out):
    base = CacheConfig("decoupled", 64, 1024, MLA_B, KDA_B, 3)
    return sweep_report(None, base, policies=["decoupled", "coarse"], hash_blocks=[64], physical_blocks=[512, 1024],
                        capacities=[None, 64e9], out_dir=out, workload="chat", n_requests=20, processes=1)


def test_a_failing_plot_leaves_nothing_behind(tmp_path, monkeypatch):
    out = tmp_path / "sweep"

    def boom(*a, **k):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(plots, "plot_capacity", boom)
    with pytest.raises(RuntimeError, match="plot failed"):
        _sweep(out)
    assert not out.exists()  # the csv, table and first plot rendered before the failure were removed
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError):
        _sweep(tmp_path / "kept")
    assert list((tmp_path / "kept").iterdir()) == []


def test_sweep_files_complete_and_readable(tmp_path):
    rep = _sweep(tmp_path)
    assert len(rep.table) == 2 * 2 * 2  # coarse takes hash = block, so 2 policies x 2 blocks x 2 capacities
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(f).name for f in rep.files.values())
    for f in rep.files.values():
        assert oct(os.stat(f).st_mode & 0o777) == "0o644"
