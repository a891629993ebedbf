"""A private on-disk cache of what a profile's kernel predictor is built from, so a what-if query does not
parse 62 measured CSVs with pandas and rebuild every op's points on each start (~1.5 s of a 2 s query).

Where it lives, the file format and the safe loading (pickle of builtins, no globals, a checksum and the key
in every file, atomic writes) are `k3sim.configs.diskcache`'s; the entries here are under its "kernels" space.

Keyed, never stale: an entry's key is the sha256 of the bytes of every measured file the store reads
(`store.read_files`, content and not mtimes: a same-size rewrite within the file system's clock tick keeps
the mtime), of `fitted.yaml`, of the hardware fields the fits and the physical check read, of the source of
every module whose code shapes a cached value (`code_fingerprint`) and of the Python, numpy, pandas, scipy
and PyYAML versions (their installed `.dist-info`, `library_version`). An entry is written only after the
store built from those bytes passed its validation (`load_store`: every row in range, none beyond the
datasheet roofline; `read_fitted`), so a hit stands for data that was validated; any change of data, code or
versions is another key and is rebuilt.

Values are builtins; numpy arrays and scalars travel as dtype, shape and raw bytes (`to_plain`, `from_plain`),
so float bits and NaN round-trip exactly.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from k3sim.configs import diskcache
from k3sim.configs.diskcache import ENV, FORMAT, KEEP_KEYS, MAX_ENTRY_BYTES, _NoGlobals, cache_dir  # noqa: F401

SPACE = "kernels"

# Source whose code shapes a cached value: all of k3sim/kernels (reading and validating rows, ops' ranges and
# formulas, points, fits, the physical check), the reader, the bounds table and the hardware-profile helpers.
_CODE_DIRS = ("kernels",)
_CODE = ("reader.py", "errors.py", "configs/bounds.py", "configs/dtypes.py", "configs/profiles.py")
# (import name, distribution name) of the libraries whose versions are in every key
_LIBRARIES = (("numpy", "numpy"), ("pandas", "pandas"), ("scipy", "scipy"), ("yaml", "PyYAML"))
_code_fp: list[str] = []


def library_version(module: str, dist: str) -> str:
    """The installed version of `dist` (whose top-level package is `module`), read from its `.dist-info`
    directory beside the package: importlib.metadata finds the same directory but costs ~30 ms to import and
    scan (a third of a warm query). Falls back to importlib.metadata where there is no such directory (an
    egg, a zip); "none" when the library is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return "none"
    site = Path(spec.origin).parent.parent if spec.submodule_search_locations else Path(spec.origin).parent
    want = dist.lower().replace("-", "_").replace(".", "_")
    try:
        names = sorted(n for n in os.listdir(site) if n.endswith(".dist-info")
                       and n[:-len(".dist-info")].rpartition("-")[0].lower().replace("-", "_").replace(".", "_")
                       == want)
    except OSError:
        names = []
    if names:
        return ",".join(n[:-len(".dist-info")].rpartition("-")[2] for n in names)
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "none"


def code_fingerprint() -> str:
    """sha256 of the k3sim version, the source of `_CODE_DIRS` and `_CODE`, and the interpreter's and libraries'
    versions (once per process). A missing library or file counts as its own version."""
    if not _code_fp:
        from k3sim import __version__

        h = hashlib.sha256(f"{__version__}\0{sys.version}\0".encode())
        package = Path(__file__).resolve().parents[1]
        files = [str(p.relative_to(package)) for d in _CODE_DIRS for p in sorted((package / d).glob("*.py"))]
        for rel in [*files, *_CODE]:
            try:
                h.update(rel.encode() + b"\0" + (package / rel).read_bytes())
            except OSError:
                h.update(rel.encode() + b"\0missing")
        for module, dist in _LIBRARIES:
            h.update(f"{dist}={library_version(module, dist)}\0".encode())
        _code_fp.append(h.hexdigest())
    return _code_fp[0]


def source_digest(*paths: str) -> str:
    """sha256 of the source of `paths` (files or directories of .py files, relative to the k3sim package), for
    a cache key over code outside kernels (`k3sim.cp`'s entries)."""
    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in paths:
        target = package / rel
        files = sorted(target.glob("*.py")) if target.is_dir() else [target]
        for f in files:
            name = str(f.relative_to(package)).encode()
            try:
                h.update(name + b"\0" + f.read_bytes())
            except OSError:
                h.update(name + b"\0missing")
    return h.hexdigest()


def key(*parts: str) -> str:
    """An entry key: sha256 of the code fingerprint and `parts` (data digests, hardware fields, paths)."""
    h = hashlib.sha256(code_fingerprint().encode())
    for p in parts:
        b = str(p).encode("utf-8", errors="surrogateescape")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _path(k: str, name: str) -> Path | None:
    return diskcache.entry_path(SPACE, k, name)


def load(k: str, name: str) -> Any | None:
    """The value saved under (`k`, `name`), or None: absent, unreadable, corrupted or not ours."""
    return diskcache.load(SPACE, k, name)


def save(k: str, name: str, value: Any) -> bool:
    """Write `value` (builtins only) under (`k`, `name`) atomically; False, silently, when it cannot be."""
    return diskcache.save(SPACE, k, name, value)


def _prune(kernels: Path, keep: str) -> None:
    diskcache._prune(kernels, keep)


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
