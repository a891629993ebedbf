"""Kimi Delta Attention as vLLM's KimiDeltaAttention runs it (MISSION sec. 1, 3): merged q/k/v projection,
short conv (+ conv state), decay gate (low rank a/b or full) and beta projections, the KDA kernel (decode:
`recurrent_kda_decode`, the state read and written in the kernel; prefill: `chunk_kda_fwd` from the cached
state), the sigmoid-gated output RMSNorm and o_proj."""

from __future__ import annotations

from typing import Iterator

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers.common import MixerCalls, _c, gemm, linear_dtype, low_rank_or_full, short_conv


def kda_body(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    kda, d, t, M = model.kda, model.hidden_size, layout.tp, batch.tokens
    h = kda.num_heads / t
    dk, dv = kda.head_dim_k, kda.head_dim_v
    H = _c(h)
    dt = linear_dtype(model, "kda")
    yield gemm("kda_qkv_proj", M, h * (2 * dk + dv), d, dt)
    yield from short_conv("kda_short_conv", batch, _c(h * (2 * dk + dv)), kda.conv_kernel_size)
    yield from low_rank_or_full("kda_decay_gate", M, h * dk, d, kda.alpha_gate_rank, dt)
    yield gemm("kda_beta_proj", M, h, d, dt)
    if batch.num_decode:
        yield Call("kda_recurrent", "recurrent_kda_decode",
                   {"B": batch.num_decode, "T": batch.tokens_per_decode, "H": H})
    for chunk, _prefix in batch.prefill:
        yield Call("kda_chunk_prefill", "chunk_kda_fwd", {"T": chunk, "H": H})
    yield from low_rank_or_full("kda_out_gate", M, h * dv, d, kda.output_gate_rank, dt)
    yield Call("kda_out_norm", "gated_rmsnorm", {"T": M * H, "D": dv}, proxy_bytes=3 * M * h * dv * BF16)
    yield gemm("kda_o_proj", M, d, h * dv, dt)


CALLS = MixerCalls("kda", kda_body, core={"kda_recurrent": "KDA state", "kda_chunk_prefill": "KDA prefill"},
                   per_chunk=("kda_chunk_prefill",))
