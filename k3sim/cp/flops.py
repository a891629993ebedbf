"""FLOP counts of the chunkwise KDA pieces, per chunk of C tokens and per head.

Used only as *ratios* to a measured or predicted `chunk_kda_fwd` time, for work the kernel predictor
does not cover: KCP's pre-process pass (the state and transition of the last local segment) and
LASP-2's local state. Terms follow `k3sim/kda/chunkwise.py` (and fla `chunk_kda`, chunk C = 64).
"""

from __future__ import annotations

FLA_CHUNK = 64  # fla chunk_kda chunk size


def chunk_fwd_flops(C: int = FLA_CHUNK, K: int = 128, V: int = 128) -> dict[str, float]:
    """chunk_kda forward per chunk and head, split into the parallel (intra-chunk) and serial (state) parts:
    the one formula, `kernels.ops.kda_fwd_flop_terms`."""
    from k3sim.kernels.ops import kda_fwd_flop_terms

    return kda_fwd_flop_terms(C, K, V)


def kcp_preprocess_flops(C: int = FLA_CHUNK, K: int = 128, V: int = 128) -> float:
    """Extra work of KCP's pre-process on the last local segment (W, U~ shared with the main kernel):
    S~ state pass (2 x 2CKV), M_t = Diag(gamma) - (Gamma K)^T W (2CK^2) and M <- M_t M (2K^3)
    (fla `chunk_delta_h.py` pre-process, `KCP.md`)."""
    return 2 * 2.0 * C * K * V + 2.0 * C * K * K + 2.0 * K ** 3


def kcp_preprocess_factor(C: int = FLA_CHUNK, K: int = 128, V: int = 128) -> float:
    """Pre-process time as a fraction of a chunk_kda forward over the same tokens (FLOP ratio): 0.90."""
    return kcp_preprocess_flops(C, K, V) / chunk_fwd_flops(C, K, V)["total"]


def lasp2_local_state_factor(C: int = FLA_CHUNK, K: int = 128, V: int = 128) -> float:
    """LASP-2's local state sum_t k_t v_t^T (2CKV per chunk, parallel) relative to the forward."""
    return 2.0 * C * K * V / chunk_fwd_flops(C, K, V)["total"]
