"""The disk cache of what `k3sim cp` fits from a profile's measurements on every call: the intra-device KDA
parameters (`validate.fit_intra`) and the KCP parts with their fits and fixed costs (`kcp_parts.load_parts`),
so a warm query reads neither the parsed store nor the part CSVs through pandas, and refits nothing.

Keyed, never stale: an entry's key is the sha256 of the kernel predictor's own key (every measured op file and
provenance, the fit file, the hardware fields it reads, the kernels code and library versions:
`k3sim.kernels.predict.ProfilePredictor`), the measured-data directory, every field of the hardware profile, the
source of k3sim/cp, k3sim/comm and k3sim/predict.py (the fits, the document geometry, the kernel and
collective times inside the fixed costs), and the bytes of the files read here that the predictor does not
read (`extra`: the KCP part and two-GPU KCP CSVs). A value is saved only after it was computed from those
files; any change of a byte, a field or the code is another key. Storage is `k3sim.configs.diskcache` (its
"cp" space): builtins only, checked, written atomically. Where no key can be made (no measured data, a
stand-in profile the predictor does not take) nothing is cached and the caller computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPACE = "cp"
_CODE: list[str] = []


def hardware_fingerprint(hw: Any) -> str:
    """Every field of the profile (a HardwareProfile's JSON; another object's repr)."""
    dump = getattr(hw, "model_dump_json", None)
    return dump() if callable(dump) else repr(hw)


def files_digest(paths: list[Path]) -> str:
    """sha256 of the names and bytes of `paths` (the files the predictor does not fingerprint)."""
    from k3sim.configs.diskcache import digest
    from k3sim.kernels.store import read_measured  # the one measured-file reader: a regular file, capped

    return digest(*(part for p in paths for part in (str(p), read_measured(p, "measured CSV"))))


def entry_key(hw: Any, root: Path | None, *extra: str) -> str | None:
    """The key of `hw`'s entries over the data under `root`, or None (then nothing is cached)."""
    if root is None:
        return None
    from k3sim.configs.diskcache import digest
    from k3sim.kernels.cache import source_digest
    from k3sim.kernels.predict import profile_predictor

    try:
        predictor_key = getattr(profile_predictor(hw), "_key", None)
    except Exception:  # noqa: BLE001 - no key, no cache: the computation itself reports what is wrong
        return None
    if not predictor_key:
        return None
    if not _CODE:
        _CODE.append(source_digest("cp", "comm", "predict.py"))
    return digest("k3sim-cp/1", predictor_key, str(Path(root).resolve()), hardware_fingerprint(hw), _CODE[0],
                  *extra)


def load(k: str | None, name: str) -> Any | None:
    if k is None:
        return None
    from k3sim.configs import diskcache

    return diskcache.load(SPACE, k, name)


def save(k: str | None, name: str, value: Any) -> None:
    if k is not None:
        from k3sim.configs import diskcache

        diskcache.save(SPACE, k, name, value)
