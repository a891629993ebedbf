"""`sweep_report` writes its four files all or none."""

import os
from pathlib import Path

import pytest

from k3sim.prefix_cache import plots
from k3sim.prefix_cache.config import CacheConfig
from k3sim.serving.prefix_cache_run import sweep_report

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
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".k3sim-manifest.json",
                                                                 *(Path(f).name for f in rep.files.values())])
    for f in rep.files.values():
        assert oct(os.stat(f).st_mode & 0o777) == "0o644"


def test_progress_is_reported_once_per_configuration_and_names_drop_trace_suffix(tmp_path):
    """The CLI draws its stderr progress bar from these calls (a 98 s sweep showed nothing); a sweep of
    `conversation_trace.jsonl` writes `conversation_*` files, the names of the committed report."""
    seen = []
    base = CacheConfig("decoupled", 512, 1024, MLA_B, KDA_B, 3)
    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / "conversation_head300.jsonl"
    local = tmp_path / "conversation_trace.jsonl"
    local.write_text(trace.read_text())
    rep = sweep_report(local, base, policies=["decoupled"], hash_blocks=[512], physical_blocks=[512, 1024],
                       capacities=[None], out_dir=tmp_path / "out", processes=1,
                       progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]
    assert Path(rep.files["csv"]).name == "conversation_sweep.csv"


def test_a_single_replay_reports_progress_while_streaming():
    """A long replay shows progress on stderr; the counts come from here, and the last call gives the total."""
    from k3sim.serving.prefix_cache_run import simulate

    seen = []
    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / "conversation_head300.jsonl"
    res = simulate(trace, CacheConfig("decoupled", 512, 1024, MLA_B, KDA_B, 3),
                   progress=lambda n, total: seen.append((n, total)))
    assert seen == [(256, None), (300, 300)] and res.requests + res.requests_rejected == 300
