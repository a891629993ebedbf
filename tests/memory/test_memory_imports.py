"""Models stay light: configs and memory import neither plotting, DES, nor CLI libraries."""

from __future__ import annotations

import subprocess
import sys


def test_memory_imports_no_heavy_modules():
    code = ("import sys, k3sim.configs, k3sim.memory.plan; "
            "print(sorted(m for m in ('matplotlib', 'pandas', 'simpy', 'typer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
