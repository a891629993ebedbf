"""Atomic output: the target appears whole or not at all, and nothing temporary is left behind."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.files import atomic_path, atomic_write_text


def test_a_failure_inside_the_block_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("rendering failed")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_written_whole_with_ordinary_permissions(tmp_path):
    target = tmp_path / "fit.yaml"
    atomic_write_text(target, "a: 1\n")
    assert target.read_text() == "a: 1\n" and (target.stat().st_mode & 0o777) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["fit.yaml"]


def test_unwritable_place_is_one_line_naming_the_path(tmp_path):
    with pytest.raises(InputError, match="cannot write") as err:
        atomic_write_text(tmp_path / "missing-dir" / "x.md", "x")
    assert "missing-dir" in str(err.value)


def test_a_report_that_changed_only_in_its_timestamp_is_not_rewritten(tmp_path):
    """`calibrate fit/validate` rewrote committed files when only the date changed (git was never clean)."""
    import os

    from k3sim.files import same_but_timestamps

    target = tmp_path / "validation.md"
    old = "Generated 2026-11-30T03:29:47+00:00 by `k3sim calibrate validate`; MAPE 2.9 %\n"
    target.write_text(old)
    os.utime(target, (1_000_000, 1_000_000))
    atomic_write_text(target, old.replace("2026-11-30T03:29:47", "2026-12-01T11:02:03"))
    assert target.read_text() == old and target.stat().st_mtime == 1_000_000
    new = old.replace("2.9 %", "3.0 %")  # a real change is written, new timestamp and all
    atomic_write_text(target, new)
    assert target.read_text() == new
    assert same_but_timestamps("fit_date: '2026-11-30T03:29:18+00:00'\n", "fit_date: '2027-01-02T00:00:00+00:00'\n")
    assert not same_but_timestamps("run 20261130T032947Z a: 1", "run 20261130T032947Z a: 2")


def test_output_dir_removes_what_a_failed_block_created_but_not_an_existing_dir(tmp_path):
    from k3sim.files import output_dir

    fresh = tmp_path / "new" / "out"
    with pytest.raises(KeyboardInterrupt):
        with output_dir(fresh) as d:
            (d / "half.csv").write_text("x")
            raise KeyboardInterrupt
    assert not fresh.exists() and not fresh.parent.exists()  # nor the parent created for it
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "kept"
    existing.mkdir()
    (existing / "old.md").write_text("old")
    with pytest.raises(RuntimeError):
        with output_dir(existing):
            raise RuntimeError
    assert (existing / "old.md").read_text() == "old"
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        with output_dir(blocker):
            pass


def test_project_path_finds_the_projects_files_from_any_directory(tmp_path, monkeypatch):
    from k3sim.files import project_path, project_root

    monkeypatch.chdir(tmp_path)
    assert project_path("models/kimi-k3.yaml") == project_root() / "models/kimi-k3.yaml"
    assert project_path("data/traces/synthetic_trace.jsonl").is_file()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "kimi-k3.yaml").write_text("mine")  # the user's own copy wins
    assert project_path("models/kimi-k3.yaml").resolve() == (tmp_path / "models/kimi-k3.yaml").resolve()
    assert project_path("models/none.yaml") == __import__("pathlib").Path("models/none.yaml")
