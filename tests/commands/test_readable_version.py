"""`k3sim --version` (issue 24 item 10): one line, exit 0, the package's version, and fast: it loads no command
module, no pydantic, no numpy."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import k3sim

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_one_line_and_the_packages():
    out = subprocess.run([sys.executable, "-m", "k3sim", "--version"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout == f"{k3sim.__version__}\n"
    with open(ROOT / "pyproject.toml", "rb") as fh:  # the one written version: the module must say the same
        assert tomllib.load(fh)["project"]["version"] == k3sim.__version__


def test_version_flag_and_command_agree_and_are_in_the_help(capsys):
    from k3sim.cli import main

    main(["--version"])
    flag = capsys.readouterr()
    main(["version"])
    assert capsys.readouterr().out == flag.out and flag.err == ""
    main(["--help"])
    assert "--version" in capsys.readouterr().out


def test_version_imports_nothing_heavy():
    code = ("import sys\nfrom k3sim.cli import main\nmain(['--version'])\n"
            "heavy = [m for m in ('pydantic', 'numpy', 'pandas', 'rich', 'yaml') if m in sys.modules]\n"
            "mods = [m for m in sys.modules if m.startswith('k3sim.commands.')]\n"
            "print('HEAVY=' + ','.join(heavy), 'MODULES=' + ','.join(mods))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY= MODULES="
