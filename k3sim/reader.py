"""The one reader of input files: every scenario, model, profile, topology, trace and measurement goes through it.

Why one place: a user can name anything as a file, and each loader used to find out in its own way (or not):
`/dev/zero` as a trace grew without bound, a FIFO was drained by a validation pass and then served 0 requests,
a symlink loop was "file not found". Here:

- a path is looked at (`os.stat`, following links) before it is opened, so a directory, a device (`/dev/zero`,
  `/dev/stdin` when it is a terminal) or a socket is refused with one line without being opened (opening a
  device can block or have effects of its own);
- "file not found" is said only when nothing is at the path; a dangling symlink, a symlink loop, a permission, a
  name too long and a path through a file each get their own line and fix;
- a regular file over its cap is refused from its size, before a byte is read;
- a pipe (a FIFO, bash's `<(...)` as `/dev/fd/N`, a redirected `/dev/stdin`) can be read only once: it is read
  exactly once, in bounded chunks, and refused as soon as it passes the cap (`probe(...).rereadable` tells a
  caller that would read twice, e.g. once per swept rate, to refuse it up front); what `read_bytes` read from
  an anonymous pipe is remembered, so a second read of it in the same run sees the same bytes;
- lines are streamed in chunks of `CHUNK_BYTES` (`iter_lines`): a line over its cap is refused with its number,
  so memory stays at one chunk plus one line whatever the input (no `readline()` without a size).

The caps are the caller's (each knows the largest valid file of its kind: `k3sim.configs.loaders`,
`k3sim.workloads.mooncake`, `k3sim.kernels.store`); `MAX_CONFIG_BYTES` and `MAX_MEASURED_BYTES` live here
with their reasons because several layers read those kinds. This module imports only the standard library and
`k3sim.errors`, so every layer may use it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Iterator

from k3sim.errors import InputError, shorten

# Bytes asked of the OS per read. A modelling choice: large enough that a 3 MB trace takes three reads, small
# enough that a reader of an endless pipe holds at most this plus one capped line.
CHUNK_BYTES = 1 << 20

# Largest config file (scenario, model YAML or HF config.json, hardware profile, topology file), bytes. A
# modelling choice: our configs and HF config.json files are a few KiB (the largest shipped, a topology, is
# under 100 KiB); 16 MiB leaves room for any real one while a multi-gigabyte file is refused before parsing.
MAX_CONFIG_BYTES = 16 * 2 ** 20

# Largest measured-data file (one op's CSV, provenance.yaml, fitted.yaml, training_glue.yaml), bytes. A
# modelling choice: the largest committed one (a whole-step kernels.csv) is ~0.4 MB and a harness run writes a
# few thousand rows per op; 64 MiB (~150x) keeps any real run while a runaway file is refused before pandas
# holds it several times over.
MAX_MEASURED_BYTES = 64 * 2 ** 20


@dataclass(frozen=True)
class InputFile:
    """What is at an input path: `kind` "file" (a regular file, `size` bytes) or "pipe" (read once)."""

    path: str
    kind: str
    size: int | None

    @property
    def rereadable(self) -> bool:
        """A regular file can be read again; a pipe's bytes are gone once read."""
        return self.kind == "file"


def _missing_reason(path: str) -> str:
    """Why `os.stat` found nothing: a dangling symbolic link is not a missing file."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return (f"is a symbolic link to '{shorten(os.readlink(path), 80)}', which does not exist; "
                    "fix or remove the link")
    except OSError:
        pass
    return "file not found (nothing at this path; check the spelling and the working directory)"


def _stat_error(err: OSError, path: str) -> str:
    """One line for each way a path can fail to lead to a file, with the fix."""
    if err.errno == errno.ENOENT:
        return _missing_reason(path)
    if err.errno == errno.ELOOP:
        return "is a symbolic link loop (too many levels of symbolic links); point the link at a file"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied; make the file readable or give another path"
    if err.errno == errno.ENAMETOOLONG:
        return "file name too long for the file system; give a shorter path"
    if err.errno == errno.ENOTDIR:
        return "a component of the path is a file, not a directory; check the path"
    return f"cannot read ({err.strerror or err.__class__.__name__})"


def _kind(mode: int, what: str) -> str:
    """`file` or `pipe` for what can be read; ValueError with the refusal (the reason and the fix) otherwise."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISFIFO(mode):
        return "pipe"
    if stat.S_ISDIR(mode):
        raise ValueError(f"is a directory, expected a {what}")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise ValueError(f"is a device, not a file: give a regular file (a {what})")
    if stat.S_ISSOCK(mode):
        raise ValueError(f"is a socket, not a file: give a regular file (a {what})")
    raise ValueError(f"is not a regular file: give a regular file (a {what})")


def probe(path: str | os.PathLike, *, source: str | None = None, what: str = "file") -> InputFile:
    """What is at `path`, without opening it; InputError (naming `source`, the path by default) when nothing
    readable is: missing, a dangling link, a loop, no permission, a directory, a device, a socket."""
    p = os.fspath(path)
    src = source or str(path)
    try:
        st = os.stat(p)
    except OSError as err:
        raise InputError(_stat_error(err, p), source=src) from None
    except ValueError:  # an embedded NUL byte
        raise InputError("file name contains a NUL byte; give a real path", source=src) from None
    try:
        kind = _kind(st.st_mode, what)
    except ValueError as why:
        raise InputError(str(why), source=src) from None
    return InputFile(p, kind, st.st_size if kind == "file" else None)


def _too_large(size_text: str, what: str, max_bytes: int) -> str:
    return f"{size_text} is too large for a {what} (at most {max_bytes:,} bytes)"


def _open(info: InputFile, src: str, what: str) -> int:
    """A read-only descriptor of what `probe` saw; checked again after opening (the path may have changed)."""
    flags = os.O_RDONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(info.path, flags)  # a FIFO waits here for its writer, as `cat` does
    except OSError as err:
        raise InputError(_stat_error(err, info.path), source=src) from None
    try:
        if _kind(os.fstat(fd).st_mode, what) != info.kind:
            raise ValueError(f"changed while being opened; give a stable {what}")
    except ValueError as why:
        os.close(fd)
        raise InputError(str(why), source=src) from None
    return fd


def _chunks(fd: int, src: str, what: str, max_bytes: int | None) -> Iterator[bytes]:
    """The descriptor's bytes in chunks of at most `CHUNK_BYTES`, refused once more than `max_bytes` came."""
    total = 0
    while True:
        try:
            chunk = os.read(fd, CHUNK_BYTES)
        except OSError as err:
            raise InputError(f"cannot read ({err.strerror or err.__class__.__name__})", source=src) from None
        if not chunk:
            return
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise InputError(_too_large(f"more than {max_bytes:,} bytes", what, max_bytes), source=src)
        yield chunk


# Bytes read from anonymous pipes (bash's `<(...)`, a piped /dev/stdin), by (device, inode). Such a pipe can
# never be opened again to give other bytes (its writer is gone once drained), so a second read of the same
# path in this process (a command that looks at its scenario for a name, then plans it) gets what the first
# read got instead of an empty file. Capped files only (read_bytes), so at most a few config files' worth.
_PIPE_BYTES: dict[tuple[int, int], bytes] = {}
_PIPEFS_DEV: list[int] = []


def _anonymous_pipe(path: str) -> tuple[int, int] | None:
    """(device, inode) of `path` if it is an anonymous pipe (on the kernel's pipe file system, like a pipe
    from `os.pipe()`), else None: a named FIFO can be opened again by a new writer with new bytes."""
    if not _PIPEFS_DEV:
        r, w = os.pipe()
        _PIPEFS_DEV.append(os.fstat(r).st_dev)
        os.close(r)
        os.close(w)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISFIFO(st.st_mode) and st.st_dev == _PIPEFS_DEV[0] else None


def read_bytes(path: str | os.PathLike, *, source: str | None = None, what: str = "file",
               max_bytes: int) -> bytes:
    """The whole content of `path`, opened once (a pipe is read exactly once); a regular file over `max_bytes`
    is refused from its size before reading, a pipe once it passes `max_bytes`."""
    src = source or str(path)
    info = probe(path, source=src, what=what)
    if info.size is not None and info.size > max_bytes:
        raise InputError(_too_large(f"{info.size:,} bytes", what, max_bytes), source=src)
    anon = _anonymous_pipe(info.path) if info.kind == "pipe" else None
    if anon in _PIPE_BYTES:
        return _PIPE_BYTES[anon]
    fd = _open(info, src, what)
    try:
        data = b"".join(_chunks(fd, src, what, max_bytes))
    finally:
        os.close(fd)
    if anon is not None:
        _PIPE_BYTES[anon] = data
    return data


def read_text(path: str | os.PathLike, *, source: str | None = None, what: str = "file",
              max_bytes: int) -> str:
    """`read_bytes` decoded as UTF-8; a file that is not UTF-8 is refused in one line."""
    data = read_bytes(path, source=source, what=what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"not a UTF-8 text file (a {what} is text)", source=source or str(path)) from None


def iter_lines(path: str | os.PathLike, *, source: str | None = None, what: str = "file",
               max_line_bytes: int, max_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line without its newline) of `path`, streamed exactly once in bounded chunks.

    A line longer than `max_line_bytes` is refused with its number as soon as that many bytes of it have come
    (`/dev/zero` through a pipe, a 5 GB single line); more than `max_bytes` in all is refused likewise. The
    file is opened on the first `next()`, and closed when the iteration ends or is abandoned."""
    src = source or str(path)
    info = probe(path, source=src, what=what)
    if info.size is not None and max_bytes is not None and info.size > max_bytes:
        raise InputError(_too_large(f"{info.size:,} bytes", what, max_bytes), source=src)
    fd = _open(info, src, what)
    lineno = 0
    tail = b""
    try:
        for chunk in _chunks(fd, src, what, max_bytes):
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            for line in parts:
                lineno += 1
                if len(line) > max_line_bytes:
                    raise InputError(_long_line(lineno, what, max_line_bytes), source=src)
                yield lineno, line
            if len(tail) > max_line_bytes:
                raise InputError(_long_line(lineno + 1, what, max_line_bytes), source=src)
        if tail:
            yield lineno + 1, tail
    finally:
        os.close(fd)


def _long_line(lineno: int, what: str, max_line_bytes: int) -> str:
    return (f"line {lineno}: longer than {max_line_bytes:,} bytes, more than any valid {what} line; "
            f"check that this is a {what}")


def is_file(path: str | os.PathLike) -> bool:
    """True if `path` leads to a regular file (a name too long or a loop is not one); never raises."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def exists(path: str | os.PathLike) -> bool:
    """True if anything is at `path`, a dangling or looping symlink included (so that "not found" is said only
    when nothing is there); never raises."""
    try:
        os.lstat(path)
        return True
    except (OSError, ValueError):
        return False


__all__ = ["CHUNK_BYTES", "MAX_CONFIG_BYTES", "MAX_MEASURED_BYTES", "InputFile", "probe", "read_bytes",
           "read_text", "iter_lines", "is_file", "exists"]
