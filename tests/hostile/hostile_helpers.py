"""Shared checks of the CLI contract (issue 11): run `k3sim.cli.main` in this process (fast) or as a real
subprocess (signals, closed pipes, full disks), and assert one error line that names the culprit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINE = 300  # k3sim.cli.MAX_ERROR_CHARS


def run_main(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `k3sim argv...` through the real entry point, in-process."""
    from k3sim.cli import main

    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code: int, out: str, err: str, *needles: str, exit_code: int = 2) -> str:
    """Exit code, exactly one stderr line (short, no traceback), nothing on stdout, and every needle in it."""
    assert code == exit_code, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert "Traceback" not in err and len(line) <= MAX_LINE, line
    assert out == "", out
    for n in needles:
        assert n in line, (n, line)
    return line


def spawn(*argv, cwd: Path = ROOT, **kw) -> subprocess.Popen:
    """A real `python -m k3sim` process in its own process group (as a terminal's foreground job)."""
    return subprocess.Popen([sys.executable, "-m", "k3sim", *map(str, argv)], cwd=cwd, start_new_session=True,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kw)
