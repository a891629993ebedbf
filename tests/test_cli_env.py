"""The library settings `k3sim.cli.main` gives itself (no pydantic plugin scan, one OpenBLAS thread): set only
where the caller left them unset, undone after an in-process call, and the answers are the same bits with
OpenBLAS's threads or without."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3sim import cli

ROOT = Path(__file__).resolve().parents[1]
NAMES = (cli.PYDANTIC_PLUGINS_ENV, *cli.BLAS_THREADS_ENV)


@pytest.fixture
def clean_env(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "numpy", raising=False)  # as in a fresh process (restored after the test)


def test_unset_settings_are_set(clean_env):
    assert sorted(cli._start_up_env()) == sorted([cli.PYDANTIC_PLUGINS_ENV, "OPENBLAS_NUM_THREADS"])
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1" and os.environ[cli.PYDANTIC_PLUGINS_ENV] == "__all__"


@pytest.mark.parametrize("name", cli.BLAS_THREADS_ENV)
def test_a_callers_thread_count_is_kept(clean_env, monkeypatch, name):
    monkeypatch.setenv(name, "3")
    assert cli._start_up_env() == [cli.PYDANTIC_PLUGINS_ENV]
    assert os.environ[name] == "3"
    assert os.environ.get("OPENBLAS_NUM_THREADS") == ("3" if name == "OPENBLAS_NUM_THREADS" else None)


def test_numpy_already_loaded_is_left_alone(monkeypatch):
    """OpenBLAS reads its thread count once, when numpy loads: setting it later would change nothing."""
    import numpy  # noqa: F401

    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    assert cli._start_up_env() == [cli.PYDANTIC_PLUGINS_ENV]


def test_an_in_process_call_leaves_the_environment_as_it_was(clean_env, capsys):
    before = {n: os.environ.get(n) for n in NAMES}
    cli.main(["version"])
    assert {n: os.environ.get(n) for n in NAMES} == before and capsys.readouterr().out.strip()


@pytest.mark.parametrize("args", [
    ["kernel-time", "gemm_bf16", "--set", "M=100", "--set", "N=7000", "--set", "K=3000"],
    ["cp", "--seq-len", "256K", "--cp", "4"],  # the intra-device and KCP fits (least squares) run cold
])
def test_same_answers_with_openblas_threads(tmp_path, args):
    """Cold runs (every fit made), one with k3sim's single OpenBLAS thread, one with the caller's four."""
    outs = []
    for i, threads in enumerate((None, "4")):
        env = {k: v for k, v in os.environ.items() if k not in NAMES}
        env["K3SIM_CACHE_DIR"] = str(tmp_path / f"cache-{i}")
        if threads:
            env["OPENBLAS_NUM_THREADS"] = threads
        proc = subprocess.run([sys.executable, "-m", "k3sim", *args, "--json"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
