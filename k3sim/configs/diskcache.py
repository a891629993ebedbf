"""k3sim's private on-disk cache: where it lives and how an entry is written and read. What is cached, and
under which key, is the user's business: the kernel predictor's parsed store and fits
(`k3sim.kernels.cache`, which documents the keys), the KCP parts and intra-device fits (`k3sim.cp`), parsed
config files (`cached_yaml` below). Here because configs is the lowest layer that caches.

Where: `$K3SIM_CACHE_DIR`, else `$XDG_CACHE_HOME/k3sim`, else `~/.cache/k3sim`; outside the project and the
working directory, so nothing here is ever read from a user's tree. A directory that cannot be created or
written (a read-only home) means no cache: every call below fails silently and the caller computes.

Format: pickle (protocol 5) of builtins only (dict, list, tuple, set, str, bytes, int, float, bool, None),
loaded by an unpickler that refuses every global: pickle without globals can build containers but call
nothing, so even a planted file cannot run code. Pickle rather than JSON: float bits and NaN round-trip
exactly, and it loads ~10x faster. Each file carries the sha256 of its payload and its own key: a truncated,
corrupted or misplaced file is ignored (and rewritten). Written atomically: a temporary file in the same
directory, then `os.replace`. Entries live under `<root>/<space>/<key>/<name>.pkl`; each space keeps its most
recent key directories (`save(keep=...)`).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import stat
import sys
from pathlib import Path
from typing import Any

ENV = "K3SIM_CACHE_DIR"
FORMAT = b"k3sim-cache/1\n"
# Key directories kept per space; older ones are removed when a new one is made. A modelling choice: the
# kernel predictor's entries (~0.5 MB a key) for a few profiles times a few recent data versions.
KEEP_KEYS = 16
# Largest cache file read (bytes): a profile's op entry is ~50 KB; anything far larger is not ours.
MAX_ENTRY_BYTES = 64 * 2 ** 20


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


def digest(*parts: str | bytes) -> str:
    """sha256 of `parts`, each length-prefixed (two parts' bytes cannot run together into another key)."""
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode("utf-8", errors="surrogateescape")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def entry_path(space: str, k: str, name: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / space / k / f"{name}.pkl"


class _NoGlobals(pickle.Unpickler):
    """Builtins only: any class or function reference in the stream is refused."""

    def find_class(self, module: str, name: str):  # noqa: ARG002
        raise pickle.UnpicklingError(f"global {module}.{name} refused in a k3sim cache file")


def load(space: str, k: str, name: str) -> Any | None:
    """The value saved under (`space`, `k`, `name`), or None: absent, unreadable, corrupted or not ours."""
    path = entry_path(space, k, name)
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
    if saved_key != k:
        return None
    _touch(path.parent)
    return value


def _touch(key_dir: Path) -> None:
    """Mark a key as used now: `_prune` keeps the most recently used keys, not the most recently made (a key
    made first and read ever since, such as the measured profile a derived one stands on, must not be the
    first to go when other keys are made)."""
    try:
        os.utime(key_dir)
    except OSError:
        pass


def save(space: str, k: str, name: str, value: Any, keep: int = KEEP_KEYS) -> bool:
    """Write `value` (builtins only) under (`space`, `k`, `name`) atomically; False, silently, when it cannot
    be. Making a new key directory removes all but the `keep` most recent ones of the space."""
    import tempfile

    path = entry_path(space, k, name)
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
            _prune(path.parent.parent, keep=path.parent.name, count=keep)
        return True
    except (OSError, ValueError):
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _prune(space_dir: Path, keep: str, count: int = KEEP_KEYS) -> None:
    """Remove all but the `count` most recently used key directories (made, or read by `load`; never `keep`);
    errors ignored (another process may be removing or filling the same directory: it then finds a miss and
    computes)."""
    import shutil

    try:
        dirs = [d for d in space_dir.iterdir() if d.is_dir() and not d.is_symlink() and d.name != keep]
        dirs.sort(key=lambda d: d.stat().st_mtime_ns, reverse=True)
    except OSError:
        return
    for d in dirs[count - 1:]:
        shutil.rmtree(d, ignore_errors=True)


def is_plain(value: Any, depth: int = 0) -> bool:
    """Only JSON-like builtins (dict, list, str, int, float, bool, None; str, int, float, bool or None keys),
    nested at most 100 deep: what a config file parses into, and what every load gives back as it was saved."""
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return True
    if depth > 100:
        return False
    if t is list:
        return all(is_plain(v, depth + 1) for v in value)
    if t is dict:
        return all((k is None or type(k) in (str, int, float, bool)) and is_plain(v, depth + 1)
                   for k, v in value.items())
    return False


# ----------------------------------------------------------------------------------------- parsed YAML
# Key of a parsed config file: the bytes of its text, and what turns them into a mapping: the loader (the
# source of k3sim/configs/loaders.py), PyYAML (its __init__.py, which carries its version) and the
# interpreter. YAML only: a JSON file parses faster than a cache entry loads.
_YAML_CODE: list[str] = []
YAML_SPACE = "configs"
YAML_KEEP = 64  # distinct config files (models, profiles, scenarios) kept; a modelling choice


def _yaml_code() -> str:
    if not _YAML_CODE:
        import importlib.util

        parts: list[str | bytes] = [sys.version]
        try:
            spec = importlib.util.find_spec("yaml")
            origin = spec.origin if spec is not None else None
            parts.append(Path(origin).read_bytes() if origin else b"no yaml")
        except (ImportError, ValueError, OSError):
            parts.append(b"no yaml")
        try:
            parts.append((Path(__file__).parent / "loaders.py").read_bytes())
        except OSError:
            parts.append(b"no loaders")
        _YAML_CODE.append(digest(*parts))
    return _YAML_CODE[0]


def yaml_key(text: str) -> str:
    return digest("yaml", _yaml_code(), text)


def cached_yaml(text: str) -> dict | None:
    """The mapping `text` parsed into the last time (`remember_yaml`), or None: a fresh copy on every call."""
    value = load(YAML_SPACE, yaml_key(text), "mapping")
    return value if type(value) is dict else None


def remember_yaml(text: str, data: dict) -> dict:
    """Keep what `text` parsed into (a mapping of plain values; anything else, a YAML date, is not kept)."""
    if type(data) is dict and is_plain(data):
        save(YAML_SPACE, yaml_key(text), "mapping", data, keep=YAML_KEEP)
    return data
