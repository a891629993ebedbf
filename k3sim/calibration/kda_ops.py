"""flash-linear-attention KDA kernels on one GPU: chunk_kda forward, forward+backward, and the
fused recurrent decode step (1..8 tokens per request for speculative verification).

Inputs follow K3's layer (domain-facts.md 2.2 and 1.5): K = V = 128, q/k L2-normalised in the
kernel, gate computed in the kernel with safe_gate and lower_bound = -5 (K3's gate_lower_bound),
beta in post-sigmoid space, bf16 activations, fp32 recurrent state.
"""

from __future__ import annotations

import os
from pathlib import Path

from k3sim.calibration.records import OpWriter
from k3sim.calibration.timing import time_cuda
from k3sim.calibration.torch_ops import sweep

HEAD_DIM = 128
K3_GATE_LOWER_BOUND = -5.0
KDA_OPTIONS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=True,
                   lower_bound=K3_GATE_LOWER_BOUND)


def kda_inputs(T: int, H: int, *, B: int = 1, grad: bool = False, seed: int = 0):
    """Random KDA layer inputs of one (packed) sequence; the same seed gives the same tensors."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, device="cuda", generator=g, dtype=torch.float32).to(dtype).requires_grad_(grad)

    q, k, v = r(B, T, H, HEAD_DIM), r(B, T, H, HEAD_DIM), r(B, T, H, HEAD_DIM)
    gate = r(B, T, H, HEAD_DIM)
    beta = torch.rand((B, T, H), device="cuda", generator=g).to(torch.bfloat16).requires_grad_(grad)
    A_log = torch.zeros(H, device="cuda", dtype=torch.float32)
    dt_bias = torch.zeros(H * HEAD_DIM, device="cuda", dtype=torch.float32)
    return dict(q=q, k=k, v=v, g=gate, beta=beta, A_log=A_log, dt_bias=dt_bias)


def _fla():
    os.environ.setdefault("FLA_FLASH_KDA", "0")  # measure fla's Triton kernels, not the CUTLASS backend
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    return chunk_kda, fused_recurrent_kda


def chunk_fwd(out_dir: Path, deadline: float, heads: list[int], lengths: list[int]) -> int:
    import torch

    chunk_kda, _ = _fla()
    w = OpWriter(out_dir, "chunk_kda_fwd", ["T", "H"])

    def measure(T, H):
        x = kda_inputs(T, H)
        with torch.no_grad():
            return time_cuda(lambda: chunk_kda(**x, **KDA_OPTIONS), budget_s=2.0), {}

    return sweep(w, [dict(T=t, H=h) for h in heads for t in lengths], measure, deadline)


def chunk_fwd_bwd(out_dir: Path, deadline: float, heads: list[int], lengths: list[int]) -> int:
    import torch

    chunk_kda, _ = _fla()
    w = OpWriter(out_dir, "chunk_kda_fwd_bwd", ["T", "H"])

    def measure(T, H):
        x = kda_inputs(T, H, grad=True)
        leaves = [x[n] for n in ("q", "k", "v", "g", "beta")]
        do = torch.randn_like(x["q"])

        def step():
            o, _ = chunk_kda(**x, **KDA_OPTIONS)
            o.backward(do)

        def reset():
            for t in leaves:
                t.grad = None

        return time_cuda(step, before_each=reset, budget_s=3.0), {}

    return sweep(w, [dict(T=t, H=h) for h in heads for t in lengths], measure, deadline)


def recurrent_decode(out_dir: Path, deadline: float, heads: list[int], batches: list[int],
                     tokens: list[int]) -> int:
    """One decode/verify step: B requests, T tokens each, state [B, H, 128, 128] fp32 read and written."""
    import torch

    _, fused_recurrent_kda = _fla()
    w = OpWriter(out_dir, "recurrent_kda_decode", ["B", "T", "H"])

    def measure(B, T, H):
        x = kda_inputs(T, H, B=B)
        h0 = torch.randn((B, H, HEAD_DIM, HEAD_DIM), device="cuda", dtype=torch.float32)
        with torch.no_grad():
            return time_cuda(lambda: fused_recurrent_kda(**x, initial_state=h0, output_final_state=True,
                                                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                                         lower_bound=K3_GATE_LOWER_BOUND)), {}

    cases = [dict(B=b, T=t, H=h) for h in heads for t in tokens for b in batches]
    return sweep(w, cases, measure, deadline)
