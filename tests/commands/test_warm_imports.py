"""What a warm what-if query loads (benchmarks/bench_whatif.py times them): the second of two identical queries
in fresh processes, sharing a cache directory, parses no YAML (the configs come from the disk cache), renders
no table through rich (k3sim.output lays plain tables out itself) and reads no measured CSV through pandas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "models/kimi-k3.yaml"
HEAVY = ("yaml", "rich", "pandas", "scipy", "matplotlib")


def loaded(argv: list[str], cache: Path) -> tuple[str, list[str]]:
    code = ("import sys\nfrom k3sim.cli import main\ntry:\n    main(" + repr(argv) + ")\nexcept SystemExit:\n"
            "    pass\nprint('LOADED=' + ','.join(m for m in " + repr(HEAVY) + " if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, K3SIM_CACHE_DIR=str(cache)))
    mods = proc.stderr.strip().splitlines()[-1].removeprefix("LOADED=")
    return proc.stdout, [m for m in mods.split(",") if m]


@pytest.mark.parametrize("argv", [
    ["model-info", "--model", MODEL],
    ["memory", "--model", MODEL, "--tp", "8", "--pp", "2", "--ep", "8"],
    ["kernel-time", "chunk_kda_fwd", "--set", "T=32768", "--set", "H=12"],
    ["cp", "--seq-len", "256K", "--cp", "4"],
])
def test_a_warm_query_loads_no_heavy_library(tmp_path, argv):
    cold_out, cold = loaded(argv, tmp_path / "cache")
    warm_out, warm = loaded(argv, tmp_path / "cache")
    assert warm == [] and warm_out == cold_out and "\u2503" in warm_out
    assert "yaml" in cold  # the first parsed the configs
