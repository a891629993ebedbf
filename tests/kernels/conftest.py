"""Synthetic calibrated profiles: measurements generated from known model parameters, so tests can
check that fitting recovers them and that interpolation reproduces held-out points."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from k3sim.kernels.model import AlphaBetaFit, RooflineFit
from k3sim.kernels.ops import OPS

PEAK = {"bf16": 1.0e15, "fp8": 2.0e15}
HBM_BW = 4.0e12

TRUE_GEMM = RooflineFit(launch_s=6e-6, eff_flop=0.75, half_flop=3e10, exp_flop=0.6, eff_bytes=0.85,
                        half_bytes=2e7, exp_bytes=0.7, smooth_p=5.0, peak_flops_per_s=PEAK["bf16"],
                        bandwidth_bytes_per_s=HBM_BW)
TRUE_HBM = RooflineFit(launch_s=4e-6, eff_flop=0.5, half_flop=1e9, exp_flop=0.5, eff_bytes=0.9,
                       half_bytes=5e6, exp_bytes=0.8, smooth_p=4.0, peak_flops_per_s=PEAK["bf16"],
                       bandwidth_bytes_per_s=HBM_BW)
TRUE_AB = {2: AlphaBetaFit(alpha_s=15e-6, bus_bandwidth_bytes_per_s=350e9)}

GEMM_POINTS = [dict(M=m, N=n, K=k) for n, k in [(7168, 2048), (4096, 4096), (2048, 7168)]
               for m in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]]
HBM_POINTS = [dict(bytes=2 ** e) for e in range(20, 33)]
COLL_POINTS = [dict(bytes=2 ** e, gpus=2) for e in range(10, 31)]


def hardware(calibration_dir: Path | None, name: str = "testgpu") -> SimpleNamespace:
    """A hand-built profile with the HardwareProfile fields the kernels package reads."""
    return SimpleNamespace(name=name, hbm_bandwidth_bytes_per_s=HBM_BW, peak_flops_per_s=dict(PEAK),
                           scaleup_bandwidth_bytes_per_s=450e9, scaleup_domain_gpus=8,
                           scaleout_bandwidth_bytes_per_s=50e9, num_sms=132,
                           calibration_dir=str(calibration_dir) if calibration_dir else None)


def true_seconds(op: str, p: dict, wiggle: float = 0.0) -> float:
    """Ground truth: the known model, times a smooth deterministic wiggle in log-parameter space."""
    spec = OPS[op]
    if spec.kind == "collective":
        t = float(TRUE_AB[p["gpus"]].seconds(spec.bytes(p)))
    else:
        true = TRUE_HBM if spec.family == "hbm" else TRUE_GEMM
        t = float(true.seconds(spec.flop(p), spec.bytes(p)))
    phase = sum(math.log2(p[k]) for k in spec.params if k not in spec.categorical)
    return t * (1.0 + wiggle * math.sin(0.7 * phase))


def write_run(root: Path, run_id: str, data: dict[str, list[dict]], *, wiggle: float = 0.0, noise: float = 0.0,
              failed: bool = True, seed: int = 0) -> Path:
    """One harness-shaped run directory: provenance.yaml and <op>.csv files (plus a failed row each)."""
    rng = np.random.default_rng(seed)
    run = root / run_id
    run.mkdir(parents=True)
    (run / "provenance.yaml").write_text('gpu_name: "Synthetic GPU"\ncommand: "pytest"\ndate_utc: "2026-01-01"\n')
    for op, points in data.items():
        spec = OPS[op]
        cols = list(spec.params) + ["seconds", "seconds_p20", "seconds_p80", "reps", "status", "error"]
        lines = [",".join(cols)]
        for p in points:
            t = true_seconds(op, p, wiggle) * math.exp(rng.normal(0.0, noise)) if noise else true_seconds(op, p, wiggle)
            lines.append(",".join([str(p[k]) for k in spec.params] + [f"{t:.9g}", f"{t * 0.99:.9g}", f"{t * 1.01:.9g}",
                                                                     "25", "ok", ""]))
        if failed:
            big = {k: 2 ** 20 if k != "gpus" else 2 for k in spec.params}
            lines.append(",".join([str(big[k]) for k in spec.params] + ["", "", "", "0", "failed", '"CUDA out of memory"']))
        (run / f"{op}.csv").write_text("\n".join(lines) + "\n")
    return run


@pytest.fixture
def synth(tmp_path):
    """A calibrated synthetic profile (GEMM, HBM copy, all-gather on 2 GPUs) and its hardware object."""
    from k3sim.kernels.predict import clear_cache

    root = tmp_path / "measured" / "testgpu"
    write_run(root, "run1", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS, "all_gather": COLL_POINTS},
              wiggle=0.03)
    clear_cache()
    yield SimpleNamespace(root=root, hw=hardware(root))
    clear_cache()
