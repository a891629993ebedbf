"""A private on-disk cache of what a profile's kernel predictor is built from, so a what-if query does not
parse 62 measured CSVs with pandas and rebuild every op's points on each start (~1.5 s of a 2 s query).

Where: `$K3SIM_CACHE_DIR`, else `$XDG_CACHE_HOME/k3sim`, else `~/.cache/k3sim`; outside the project and the
working directory, so nothing here is ever read from a user's tree. A directory that cannot be created or
written (a read-only home) means no cache: every call below fails silently and the caller computes.

Keyed, never stale: an entry's key is the sha256 of the bytes of every measured file the store reads
(`store.read_files`, content and not mtimes: a same-size rewrite within the file system's clock tick keeps
the mtime), of `fitted.yaml`, of the hardware fields the fits and the physical check read, of the source of
every module whose code shapes a cached value (`code_fingerprint`) and of the Python, numpy, pandas, scipy
and PyYAML versions. An entry is written only after the store built from those bytes passed its validation
(`load_store`: every row in range, none beyond the datasheet roofline; `read_fitted`), so a hit stands for
data that was validated; any change of data, code or versions is another key and is rebuilt.

Format: pickle (protocol 5) of builtins only (dict, list, tuple, str, bytes, int, float, bool, None; numpy
arrays as dtype, shape and raw bytes), loaded by an unpickler that refuses every global: pickle without
globals can build containers but call nothing, so even a planted file cannot run code. Pickle rather than
JSON: float bits and NaN round-trip exactly, and it loads ~10x faster. Each file carries the sha256 of its
payload and its own key: a truncated, corrupted or misplaced file is ignored (and rewritten). Written
atomically: a temporary file in the same directory, then `os.replace`.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

ENV = "K3SIM_CACHE_DIR"
FORMAT = b"k3sim-cache/1\n"
# Key directories kept; older ones are removed when a new one is made (each is ~0.5 MB; a data or code change
# makes a new one). A modelling choice: a few profiles times a few recent data versions.
KEEP_KEYS = 16
# Largest cache file read (bytes): a profile's op entry is ~50 KB; anything far larger is not ours.
MAX_ENTRY_BYTES = 64 * 2 ** 20

# Source whose code shapes a cached value: all of k3sim/kernels (reading and validating rows, ops' ranges and
# formulas, points, fits, the physical check), the reader, the bounds table and the hardware-profile helpers.
_CODE_DIRS = ("kernels",)
_CODE = ("reader.py", "errors.py", "configs/bounds.py", "configs/dtypes.py", "configs/profiles.py")
_LIBRARIES = ("numpy", "pandas", "scipy", "PyYAML")
_code_fp: list[str] = []


def cache_dir() -> Path | None:
    """The cache's root (see the module docstring); None when there is no home to put it in."""
    env = os.environ.get(ENV)
    try:
        if env:
            return Path(env).expanduser().absolute()
        xdg = os.environ.get("XDG_CACHE_HOME")  # the XDG spec: a relative value is to be ignored
        return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "k3sim"
    except (RuntimeError, OSError, KeyError):  # no HOME and no passwd entry
        return None


def code_fingerprint() -> str:
    """sha256 of the k3sim version, the source of `_CODE_DIRS` and `_CODE`, and the interpreter's and libraries'
    versions (once per process). A missing library or file counts as its own version."""
    if not _code_fp:
        import importlib.metadata as md

        from k3sim import __version__

        h = hashlib.sha256(f"{__version__}\0{sys.version}\0".encode())
        package = Path(__file__).resolve().parents[1]
        files = [str(p.relative_to(package)) for d in _CODE_DIRS for p in sorted((package / d).glob("*.py"))]
        for rel in [*files, *_CODE]:
            try:
                h.update(rel.encode() + b"\0" + (package / rel).read_bytes())
            except OSError:
                h.update(rel.encode() + b"\0missing")
        for lib in _LIBRARIES:
            try:
                h.update(f"{lib}={md.version(lib)}\0".encode())
            except md.PackageNotFoundError:
                h.update(f"{lib}=none\0".encode())
        _code_fp.append(h.hexdigest())
    return _code_fp[0]


def key(*parts: str) -> str:
    """An entry key: sha256 of the code fingerprint and `parts` (data digests, hardware fields, paths)."""
    h = hashlib.sha256(code_fingerprint().encode())
    for p in parts:
        b = str(p).encode("utf-8", errors="surrogateescape")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _path(k: str, name: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / "kernels" / k / f"{name}.pkl"


class _NoGlobals(pickle.Unpickler):
    """Builtins only: any class or function reference in the stream is refused."""

    def find_class(self, module: str, name: str):  # noqa: ARG002
        raise pickle.UnpicklingError(f"global {module}.{name} refused in a k3sim cache file")


def load(k: str, name: str) -> Any | None:
    """The value saved under (`k`, `name`), or None: absent, unreadable, corrupted or not ours."""
    path = _path(k, name)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and 0 < st.st_size <= MAX_ENTRY_BYTES):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            blob = f.read(MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    head = len(FORMAT) + 32
    if len(blob) < head or not blob.startswith(FORMAT):
        return None
    payload = blob[head:]
    if hashlib.sha256(payload).digest() != blob[len(FORMAT):head]:
        return None
    try:
        saved_key, value = _NoGlobals(io.BytesIO(payload)).load()
    except Exception:  # noqa: BLE001 - whatever a damaged stream raises, it is not an entry
        return None
    return value if saved_key == k else None


def save(k: str, name: str, value: Any) -> bool:
    """Write `value` (builtins only) under (`k`, `name`) atomically; False, silently, when it cannot be."""
    path = _path(k, name)
    if path is None:
        return False
    try:
        payload = pickle.dumps((k, value), protocol=5)
    except (pickle.PicklingError, TypeError, ValueError, RecursionError):
        return False
    tmp = None
    try:
        fresh = not path.parent.is_dir()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(FORMAT + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
        tmp = None
        if fresh:
            _prune(path.parent.parent, keep=path.parent.name)
        return True
    except (OSError, ValueError):
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _prune(kernels: Path, keep: str) -> None:
    """Remove all but the `KEEP_KEYS` most recently made key directories (never `keep`); errors ignored (another
    process may be removing or filling the same directory: it then finds a miss and computes)."""
    import shutil

    try:
        dirs = [d for d in kernels.iterdir() if d.is_dir() and not d.is_symlink() and d.name != keep]
        dirs.sort(key=lambda d: d.stat().st_mtime_ns, reverse=True)
    except OSError:
        return
    for d in dirs[KEEP_KEYS - 1:]:
        shutil.rmtree(d, ignore_errors=True)


# Values as builtins: numpy arrays and scalars become tagged tuples (dtype, shape, raw bytes), so every bit (NaN
# payloads included) and every type comes back as it was. A tuple starting with a tag cannot be data: the
# cached values hold no tuples of their own.
_ND, _NP = "\0ndarray", "\0npscalar"


def to_plain(value: Any) -> Any:
    """`value` with numpy arrays and scalars tagged, containers recursed; TypeError for anything else."""
    import numpy as np

    t = type(value)
    if value is None or t in (bool, int, float, str, bytes):
        return value
    if t is list:
        return [to_plain(v) for v in value]
    if t is tuple:
        return tuple(to_plain(v) for v in value)
    if t is dict:
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if t is np.ndarray:
        if value.dtype.hasobject:
            raise TypeError("object arrays are not cached")
        return (_ND, value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return (_NP, value.dtype.str, value.tobytes())
    raise TypeError(f"{t.__name__} is not cached")


def from_plain(value: Any) -> Any:
    """The inverse of `to_plain`."""
    t = type(value)
    if t is list:
        return [from_plain(v) for v in value]
    if t is dict:
        return {from_plain(k): from_plain(v) for k, v in value.items()}
    if t is tuple:
        if value and value[0] == _ND:
            import numpy as np

            return np.frombuffer(value[3], dtype=np.dtype(value[1])).reshape(value[2]).copy()
        if value and value[0] == _NP:
            import numpy as np

            return np.frombuffer(value[2], dtype=np.dtype(value[1]))[0]
        return tuple(from_plain(v) for v in value)
    return value
