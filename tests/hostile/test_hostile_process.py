"""The CLI contract seen from outside: a real SIGINT to a real `k3sim` process group (as Ctrl-C in a
terminal sends it), a full disk, a closed pipe, and the README examples from another working directory; the
documented bound on worker processes (`--workers`, `--processes`), and never more processes than tasks.
Signals during every command that starts processes: test_hostile_signals.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hostile_helpers import assert_one_line, run_main, spawn


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Poll until `predicate()` (the run reached the point to interrupt) or fail if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"ended before it could be interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline, "never reached the point to interrupt"
        time.sleep(0.05)


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


def _interrupt(proc: subprocess.Popen) -> tuple[int, str, str]:
    os.killpg(proc.pid, signal.SIGINT)  # the whole foreground group, workers included, as a terminal does
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_ctrl_c_during_a_parallel_sweep_is_one_line_130_and_no_files(tmp_path):
    """Exited 0 with up to 71 lines of worker tracebacks before."""
    out_dir = tmp_path / "sweep"
    proc = spawn("prefix-cache", "--workload", "chat", "--requests", "3000", "--sweep", "--processes", "2",
                 "--out", out_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(lambda: len(_children(proc.pid)) >= 2, proc)  # the worker pool is running
    workers = _children(proc.pid)
    code, out, err = _interrupt(proc)
    assert code == 130 and err.strip() == "interrupted" and out == "", (code, err)
    assert not out_dir.exists()
    assert not any(Path(f"/proc/{w}").exists() for w in workers)  # the parent terminated and reaped them


def test_ctrl_c_during_calibrate_validate_leaves_no_empty_out(tmp_path):
    """`calibrate validate` created --out first and an interrupt left it empty."""
    out_dir = tmp_path / "validation"
    proc = spawn("calibrate", "validate", "--out", out_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(out_dir.exists, proc)  # it is inside the slow leave-one-out now
    code, out, err = _interrupt(proc)
    assert code == 130 and err.strip() == "interrupted" and out == "", (code, err)
    assert not out_dir.exists()


def test_full_disk_is_one_line_exit_1():
    """`> /dev/full` printed a 37-51-line traceback."""
    with open("/dev/full", "w") as full:
        proc = spawn("model-info", "--model", "models/kimi-k3.yaml", "--json", stdout=full, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.strip() == "error: cannot write output (No space left on device)", err


def test_closed_pipe_is_quiet_exit_1():
    """`k3sim ... | head` with a reader gone: no traceback, no 'Exception ignored' at exit."""
    proc = spawn("model-info", "--model", "models/kimi-k3.yaml", "--json", stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert proc.returncode == 1 and err == "", err


# ------------------------------------------------------------------------------------------ worker counts
TRAIN = "scenarios/k3-h200-train-32k.yaml"


@pytest.mark.parametrize("argv, option", [
    (["sweep", TRAIN, "--workers", "10000"], "--workers"),  # forked hundreds of processes for a 2-point grid
    (["sweep", TRAIN, "--workers", "0"], "--workers"),
    (["serve", "--workload", "chat", "--sweep-rate", "1,2", "--processes", "10000"], "--processes"),
    (["prefix-cache", "--workload", "chat", "--sweep", "--processes", "5000"], "--processes"),
    (["prefix-cache", "--workload", "chat", "--sweep", "--processes", "0"], "--processes"),
])
def test_worker_counts_outside_the_documented_range_are_refused(capsys, tmp_path, argv, option):
    """`k3sim.configs.bounds.BOUNDS['workers']`, checked before anything runs or is written."""
    from k3sim.configs.bounds import BOUNDS

    code, out, err = run_main(capsys, *argv, "--out", tmp_path / "out")
    line = assert_one_line(code, out, err, f"{option}:")
    hi = BOUNDS["workers"].hi
    assert (f"{int(hi):,}" in line) or "at least 1" in line, line
    assert list(tmp_path.iterdir()) == []


def test_workers_with_a_dask_scheduler_are_refused(capsys, tmp_path):
    """--workers was silently ignored when --scheduler sent the chunks to a cluster."""
    code, out, err = run_main(capsys, "sweep", TRAIN, "--workers", "4", "--scheduler", "tcp://127.0.0.1:1",
                              "--out", tmp_path / "out")
    assert_one_line(code, out, err, "--workers:", "--scheduler")


def test_a_two_point_grid_starts_at_most_two_processes(capsys, tmp_path, monkeypatch):
    """`--workers 1000` on 2 layouts: one process per chunk, never an idle fork; the JSON says how many ran."""
    import json

    from k3sim import procs

    started = []
    real_start = procs.ProcessPool._start

    def counting_start(self, fn, n):
        started.append(n)
        return real_start(self, fn, n)

    monkeypatch.setattr(procs.ProcessPool, "_start", counting_start)
    before = _children(os.getpid())
    code, out, err = run_main(capsys, "sweep", TRAIN, "--tp", "8", "--pp", "8,16", "--ep", "64", "--virtual", "1",
                              "--cp", "1", "--workers", "1000", "--out", tmp_path / "two", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["points"] == 2 and summary["workers"] == 2 and summary["scheduler"] == "processes"
    assert started == [2]
    assert _children(os.getpid()) == before  # the pool's workers were reaped
