"""Output files and directories (k3sim.files): whole or not at all, nothing temporary left behind, nothing
replaced that k3sim did not write."""

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
        with output_dir(fresh, kind="t") as d:
            atomic_write_text(d / "half.csv", "x")
            raise KeyboardInterrupt
    assert not fresh.exists() and not fresh.parent.exists()  # nor the parent created for it
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "kept"
    existing.mkdir()
    with output_dir(existing, kind="t") as d:
        atomic_write_text(d / "old.md", "old")
    with pytest.raises(RuntimeError):
        with output_dir(existing, kind="t") as d:
            atomic_write_text(d / "old.md", "new")
            raise RuntimeError
    assert (existing / "old.md").read_text() == "old"
    assert sorted(p.name for p in existing.iterdir()) == [".k3sim-manifest.json", "old.md"]  # no staging dir
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        with output_dir(blocker, kind="t"):
            pass


def test_output_dir_replaces_only_its_own_files_of_its_part(tmp_path):
    """A previous output's stale files of the same part go; another part's files and a user's file stay."""
    from k3sim.files import output_dir, read_manifest

    out = tmp_path / "o"
    with output_dir(out, kind="t", part="a") as d:
        atomic_write_text(d / "a1.csv", "1")
        atomic_write_text(d / "sub" / "a2.csv", "2")
    with output_dir(out, kind="t", part="b") as d:
        atomic_write_text(d / "b1.csv", "1")
    (out / "notes.md").write_text("mine")
    with output_dir(out, kind="t", part="a") as d:
        atomic_write_text(d / "a1.csv", "1 again")
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert names == [".k3sim-manifest.json", "a1.csv", "b1.csv", "notes.md"]  # sub/ emptied and removed
    assert read_manifest(out)["outputs"] == {"t": {"a": ["a1.csv"], "b": ["b1.csv"]}}
    with pytest.raises(InputError, match="not a file k3sim wrote"):
        with output_dir(out, kind="t") as d:
            atomic_write_text(d / "notes.md", "overwritten?")
    assert (out / "notes.md").read_text() == "mine"


@pytest.mark.parametrize("manifest", ['{"outputs": {"t": {"": ["../victim.txt"]}}}',
                                      '{"outputs": {"t": {"": ["/etc/hostname"]}}}',
                                      '{"outputs": {"t": {"": ["a/../../victim.txt"]}}}',
                                      'not json', '{"outputs": {"t": {"": [3]}}}', '[]'])
def test_a_hostile_or_broken_manifest_is_refused_and_deletes_nothing(tmp_path, manifest):
    from k3sim.files import MANIFEST_NAME, output_dir

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "o"
    out.mkdir()
    (out / MANIFEST_NAME).write_text(manifest)
    with pytest.raises(InputError, match="not a k3sim manifest"):
        with output_dir(out, kind="t"):
            pass
    assert victim.read_text() == "keep"


def test_a_symlinked_subdirectory_of_a_previous_output_is_refused(tmp_path):
    """A listed file under a subdirectory that became a link would send the replace outside --out."""
    from k3sim.files import output_dir

    out = tmp_path / "o"
    with output_dir(out, kind="t") as d:
        atomic_write_text(d / "figures" / "a.png", "png")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.png").write_text("theirs")
    (out / "figures" / "a.png").unlink()
    (out / "figures").rmdir()
    (out / "figures").symlink_to(elsewhere)
    with pytest.raises(InputError, match="symbolic link"):
        with output_dir(out, kind="t") as d:
            atomic_write_text(d / "figures" / "a.png", "new")
    assert (elsewhere / "a.png").read_text() == "theirs"


@pytest.mark.parametrize("name", ["", " ", ".", "..", "a/b", "/abs", "a\\b", "tab\there", "nul\x00", "x" * 300])
def test_names_from_inputs_must_be_one_path_component(name):
    from k3sim.files import safe_name

    with pytest.raises(InputError) as err:
        safe_name(name, source="s.yaml", field="name")
    assert "s.yaml" in str(err.value) and "field 'name'" in str(err.value)
    assert safe_name("k3-h200_serve.128k", source="s.yaml") == "k3-h200_serve.128k"


def test_an_unchanged_file_keeps_its_bytes_and_time(tmp_path):
    """Regenerating the same output leaves every file (and the manifest) untouched."""
    import os

    from k3sim.files import MANIFEST_NAME, output_dir

    out = tmp_path / "o"
    for _ in range(2):
        with output_dir(out, kind="t") as d:
            atomic_write_text(d / "r.md", "Generated 2026-11-30T03:29:47+00:00\n")
        for p in (out / "r.md", out / MANIFEST_NAME):
            os.utime(p, (1_000_000, 1_000_000))
    with output_dir(out, kind="t") as d:
        atomic_write_text(d / "r.md", "Generated 2027-01-01T00:00:00+00:00\n")
    assert (out / "r.md").read_text() == "Generated 2026-11-30T03:29:47+00:00\n"
    assert (out / "r.md").stat().st_mtime == 1_000_000 and (out / MANIFEST_NAME).stat().st_mtime == 1_000_000


def test_project_path_finds_the_projects_files_from_any_directory(tmp_path, monkeypatch):
    from k3sim.files import project_path, project_root

    monkeypatch.chdir(tmp_path)
    assert project_path("models/kimi-k3.yaml") == project_root() / "models/kimi-k3.yaml"
    assert project_path("data/traces/synthetic_trace.jsonl").is_file()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "kimi-k3.yaml").write_text("mine")  # the user's own copy wins
    assert project_path("models/kimi-k3.yaml").resolve() == (tmp_path / "models/kimi-k3.yaml").resolve()
    assert project_path("models/none.yaml") == __import__("pathlib").Path("models/none.yaml")
