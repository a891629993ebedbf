"""A kernel-time stand-in with simple, known costs (plain functions; no second conftest.py)."""

from __future__ import annotations

from types import SimpleNamespace

from k3sim.cp.comm import wire_bytes
from k3sim.cp.geometry import CPGeometry

LINK = 4e11          # bytes/s the fake collectives move
ALPHA = 1e-5         # seconds per fake collective call
KDA_S_PER_TOKEN_HEAD = 1e-10
SDPA_FLOPS = 5e14
GEMM_FLOPS = 6e14


def fake_kernel_time(op: str, p: dict, hw) -> SimpleNamespace:
    if op in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv"):
        return SimpleNamespace(seconds=ALPHA + wire_bytes(op, p["bytes"], p["gpus"]) / LINK, source="fake")
    if op == "chunk_kda_fwd":
        return SimpleNamespace(seconds=2e-5 + p["T"] * p["H"] * KDA_S_PER_TOKEN_HEAD, source="fake")
    if op == "chunk_kda_fwd_bwd":
        return SimpleNamespace(seconds=6e-5 + 3 * p["T"] * p["H"] * KDA_S_PER_TOKEN_HEAD, source="fake")
    if op.startswith("sdpa_causal"):
        flop = 2.0 * p["T"] * (p["T"] + 1) * p["H"] * p["D"] * (3.5 if "bwd" in op else 1.0)
        return SimpleNamespace(seconds=flop / SDPA_FLOPS, source="fake")
    if op == "gemm_bf16":
        return SimpleNamespace(seconds=2.0 * p["M"] * p["N"] * p["K"] / GEMM_FLOPS, source="fake")
    raise KeyError(op)


def hw(domain: int = 8, scaleup: float = 4.5e11, scaleout: float = 5e10) -> SimpleNamespace:
    return SimpleNamespace(name="fakegpu", scaleup_domain_gpus=domain, scaleup_bandwidth_bytes_per_s=scaleup,
                           scaleout_bandwidth_bytes_per_s=scaleout, num_sms=132, peak_flops_per_s={"bf16": 1e15})


def k3(tp: int = 1) -> CPGeometry:
    """K3's attention geometry typed from the public config (domain-facts.md sec. 2.2)."""
    return CPGeometry(hidden_size=7168, kda_heads=96, num_kda_layers=69, mla_heads=96, num_mla_layers=24, tp=tp,
                      name="k3-test")
