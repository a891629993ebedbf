"""Gated DeltaNet (Qwen3-Next, Qwen3.5) as vLLM's Qwen3NextGatedDeltaNet runs it (vllm/model_executor/models/
qwen3_next.py): one column-parallel input projection for q, k, v, the output gate z, beta and the decay input a
(in_proj_qkvz and in_proj_ba, one GEMM here), the short conv over the q, k, v channels (+ conv state), the gate
kernel (`fused_gdn_gating`: g = -exp(A_log) softplus(a + dt_bias) in fp32, beta = sigmoid(b)), fla's gated delta
rule (decode: `fused_recurrent_gated_delta_rule`, state updated in place, op `recurrent_gdn_decode`; prefill:
`chunk_gated_delta_rule` from the cached state, op `chunk_gdn_fwd`; q, k L2-normalised in the kernel), the gated
RMSNorm over each value head (RMSNormGated with z) and the row-parallel out_proj. TP splits the key and the
value heads (configs/kinds/gdn.py): H = HV / tp value heads over Hk = HK / tp key heads per rank."""

from __future__ import annotations

from typing import Iterator

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers.common import FP32, MixerCalls, _c, gemm, linear_dtype, short_conv


def gdn_body(model: ModelConfig, layout: StepLayout, batch: Batch) -> Iterator[Call]:
    cfg, d, t, M = model.gdn, model.hidden_size, layout.tp, batch.tokens
    hk, hv = cfg.num_key_heads / t, cfg.num_value_heads / t
    dk, dv = cfg.head_dim_k, cfg.head_dim_v
    dt = linear_dtype(model, "gdn")
    # q, k (HK x dk each), v, z (HV x dv each), beta and a (one each per value head)
    yield gemm("gdn_in_proj", M, 2 * hk * dk + 2 * hv * dv + 2 * hv, d, dt)
    yield from short_conv("gdn_short_conv", batch, _c(2 * hk * dk + hv * dv), cfg.conv_kernel_size)
    # a, b read (bf16), g (fp32) and beta (bf16) written per token and value head
    yield Call("gdn_gating", "gdn_gating", {"T": M, "D": _c(hv)}, proxy_bytes=M * hv * (2 * BF16 + FP32 + BF16))
    heads = {"H": _c(hv), "Hk": _c(hk), "K": dk, "V": dv}
    if batch.num_decode:
        # one in-place state update per token a sequence feeds (q = 1 + MTP drafts: q updates in sequence)
        yield Call("gdn_recurrent", "recurrent_gdn_decode", {"B": batch.num_decode, **heads},
                   count=batch.tokens_per_decode)
    for chunk, _prefix in batch.prefill:
        yield Call("gdn_chunk_prefill", "chunk_gdn_fwd", {"T": chunk, **heads})
    yield Call("gdn_out_norm", "gated_rmsnorm", {"T": M * _c(hv), "D": dv}, proxy_bytes=3 * M * hv * dv * BF16)
    yield gemm("gdn_o_proj", M, d, hv * dv, dt)


CALLS = MixerCalls("gdn", gdn_body, core={"gdn_recurrent": "GDN state", "gdn_chunk_prefill": "GDN prefill"},
                   per_chunk=("gdn_chunk_prefill",))
