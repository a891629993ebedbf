"""Mamba2 (SSD; Nemotron-H, Nemotron 3, Granite-4.0-H, Falcon-H1) as vLLM's MambaMixer2 runs it
(vllm/model_executor/layers/mamba/mamba_mixer2.py): the column-parallel in_proj (z, x, B, C, dt), the short conv
over x, B, C (+ conv state), the SSM (decode: the selective state update, op `mamba2_decode`, our Triton kernel of
mamba_ssm's `selective_state_update`; prefill: the chunked scan from the cached state, op `mamba2_chunk_fwd`, fla's
simple-GLA form of SSD with K = d_state, V = head_dim), the gated RMSNorm with z (Mixer2RMSNormGated; a plain
y * silu(z) where the model has no norm, Falcon-H1 without `mamba_rms_norm`) and the row-parallel out_proj.

TP splits the heads; a single B/C group is held whole by every rank (configs/kinds/mamba2.py), and then the gated
norm, whose group spans all of d_inner, sums its squares over the ranks: one all-reduce of one fp32 per token
(Mixer2RMSNormGated: "n_groups == 1 and tp_size > 1", tensor_model_parallel_all_reduce of the local sums)."""

from __future__ import annotations

from typing import Iterator

from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers.common import FP32, MixerCalls, _c, all_reduce, gemm, linear_dtype, short_conv, swiglu


def mamba2_body(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    cfg, d, t, M = model.mamba2, model.hidden_size, layout.tp, batch.tokens
    h = cfg.num_heads / t
    groups = MIXERS["mamba2"].tp_rules(cfg)[1].per_rank(t)  # G / tp, or the one replicated group
    P, N = cfg.head_dim, cfg.state_size
    inner, bc = h * P, 2 * groups * N
    dt = linear_dtype(model, "mamba2")
    yield gemm("mamba2_in_proj", M, 2 * inner + bc + h, d, dt)
    yield from short_conv("mamba2_short_conv", batch, _c(inner + bc), cfg.conv_kernel_size)
    H = _c(h)
    if batch.num_decode:
        # one state update per token a sequence feeds (q = 1 + MTP drafts: q updates in sequence)
        yield Call("mamba2_recurrent", "mamba2_decode", {"B": batch.num_decode, "H": H, "P": P, "N": N},
                   count=batch.tokens_per_decode)
    for chunk, _prefix in batch.prefill:
        yield Call("mamba2_chunk_prefill", "mamba2_chunk_fwd", {"T": chunk, "H": H, "K": N, "V": P})
    if cfg.gated_norm:
        yield Call("mamba2_out_norm", "gated_rmsnorm", {"T": M, "D": _c(inner)}, proxy_bytes=3 * M * inner * BF16)
        if cfg.n_groups == 1 and t > 1:
            yield all_reduce("mamba2_norm_all_reduce", M * FP32, t)
    else:
        yield swiglu("mamba2_out_gate", M, inner)  # y * silu(z)
    yield gemm("mamba2_o_proj", M, d, inner, dt)


CALLS = MixerCalls("mamba2", mamba2_body,
                   core={"mamba2_recurrent": "Mamba2 state", "mamba2_chunk_prefill": "Mamba2 prefill"},
                   per_chunk=("mamba2_chunk_prefill",))
