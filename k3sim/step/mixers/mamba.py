"""Mamba-1 (selective scan; Jamba) as vLLM's MambaMixer runs it (vllm/model_executor/layers/mamba/mamba_mixer.py):
the column-parallel in_proj (x and the gate z), the short conv over x (+ conv state), the row-parallel x_proj
(d_inner -> dt_rank + 2N, its partial sums all-reduced over TP before Jamba's dt/B/C RMSNorms), the
column-parallel dt_proj, the selective scan (z gate, D skip and softplus(dt) inside the kernel: decode
`selective_state_update`, prefill `selective_scan_fn` from the cached state) and the row-parallel out_proj.

No Mamba-1 kernel is measured. The scan borrows the measured Mamba2 kernels at the same state, the d_inner / tp
channels of a rank taken as heads of P = 64 channels (d_inner = H x P, the state H x P x N elements in fp32):
- decode: `mamba2_decode` {B, H, P = 64, N}: the same per-element work (decay, dt x B update, contraction with
  C) and the same bytes (the fp32 state read and written, x, z and y per channel), one B and C per token;
- prefill: `mamba2_chunk_fwd` {T, H, K = N, V = P}: the SSD chunk form reads B and C per head where Mamba-1
  reads them once per token and computes the intra-chunk quadratic form a sequential scan does not, so its FLOP
  are above and its bytes below the selective scan's: a proxy, labelled so in the step's rows and extras."""

from __future__ import annotations

import math
from typing import Iterator

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers.common import MixerCalls, _c, all_reduce, gemm, linear_dtype, rmsnorm, short_conv

HEAD_CHANNELS = 64  # P of the borrowed Mamba2 kernels: the measured Mamba2 head_dim (kernels.ops.MAMBA2_HEAD_DIM)


def proxy_heads(channels: int) -> tuple[int, int]:
    """(H, P) with H x P = `channels`, P = 64 where it divides them (else their largest common divisor)."""
    p = math.gcd(channels, HEAD_CHANNELS)
    return channels // p, p


def mamba_body(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    cfg, d, t, M = model.mamba, model.hidden_size, layout.tp, batch.tokens
    di, N, r = cfg.inner_size / t, cfg.state_size, cfg.dt_rank
    dt = linear_dtype(model, "mamba")
    yield gemm("mamba_in_proj", M, 2 * di, d, dt)
    yield from short_conv("mamba_short_conv", batch, _c(di), cfg.conv_kernel_size)
    yield gemm("mamba_x_proj", M, r + 2 * N, di, dt)
    if t > 1:
        yield all_reduce("mamba_x_proj_all_reduce", M * (r + 2 * N) * BF16, t)
    if cfg.inner_norms:
        yield rmsnorm("mamba_dt_norm", M, r)
        yield rmsnorm("mamba_b_norm", M, N)
        yield rmsnorm("mamba_c_norm", M, N)
    yield gemm("mamba_dt_proj", M, di, r, dt)
    H, P = proxy_heads(_c(di))
    if batch.num_decode:
        yield Call("mamba_recurrent", "mamba2_decode", {"B": batch.num_decode, "H": H, "P": P, "N": N},
                   count=batch.tokens_per_decode)
    for chunk, _prefix in batch.prefill:
        yield Call("mamba_chunk_prefill", "mamba2_chunk_fwd", {"T": chunk, "H": H, "K": N, "V": P})
    yield gemm("mamba_o_proj", M, d, di, dt)


CALLS = MixerCalls(
    "mamba", mamba_body, core={"mamba_recurrent": "Mamba state", "mamba_chunk_prefill": "Mamba prefill"},
    per_chunk=("mamba_chunk_prefill",),
    proxies={"mamba_recurrent": "proxy: Mamba-1 selective_state_update priced as the measured mamba2_decode at the "
                                "same state (d_inner/tp channels as heads of 64, N = d_state): equal FLOP and bytes",
             "mamba_chunk_prefill": "proxy: Mamba-1 selective scan priced as the measured mamba2_chunk_fwd (SSD) at "
                                    "the same state (K = d_state, V = 64): FLOP above, bytes below the scan's"})
