"""A warm what-if query (`prefill`, a `--set` override) parses no YAML and renders no rich table: its configs and
its override values come from the disk cache (`configs.loaders.parse_yaml_value` reads a value as a one-key
document, cached like a file), as tests/commands/test_warm_imports.py asks of the other queries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("yaml", "rich", "pandas", "scipy", "matplotlib")


def loaded(argv: list[str], cache: Path) -> tuple[str, list[str]]:
    code = ("import sys\nfrom k3sim.cli import main\ntry:\n    main(" + repr(argv) + ")\nexcept SystemExit:\n"
            "    pass\nprint('LOADED=' + ','.join(m for m in " + repr(HEAVY) + " if m in sys.modules), "
            "file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, K3SIM_CACHE_DIR=str(cache)))
    mods = proc.stderr.strip().splitlines()[-1].removeprefix("LOADED=")
    return proc.stdout, [m for m in mods.split(",") if m]


@pytest.mark.parametrize("argv", [
    ["prefill", "--prompt", "16384"],
    ["model-info", "--model", "models/kimi-k3.yaml", "--set", "kda.num_heads=48", "--set",
     "full_attn_layers=[4, 8]"],
])
def test_a_warm_what_if_loads_no_heavy_library(tmp_path, argv):
    cold_out, cold = loaded(argv, tmp_path / "cache")
    warm_out, warm = loaded(argv, tmp_path / "cache")
    assert warm == [] and warm_out == cold_out and "\u2503" in warm_out
    assert "yaml" in cold
