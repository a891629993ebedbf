"""Shared fixtures: the repository root and a CLI runner that returns (exit code, stdout, stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def root() -> Path:
    return ROOT


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `python -m k3sim ...` in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "k3sim", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )


def run_cli_json(*args: str, code: int = 0, cwd: Path = ROOT) -> dict:
    """The one CLI-JSON helper: `run_cli` with --json, exit code checked, stdout parsed."""
    proc = run_cli(*args, "--json", cwd=cwd)
    assert proc.returncode == code, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_json():
    """`run_cli_json` as a fixture: `from conftest import` would pick up a sub-package's conftest.py."""
    return run_cli_json


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache_dir(tmp_path_factory):
    """The kernel predictor's disk cache (k3sim.kernels.cache) in a directory of this session, for in-process
    calls and for every `python -m k3sim` the tests start (they inherit the environment): the suite never
    reads or fills the user's ~/.cache/k3sim. Entries are keyed by content, so sharing them across tests
    changes no answer (tests/kernels/test_store_cache.py checks hits against misses)."""
    import os

    saved = os.environ.get("K3SIM_CACHE_DIR")
    os.environ["K3SIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("k3sim-cache"))
    yield
    if saved is None:
        os.environ.pop("K3SIM_CACHE_DIR", None)
    else:
        os.environ["K3SIM_CACHE_DIR"] = saved
