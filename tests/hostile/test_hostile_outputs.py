"""Outputs (issue 19, items 1 and 7): a command writes only what it made, where it was told.

An `--out DIR` that holds someone else's files, or another kind of k3sim output, is refused with one line
before any computation; a previous output of the same kind has its own files replaced and nothing else; a
scenario `name` that is not one path component is refused; a file output that is a device, FIFO, link or
directory is refused and left as it was (`-` sends the Perfetto trace to stdout); an unwritable place is
refused before the work; default outputs land under the working directory, never in the project's tree.
"""

from __future__ import annotations

import importlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hostile_helpers import ROOT, assert_one_line, run_main

from k3sim.files import MANIFEST_NAME, mark_output, read_manifest

KL_MODEL = ROOT / "models/kimi-linear-48b.yaml"
KL_SCENARIO = ROOT / "scenarios/kimi-linear-48b-h200.yaml"
CHEAP_PIPELINE = ("pipeline", "--stages", "2", "--microbatches", "2", "--uniform-costs", "1,2",
                  "--encoder-policy", "none")

# command line (with --out DIR appended), output kind, (module, function) that does the work: patched to fail,
# so a refusal that came after the computation would show as that failure instead of the --out line
COMMANDS = {
    "plan": (["plan", KL_SCENARIO], "plan", ("k3sim.planner", "plan")),
    "sweep": (["sweep", KL_SCENARIO], "sweep", ("k3sim.planner.sweep", "sweep")),
    "serve": (["serve", "--workload", "chat", "--requests", "20"], "serve", ("k3sim.serving.run", "simulate")),
    "serve-sweep-rate": (["serve", "--workload", "chat", "--requests", "20", "--sweep-rate", "0.5,1"],
                         "serve-sweep-rate", ("k3sim.serving.run", "sweep_rates")),
    "cp-sweep": (["cp", "--sweep"], "cp-sweep", ("k3sim.cp.sweep", "sweep")),
    "prefix-cache-sweep": (["prefix-cache", "--workload", "chat", "--requests", "20", "--sweep"],
                           "prefix-cache-sweep", ("k3sim.serving.prefix_cache_run", "sweep_report")),
    "decode-sweep-batch": (["decode", "--model", KL_MODEL, "--tp", "1", "--pp", "1", "--ep", "1", "--sweep-batch"],
                           "decode-sweep-batch", ("k3sim.decode.sweep", "sweep_batches")),
    "calibrate-validate": (["calibrate", "validate"], "calibrate-validate", ("k3sim.kernels.validate",
                                                                             "validate_profile")),
}


def _no_work(monkeypatch, where: tuple[str, str]) -> None:
    def computed(*a, **k):
        raise AssertionError(f"{where[1]} ran before the output directory was refused")

    monkeypatch.setattr(importlib.import_module(where[0]), where[1], computed)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_out_holding_the_users_files_is_refused_before_any_work(command, tmp_path, capsys, monkeypatch):
    """`plan --out DIR` replaced DIR whole and deleted the user's files; now the user's DIR is refused."""
    argv, _kind, work = COMMANDS[command]
    out = tmp_path / "mine"
    (out / "notes").mkdir(parents=True)
    (out / "thesis.tex").write_text("years of work")
    (out / "notes" / "a.md").write_text("a")
    before = _snapshot(out)
    _no_work(monkeypatch, work)
    assert_one_line(*run_main(capsys, *argv, "--out", out), f"--out {out}", "did not write",
                    "give an empty or new directory")
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["notes", "thesis.tex"]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_another_kind_of_k3sim_output_is_refused(command, tmp_path, capsys, monkeypatch):
    argv, kind, work = COMMANDS[command]
    other = "plan" if kind != "plan" else "sweep"
    out = tmp_path / "other"
    out.mkdir()
    (out / "result.csv").write_text("x\n")
    mark_output(out, kind=other, files=["result.csv"])
    before = _snapshot(out)
    _no_work(monkeypatch, work)
    assert_one_line(*run_main(capsys, *argv, "--out", out), f"is a k3sim {other} output, not a {kind} output")
    assert _snapshot(out) == before


def test_the_pipeline_report_refuses_the_users_directory(tmp_path, monkeypatch):
    from k3sim.errors import InputError
    from k3sim.pipeline import report

    out = tmp_path / "mine"
    out.mkdir()
    (out / "a.txt").write_text("a")
    _no_work(monkeypatch, ("k3sim.pipeline.report", "encoder_sweep"))
    with pytest.raises(InputError, match="did not write"):
        report.main(["--out", str(out)])
    assert _snapshot(out) == {"a.txt": b"a"}


PREVIOUS = {  # cheap runs whose second run replaces the first's files
    "prefix-cache-sweep": ["prefix-cache", "--workload", "chat", "--requests", "30", "--sweep", "--policies",
                           "decoupled", "--physical-blocks", "512", "--capacities", "none", "--hash-blocks", "64",
                           "--tokens-per-s", "1e4", "--step-overhead-s", "0.01"],
    "serve": ["serve", "--workload", "chat", "--requests", "20"],
    "decode-sweep-batch": COMMANDS["decode-sweep-batch"][0],
}


@pytest.mark.parametrize("command", list(PREVIOUS))
def test_a_previous_output_of_the_same_kind_is_replaced_and_the_users_file_kept(command, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_main(capsys, *PREVIOUS[command], "--out", out)
    assert code == 0, err
    first = _snapshot(out)
    listed = [rel for parts in read_manifest(out)["outputs"][command].values() for rel in parts]
    assert sorted(listed) == sorted(r for r in first if r != MANIFEST_NAME)
    victim = out / listed[0]
    victim.write_bytes(b"stale")              # a file k3sim wrote, changed since: replaced again
    (out / "my-notes.md").write_text("mine")  # the user's file added into the output: kept
    code, _, err = run_main(capsys, *PREVIOUS[command], "--out", out)
    assert code == 0, err
    assert _snapshot(out) == {**first, "my-notes.md": b"mine"}
    assert not [p for p in out.iterdir() if p.name.startswith(".k3sim-staging")]


@pytest.mark.parametrize("name", [".", "..", "/abs", "a/b", "", "tab\there"])
@pytest.mark.parametrize("command", ["plan", "sweep"])
def test_a_scenario_name_that_is_not_one_path_component_is_refused(name, command, tmp_path, capsys, monkeypatch):
    """A scenario named `.` made the default output `reports/.`: the whole reports/ directory was replaced."""
    data = yaml.safe_load(KL_SCENARIO.read_text())
    data.update(name=name, model=str(KL_MODEL))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    _no_work(monkeypatch, COMMANDS[command][2])
    assert_one_line(*run_main(capsys, command, scenario), str(scenario), "field 'name'")
    assert list(work.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "s.yaml"]


def _targets(tmp_path: Path) -> dict[str, tuple[Path, bytes | None]]:
    """Paths that are not regular files: each with what must still be there afterwards."""
    regular = tmp_path / "theirs.json"
    regular.write_text("their file")
    link = tmp_path / "link.json"
    link.symlink_to(regular)
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"/dev/full": (Path("/dev/full"), None), "/dev/stdout": (Path("/dev/stdout"), None),
            "symlink": (link, b"their file"), "dangling symlink": (dangling, None), "directory": (folder, None)}


@pytest.mark.parametrize("option", ["--gantt", "--trace"])
@pytest.mark.parametrize("what", ["/dev/full", "/dev/stdout", "symlink", "dangling symlink", "directory"])
def test_a_file_output_that_is_not_a_regular_file_is_refused(option, what, tmp_path, capsys, monkeypatch):
    """`--gantt /dev/full` replaced the device by a PNG; `--trace` on a link replaced the link."""
    path, content = _targets(tmp_path)[what]
    mode = os.lstat(path).st_mode
    _no_work(monkeypatch, ("k3sim.pipeline", "simulate_layout"))
    assert_one_line(*run_main(capsys, *CHEAP_PIPELINE, option, path), option, "k3sim replaces only regular files")
    assert os.lstat(path).st_mode == mode  # still the device, link or directory it was
    if content is not None:
        assert path.read_bytes() == content and path.is_symlink()


@pytest.mark.parametrize("option", ["--gantt", "--trace"])
def test_a_fifo_as_a_file_output_is_refused_without_opening_it(option, tmp_path):
    """Opening a FIFO to compare or replace it waits for a reader forever: a real process, bounded."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "k3sim", *CHEAP_PIPELINE, option, str(fifo)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "FIFO" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dash_sends_the_trace_to_stdout_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, *CHEAP_PIPELINE, "--trace", "-")
    assert code == 0 and err == "", err
    events = json.loads(out)["traceEvents"]  # stdout is the trace alone (no table around it)
    assert any(e.get("ph") == "X" for e in events) and list(tmp_path.iterdir()) == []
    assert_one_line(*run_main(capsys, *CHEAP_PIPELINE, "--gantt", "-"), "--gantt", "stdout")
    assert_one_line(*run_main(capsys, *CHEAP_PIPELINE, "--trace", "-", "--json"), "--trace", "--json")


def _unwritable(tmp_path: Path, how: str) -> Path:
    if how == "read-only mount":
        if not Path("/sys").is_dir():
            pytest.skip("no /sys")
        return Path("/sys/k3sim-test-out")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):
        locked.chmod(0o700)
        pytest.skip("running as root: a 0o500 directory stays writable")
    return locked / "out"


@pytest.mark.parametrize("how", ["chmod 0o500", "read-only mount"])
@pytest.mark.parametrize("command", ["sweep", "cp-sweep", "prefix-cache-sweep", "decode-sweep-batch", "serve"])
def test_an_unwritable_out_is_refused_before_the_work(command, how, tmp_path, capsys, monkeypatch):
    """`sweep` and `serve` refused an unwritable --out only after 10-16 s of computation."""
    out = _unwritable(tmp_path, how)
    argv, _kind, work = COMMANDS[command]
    _no_work(monkeypatch, work)
    try:
        assert_one_line(*run_main(capsys, *argv, "--out", out), "--out", "cannot write under")
    finally:
        if how.startswith("chmod"):
            out.parent.chmod(0o700)
    assert not out.exists()


@pytest.mark.parametrize("how", ["chmod 0o500", "read-only mount"])
def test_an_unwritable_file_output_is_refused_before_the_work(how, tmp_path, capsys, monkeypatch):
    target = _unwritable(tmp_path, how)
    target = target.parent / "trace.json" if how.startswith("chmod") else target
    _no_work(monkeypatch, ("k3sim.pipeline", "simulate_layout"))
    try:
        assert_one_line(*run_main(capsys, *CHEAP_PIPELINE, "--trace", target), "--trace")
    finally:
        if how.startswith("chmod"):
            target.parent.chmod(0o700)


def _project_tree_status() -> str:
    proc = subprocess.run(["git", "status", "--porcelain", "--", "reports", "hardware_profiles"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return proc.stdout


DEFAULTS = {  # a command without --out, and where its default output lands under the working directory
    "decode-sweep-batch": (COMMANDS["decode-sweep-batch"][0], "k3sim-out/decode"),
    "prefix-cache-sweep": (PREVIOUS["prefix-cache-sweep"], "k3sim-out/prefix-cache"),
}


@pytest.mark.parametrize("command", list(DEFAULTS))
def test_default_outputs_land_under_the_working_directory(command, tmp_path, capsys, monkeypatch):
    """Running the README's examples rewrote committed files under reports/ (one table lost half its rows)."""
    before = _project_tree_status()
    monkeypatch.chdir(tmp_path)
    argv, where = DEFAULTS[command]
    code, _, err = run_main(capsys, *argv)
    assert code == 0, err
    assert (tmp_path / where / MANIFEST_NAME).is_file() and len(list((tmp_path / where).iterdir())) > 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3sim-out"]
    assert _project_tree_status() == before  # nothing in the project's reports/ or profiles changed


def test_default_plan_and_fit_locations_are_under_the_working_directory(tmp_path, capsys, monkeypatch):
    """plan's default report dir and calibrate fit's default file (it rewrote the committed fitted.yaml)."""
    from k3sim.commands.plan import default_report_dir
    from k3sim.files import default_out

    monkeypatch.chdir(tmp_path)
    assert default_report_dir(KL_SCENARIO) == Path("k3sim-out/kimi-linear-48b-h200")
    assert default_report_dir(KL_SCENARIO, "-sweep") == default_out("kimi-linear-48b-h200-sweep")
    code, out, err = run_main(capsys, "calibrate", "fit", "--help")
    assert code == 0 and "[default:./k3sim-out/<profile>-fitted.yaml]" in "".join(out.split())  # help wraps


@pytest.mark.parametrize("sig, code", [(2, 130), (15, 143)])
def test_an_interrupted_plan_leaves_the_previous_report_and_no_staging(sig, code, tmp_path):
    """SIGTERM left a half-built staging directory of `plan`; the previous report must stay as it was."""
    import signal
    import time

    from hostile_helpers import spawn

    out = tmp_path / "report"
    out.mkdir()
    (out / "report.md").write_text("the previous report")
    (out / "README.md").write_text("mine")
    mark_output(out, kind="plan", files=["report.md"])
    before = _snapshot(out)
    # a long serving sample: a minute of work after the directory opens, so the signal lands mid-plan
    proc = spawn("plan", KL_SCENARIO, "--serving-requests", "50000", "--out", out, cwd=tmp_path,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not [p for p in out.iterdir() if p.name.startswith(".k3sim-staging")] and proc.poll() is None:
        assert time.monotonic() < deadline, "plan never opened its output directory"
        time.sleep(0.05)
    assert proc.poll() is None, "plan ended before it could be interrupted"
    os.killpg(proc.pid, signal.Signals(sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert _snapshot(out) == before and not [p for p in out.iterdir() if p.name.startswith(".k3sim-staging")]
