"""Lightning attention (MiniMax-M1 / Text-01) as vLLM's MiniMaxText01LinearAttention runs it
(vllm/model_executor/models/minimax_text_01.py): the column-parallel qkv_proj, silu over q, k, v (in fp32), the
linear attention with a fixed per-head decay (prefill: `lightning_attention` chunk-wise from the cached state;
decode: `linear_decode_forward_triton`, S <- exp(-slope) S + k^T v, o = q S), the RMSNorm over the heads' outputs
sharded over TP (MiniMaxText01RMSNormTP: the variance all-reduced, one fp32 per token), the column-parallel
output gate (sigmoid(gate) x the normed output) and the row-parallel out_proj.

No lightning kernel is measured. Its computation is simple gated linear attention with a constant scalar decay per
head, which is what the measured Mamba2 kernels run (fla `chunk_simple_gla` for the chunked scan; the state
update of our Triton kernel): prefill borrows `mamba2_chunk_fwd` {T, H, K = V = head_dim} (the same products per
chunk, plus a per-step decay read the fixed slope does not need), decode `mamba2_decode` {B, H, P = N = head_dim}
(the same fp32 state read and written and the same 5 operations per state element; one shared B/C pair per token
where lightning reads q and k per head, a few per cent of the state's bytes). Labelled proxies in the step."""

from __future__ import annotations

from typing import Iterator

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers.common import (FP32, MixerCalls, _c, all_reduce, elementwise, gemm, linear_dtype,
                                      rmsnorm)


def lightning_body(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    cfg, d, t, M = model.lightning, model.hidden_size, layout.tp, batch.tokens
    h, D = cfg.num_heads / t, cfg.head_dim
    inner = h * D
    dt = linear_dtype(model, "lightning")
    yield gemm("lightning_qkv_proj", M, 3 * inner, d, dt)
    yield elementwise("lightning_qkv_act", "silu", M, 3 * inner, streams=3)  # bf16 in, fp32 out
    H = _c(h)
    if batch.num_decode:
        yield Call("lightning_recurrent", "mamba2_decode", {"B": batch.num_decode, "H": H, "P": D, "N": D},
                   count=batch.tokens_per_decode)
    for chunk, _prefix in batch.prefill:
        yield Call("lightning_chunk_prefill", "mamba2_chunk_fwd", {"T": chunk, "H": H, "K": D, "V": D})
    yield rmsnorm("lightning_out_norm", M, inner)
    if t > 1:
        yield all_reduce("lightning_norm_all_reduce", M * FP32, t)
    yield gemm("lightning_out_gate", M, inner, d, dt)
    yield elementwise("lightning_out_gate_mul", "sigmoid_mul", M, inner, streams=3)
    yield gemm("lightning_o_proj", M, d, inner, dt)


CALLS = MixerCalls(
    "lightning", lightning_body,
    core={"lightning_recurrent": "lightning state", "lightning_chunk_prefill": "lightning prefill"},
    per_chunk=("lightning_chunk_prefill",),
    proxies={"lightning_recurrent": "proxy: lightning decode priced as the measured mamba2_decode (P = N = head_dim: "
                                    "the same fp32 state and operations per element)",
             "lightning_chunk_prefill": "proxy: lightning attention priced as the measured mamba2_chunk_fwd (fla "
                                        "chunk_simple_gla, K = V = head_dim: linear attention with a scalar decay)"})
