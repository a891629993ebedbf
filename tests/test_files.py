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
