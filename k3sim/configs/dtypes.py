"""Bytes per element of the number formats k3sim knows.

Block-scaled formats count their shared scales (OCP Microscaling spec v1.0): MXFP4 is 32 E2M1 values
(16 B) plus one E8M0 scale (1 B) = 17 B / 32 = 4.25 bits; MXFP8 is 32 x E4M3 + E8M0 = 8.25 bits; NVFP4 is
16 x E2M1 + one E4M3 scale = 4.5 bits (its single per-tensor fp32 scale is ignored).
"""

from __future__ import annotations

from k3sim.errors import InputError

BITS_PER_ELEMENT: dict[str, float] = {
    "fp32": 32,
    "tf32": 32,  # stored in 32-bit words
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,
    "fp8_e4m3": 8,
    "fp8_e5m2": 8,
    "int8": 8,
    "int4": 4,
    "mxfp8": (32 * 8 + 8) / 32,  # 8.25
    "mxfp4": (32 * 4 + 8) / 32,  # 4.25
    "nvfp4": (16 * 4 + 8) / 16,  # 4.5
}

DTYPES = tuple(BITS_PER_ELEMENT)


def bytes_per_element(name: str) -> float:
    """Bytes per element of dtype `name` (e.g. "bf16" -> 2.0, "mxfp4" -> 0.53125)."""
    key = str(name).lower()
    if key not in BITS_PER_ELEMENT:
        raise InputError(f"unknown dtype '{name}' (known: {', '.join(DTYPES)})", field="dtype")
    return BITS_PER_ELEMENT[key] / 8


def check_dtype(name: str) -> str:
    """Pydantic helper: accept a known dtype name (lower-cased), reject anything else."""
    key = str(name).lower()
    if key not in BITS_PER_ELEMENT:
        raise ValueError(f"unknown dtype '{name}' (known: {', '.join(DTYPES)})")
    return key
