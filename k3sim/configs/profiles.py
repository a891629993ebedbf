"""Resolve `hardware` (profile name, path or HardwareProfile) to the profile and its measured dir.

Hardware profiles and their loading belong to configs, the bottom of the model: kernels, comm, step and
validation all read a profile's measured directory and datasheet figures from here. Only the fields listed
in DEVELOPING.md ("HardwareProfile") are read, by attribute, so a small hand-built object works in tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from k3sim.errors import InputError

PROFILES_DIR = Path(__file__).resolve().parents[2] / "hardware_profiles"


def profiles_dir() -> Path:
    """`hardware_profiles/` of the repository; K3SIM_HARDWARE_PROFILES overrides (tests, installs)."""
    env = os.environ.get("K3SIM_HARDWARE_PROFILES")
    return Path(env) if env else PROFILES_DIR


def load_profile(hardware: Any) -> Any:
    if isinstance(hardware, (str, os.PathLike)):
        from k3sim.configs.loaders import load_hardware

        return load_hardware(str(hardware))
    if not hasattr(hardware, "peak_flops_per_s"):
        raise InputError(f"hardware must be a profile name, a path or a HardwareProfile, got {type(hardware).__name__}",
                         field="hardware")
    return hardware


def measured_dir(hw: Any) -> Path | None:
    """The profile's measured-data directory, or None when it is uncalibrated.

    `calibration_dir` is relative to `hardware_profiles/` (or absolute). When the field is absent
    or None the conventional `measured/<name>` is used if it exists.
    """
    if getattr(hw, "derived_from", None) is not None:  # no data of its own: the predictor rescales its source's
        return None  # (k3sim.kernels.store.Derivation); validation, calibrate, KCP parts and the glue fit see none
    rel = getattr(hw, "calibration_dir", None)
    if rel:
        path = Path(rel)
        path = path if path.is_absolute() else profiles_dir() / path
        if not path.is_dir():  # a typo or data not installed: never a silent datasheet answer (issue 11)
            raise InputError(f"{uncalibrated_reason(hw)} (a typo, or measured data not installed); fix the path "
                             "or remove the field to use datasheet figures", source=str(hw.name),
                             field="calibration_dir")
        return path
    conv = profiles_dir() / "measured" / str(hw.name)
    return conv if conv.is_dir() else None


def derived_source(hw: Any) -> Any | None:
    """The measured profile a derived profile (`derived_from`) rescales, checked; None for any other profile.

    The derivation (`k3sim.kernels.store.Derivation`) keeps compute-bound times and rescales memory and link
    time, which holds only between GPUs of one compute configuration: the source must have measured data of its
    own, not be derived itself, and have the same dense peaks per dtype and the same SM count (H100 SXM, H800
    and H200 are one GH100 SXM die; docs/sources.md "Derived hardware profiles"). Anything else is refused naming `derived_from`."""
    spec = getattr(hw, "derived_from", None)
    if spec is None:
        return None
    ref = spec.profile
    src = load_profile(ref)
    where = f"profile '{hw.name}' is derived from '{getattr(src, 'name', ref)}'"
    if getattr(src, "derived_from", None) is not None:
        raise InputError(f"{where}, itself a derived profile: name the measured profile it comes from",
                         source=str(hw.name), field="derived_from")
    if measured_dir(src) is None:
        raise InputError(f"{where}, which has no measured data ({uncalibrated_reason(src)}): name a calibrated "
                         "profile", source=str(hw.name), field="derived_from")
    own, theirs = dict(hw.peak_flops_per_s or {}), dict(src.peak_flops_per_s or {})
    if own != theirs or int(hw.num_sms) != int(src.num_sms):
        raise InputError(f"{where}, whose compute differs (dense peaks per dtype or SMs: bf16 "
                         f"{theirs.get('bf16', 0):.4g} FLOP/s and {src.num_sms} SMs against {own.get('bf16', 0):.4g} "
                         f"and {hw.num_sms}): compute-bound times are kept, which holds only between GPUs of one "
                         "compute configuration", source=str(hw.name), field="derived_from")
    return src


def uncalibrated_reason(hw: Any) -> str:
    """Why `measured_dir(hw)` is None, in words: a named calibration_dir that is missing (a typo, data
    not installed) is said so, not passed off as a profile nobody calibrated."""
    rel = getattr(hw, "calibration_dir", None)
    if rel:
        return f"profile '{hw.name}' names calibration_dir '{rel}', which is not a directory"
    return f"profile '{hw.name}' is uncalibrated (no measured data directory)"


def peak_flops(hw: Any, dtype: str) -> float:
    peaks = dict(hw.peak_flops_per_s or {})
    if dtype not in peaks or not peaks[dtype]:
        raise InputError(f"profile '{hw.name}' has no {dtype} peak FLOP/s", field="peak_flops_per_s")
    return float(peaks[dtype])


def link_bandwidth(hw: Any, gpus: int) -> tuple[float, str]:
    """Per-GPU one-direction bandwidth for a collective over `gpus` ranks, and which field it is."""
    domain = int(getattr(hw, "scaleup_domain_gpus", 0) or 0)
    if gpus <= domain or not getattr(hw, "scaleout_bandwidth_bytes_per_s", None):
        return float(hw.scaleup_bandwidth_bytes_per_s), "scaleup_bandwidth_bytes_per_s"
    return float(hw.scaleout_bandwidth_bytes_per_s), "scaleout_bandwidth_bytes_per_s"
