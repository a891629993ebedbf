"""Output files are written whole or not at all: a temp file beside the target, then an atomic rename.

A reader never sees a half-written report, and a failed write (unwritable directory, disk full, an
exception while rendering) leaves neither a partial file nor a temp file behind.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from k3sim.errors import InputError


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` when the block ends, delete it if it raises."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix or ".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; outputs are ordinary files
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically; an OSError becomes an InputError naming the path."""
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    except OSError as err:
        raise InputError(f"cannot write ({err.strerror or err.__class__.__name__})", source=str(path)) from None


def save_figure(fig, path: str | Path, **savefig_kw) -> Path:
    """Write a matplotlib figure as PNG atomically and close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", **savefig_kw)
    finally:
        plt.close(fig)
    return Path(path)
