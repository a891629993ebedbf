"""Files of a measurement run directory (`python3 -m k3sim.calibration.wholestep.run --out RUN`), checked
before they are read, so a wrong directory is one line of bad input naming it, not a pandas traceback."""

from __future__ import annotations

from pathlib import Path

from k3sim.errors import InputError

HARNESS = "python3 -m k3sim.calibration.wholestep.run"


def run_file(run_dir: str | Path, name: str, what: str) -> Path:
    """`run_dir / name`, or InputError naming the directory: it is not a `what` run directory."""
    path = Path(run_dir) / name
    if not path.is_file():
        raise InputError(f"{name} not found: not a {what} run directory (one written by `{HARNESS} --out`)",
                         source=str(run_dir))
    return path


def input_file(path: str | Path, source: str) -> Path:
    """`path` if it is a file, else InputError naming the option (`source`) it came from."""
    if not Path(path).is_file():
        raise InputError("not found", source=f"{source} {path}")
    return Path(path)
