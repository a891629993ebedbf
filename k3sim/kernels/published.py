"""Kernels of the deployed stacks that were not run on the lent GPUs, priced from their published achieved
throughput: a roofline at the fraction of the datasheet the kernel's authors measured, carried to a profile's
own peaks, and never slower than the project's measured kernel for the same work (the deployed kernel is the
faster one; where the measured kernel is faster, e.g. at a launch-bound shape whose floor the published
figures do not give, the measured time stands).

    t = min(t_measured(base op), max(FLOP / (f_c x peak_bf16), bytes / (f_m x HBM bandwidth)))

f_c, f_m: the published compute and memory throughput over the datasheet of the GPU they were measured on.
Why these: attention-DP serving runs all 64-128 MLA heads of a request on one GPU, where the absorbed decode
is compute-bound; the project's split-K Triton kernel reaches 0.40x FlashMLA's published compute throughput
there (hardware_profiles/measured/h200/20261202-1gpu-deployed*/README.md) while matching its share of HBM
when memory-bound. Deployments (DeepSeek, SGLang, vLLM) run FlashMLA, so a prediction of them prices it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Published:
    base_op: str  # the measured op doing the same work
    compute_fraction: float  # published FLOP/s / the source GPU's dense BF16 peak
    memory_fraction: float  # published bytes/s / the source GPU's HBM bandwidth
    source: str


# deepseek-ai/FlashMLA README (read 2026-12, docs/sources.md "MLA decode kernels"): dense MLA
# decode on H800 SXM5 "up to 3000 GB/s in memory-bound configuration and 660 TFLOPS in computation-bound
# configuration"; H800 SXM5 datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3.
FLASHMLA = Published("mla_decode", 660e12 / 989e12, 3000e9 / 3.35e12,
                     "FlashMLA README (H800: 660 TFLOP/s compute-bound, 3000 GB/s memory-bound)")
PUBLISHED = {"mla_decode_flashmla": FLASHMLA}


def published_seconds(pub: Published, flop: float, nbytes: float, hw: Any) -> float:
    """The published roofline on `hw`: its peaks times the published fractions."""
    from k3sim.configs.profiles import peak_flops

    return max(flop / (pub.compute_fraction * peak_flops(hw, "bf16")),
               nbytes / (pub.memory_fraction * float(hw.hbm_bandwidth_bytes_per_s)))
