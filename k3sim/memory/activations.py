"""Training activations saved for backward, bytes per token per layer (whole layer, before TP).

Accounting follows Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys 2023): list each tensor a layer keeps for its backward pass. With tensor + sequence parallelism
every term divides by TP (their eq. 3-5), which the plan applies. No dropout masks (these models use
none). Element sizes: the activation dtype (bf16) for tensors, fp32 for gates, router logits and
softmax statistics.
"""

from __future__ import annotations

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.model import ModelConfig

FP32 = 4


def kda_activation_bytes_per_token(model: ModelConfig) -> int:
    """q, k, v before and after the short conv; fp32 decay gate (heads x d_k) and beta; chunk output,
    output gate and o_proj input (heads x d_v each). Chunk states are recomputed in backward (fla)."""
    a, kda = bytes_per_element(model.activation_dtype), model.kda
    h, dk, dv = kda.num_heads, kda.head_dim_k, kda.head_dim_v
    qkv = h * (2 * dk + dv)
    return int(a * (2 * qkv + 3 * h * dv) + FP32 * (h * dk + h))


def mla_activation_bytes_per_token(model: ModelConfig) -> int:
    """q_a output and its norm, q; kv_a output and its norm; expanded K and V; attention output, fp32
    softmax log-sum-exp per head; output gate and o_proj input."""
    a, mla = bytes_per_element(model.activation_dtype), model.mla
    h, qk = mla.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim
    q = 2 * (mla.q_lora_rank or 0) + h * qk
    kv = 2 * (mla.kv_lora_rank + mla.qk_rope_head_dim) + h * (qk + mla.v_head_dim)
    out = h * mla.v_head_dim * (3 if mla.output_gate else 2)
    return int(a * (q + kv + out) + FP32 * h)


def ffn_activation_bytes_per_token(model: ModelConfig, kind: str) -> int:
    """Dense GLU: gate and up outputs, activation output (3 x width). MoE: fp32 router logits; latent
    down output and its norm; per routed copy (top-k) the dispatched input, gate/up, activation and
    expert output; the up-projection input; the shared experts' GLU tensors."""
    a = bytes_per_element(model.activation_dtype)
    if kind == "dense":
        return int(a * 3 * model.dense_ffn_width)
    moe = model.moe
    width_in = moe.latent_width or model.hidden_size
    latent = 3 * moe.latent_width if moe.latent_width else 0
    routed = moe.num_active_experts * (2 * width_in + 3 * moe.expert_ffn_width)
    shared = moe.num_shared_experts * 3 * (moe.shared_expert_ffn_width or moe.expert_ffn_width)
    return int(a * (latent + routed + shared) + FP32 * moe.num_routed_experts)


def layer_activation_bytes_per_token(model: ModelConfig, index: int) -> int:
    """One layer without recompute: two norm inputs and outputs (4 x hidden) + attention + FFN."""
    a = bytes_per_element(model.activation_dtype)
    attn = (kda_activation_bytes_per_token(model) if model.layer_kinds[index] == "kda"
            else mla_activation_bytes_per_token(model))
    return int(4 * model.hidden_size * a) + attn + ffn_activation_bytes_per_token(model, model.ffn_kinds[index])


def checkpointed_layer_bytes_per_token(model: ModelConfig) -> int:
    """With full per-layer recompute only the layer input (hidden, activation dtype) is kept."""
    return int(model.hidden_size * bytes_per_element(model.activation_dtype))
