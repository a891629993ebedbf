"""Output files are written whole or not at all: a temp file beside the target, then an atomic rename.

A reader never sees a half-written report, and a failed write (unwritable directory, disk full, an
exception while rendering, Ctrl-C) leaves neither a partial file nor a temp file behind. A text file whose
only change would be a timestamp is left as it is, so regenerating an unchanged report leaves git clean.
`project_path` resolves the project's own default files (models, scenarios, traces, reports) from any
working directory.
"""

from __future__ import annotations

import os
import re
import shutil
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


# ISO-8601 date-times as reports write them (2026-11-30T03:29:47+00:00, 20261130T032947Z, ...).
_TIMESTAMP = re.compile(r"\d{4}-?\d{2}-?\d{2}[T ]\d{2}:?\d{2}:?\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")


def same_but_timestamps(old: str, new: str) -> bool:
    """True if `old` and `new` differ at most in ISO-8601 date-times (a report regenerated from the same data)."""
    return _TIMESTAMP.sub("<time>", old) == _TIMESTAMP.sub("<time>", new)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically; an OSError becomes an InputError naming the path.

    If the file exists and differs from `text` only in timestamps, it is kept untouched: the committed copy
    of a report regenerated from unchanged data stays byte-identical (git clean)."""
    try:
        old = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        old = None
    if old is not None and same_but_timestamps(old, text):
        return
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


@contextmanager
def output_dir(path: str | Path, *, source: str = "--out") -> Iterator[Path]:
    """Create the output directory `path` for the block; if the block fails (bad input, Ctrl-C) and the
    directory did not exist before, remove what the block left there, so no empty or half-filled `--out`
    remains, nor the parent directories created for it. Files in a directory that already existed are the
    writers' business (they write atomically)."""
    path = Path(path)
    created = not path.exists()
    top = path  # the outermost directory this call creates: removed on failure
    while created and not top.parent.exists() and top.parent != top:
        top = top.parent
    if path.exists() and not path.is_dir():
        raise InputError("exists and is not a directory", source=f"{source} {path}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create the output directory ({err.strerror or err.__class__.__name__})",
                         source=f"{source} {path}") from None
    try:
        yield path
    except BaseException:
        if created:
            shutil.rmtree(top, ignore_errors=True)
        raise


def project_root() -> Path:
    """The project checkout the package runs from (k3sim is installed editable from it)."""
    return Path(__file__).resolve().parents[1]


def project_path(path: str | Path) -> Path:
    """A relative input path as given if it exists from the working directory, else the project's copy
    (`models/kimi-k3.yaml`, `data/traces/...`, `scenarios/default.yaml`) if that exists; otherwise as given,
    so the caller's "file not found" names what the user typed."""
    p = Path(path)
    try:
        if p.is_absolute() or p.exists():
            return p
        candidate = project_root() / p
        return candidate if candidate.exists() else p
    except OSError:  # a name too long for the file system: not ours to find; the caller reports it
        return p
