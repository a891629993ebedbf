"""Per-token and per-request sizes of the serving state: MLA KV cache, KDA recurrent state, conv state,
AttnRes block representatives. Whole-model figures (all layers, all heads, one GPU holding everything);
plans divide them by the parallel layout.
"""

from __future__ import annotations

import math

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.model import ModelConfig


def _bytes(elements: int, dtype: str) -> int:
    return math.ceil(elements * bytes_per_element(dtype))


def kda_state_bytes_per_layer(model: ModelConfig, state_dtype: str | None = None) -> int:
    """One KDA layer's recurrent state: heads x d_k x d_v elements (one S matrix per head)."""
    if model.kda is None:
        return 0
    kda = model.kda
    return _bytes(kda.num_heads * kda.head_dim_k * kda.head_dim_v, state_dtype or kda.state_dtype)


def kda_state_bytes_per_request(model: ModelConfig, state_dtype: str | None = None) -> int:
    """All KDA layers' states of one request; fixed size, independent of context length.

    K3: 69 layers x 96 heads x 128 x 128 x 4 B (fp32) = 434,110,464 B (414 MiB).
    """
    return model.num_kda_layers * kda_state_bytes_per_layer(model, state_dtype)


def mla_kv_bytes_per_token_per_layer(model: ModelConfig) -> int:
    """MLA caches the compressed latent (kv_lora_rank) plus the shared rope key (qk_rope_head_dim)."""
    if model.mla is None:
        return 0
    mla = model.mla
    return _bytes(mla.kv_lora_rank + mla.qk_rope_head_dim, mla.kv_cache_dtype)


def mla_kv_bytes_per_token(model: ModelConfig) -> int:
    """All MLA layers' KV per token. K3: 24 layers x (512 + 64) x 2 B (bf16) = 27,648 B."""
    return model.num_mla_layers * mla_kv_bytes_per_token_per_layer(model)


def conv_state_bytes_per_layer(model: ModelConfig) -> int:
    """Short-conv state of one KDA layer: the last (kernel - 1) inputs of the q, k and v convolutions
    (depthwise over heads x d_k, heads x d_k, heads x d_v channels)."""
    if model.kda is None:
        return 0
    kda = model.kda
    channels = kda.num_heads * (2 * kda.head_dim_k + kda.head_dim_v)
    return _bytes((kda.conv_kernel_size - 1) * channels, kda.conv_state_dtype)


def conv_state_bytes_per_request(model: ModelConfig) -> int:
    """All KDA layers' conv state. K3: 69 x 3 x 96 x (128+128+128) x 2 B = 15,261,696 B."""
    return model.num_kda_layers * conv_state_bytes_per_layer(model)


def attn_res_block_bytes_per_token(model: ModelConfig) -> int:
    """Block AttnRes representatives kept per token in flight: the last block attends over the token
    embedding plus the (N - 1) completed blocks = N vectors of `hidden_size` in the activation dtype.

    K3: 8 x 7168 x 2 B = 114,688 B. They belong to tokens being computed (prefill chunk, decode
    batch, training micro-batch), not to the cached context: depth attention is within one token.
    """
    return _bytes(model.num_attn_res_blocks * model.hidden_size, model.activation_dtype)
