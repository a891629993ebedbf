"""Exact reference math of Kimi Delta Attention (KDA) and of its context parallelism (KCP).

numpy float64, small sizes: this is the executable specification the time model in `k3sim.cp`
rests on, not a fast kernel. Shapes follow flash-linear-attention: q, k [T, H, K], v [T, H, V],
per-dim decay alpha [T, H, K] in (0, 1], beta [T, H]; states [H, K, V].
"""

from k3sim.kda.affine import Affine, compose, fold
from k3sim.kda.backward import kcp_state_grads, loss_with_injection, segment_backward_pair
from k3sim.kda.chunkwise import kda_chunkwise, segment_transition
from k3sim.kda.conv import short_conv, short_conv_cp
from k3sim.kda.kcp import KCPResult, kcp_forward, rank_contexts
from k3sim.kda.recurrence import kda_naive

__all__ = [
    "Affine", "compose", "fold", "kda_naive", "kda_chunkwise", "segment_transition",
    "short_conv", "short_conv_cp", "KCPResult", "kcp_forward", "rank_contexts",
    "kcp_state_grads", "loss_with_injection", "segment_backward_pair",
]
