"""Per-token and per-request sizes of the serving state: the KV cache of the attention kinds (MLA, GQA, and
SWA capped by its window), the recurrent state and the short-conv state of the recurrent kinds (KDA, GDN,
Mamba2, Mamba, lightning), AttnRes block representatives. Each kind's per-layer figure is its module's
(`configs/kinds/<kind>.py`, with the formula and its source); here they are summed over the layers that
hold the kind. Whole-model figures by default (all layers, all heads, one GPU holding everything); `tp`
gives one rank of a TP group (a kind's own split: heads, value heads, groups; replicated KV heads and
Mamba2 groups counted on every rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.kinds import MIXERS
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


# ---------------------------------------------------------------------------------------- every kind
@dataclass(frozen=True)
class KindSizes:
    """One mixer kind of a model: its layers and its per-layer, per-rank sizes (bytes)."""

    kind: str
    layers: int
    state_bytes_per_layer: int        # recurrent state per request (0 for attention kinds)
    conv_state_bytes_per_layer: int   # short-conv state per request
    kv_bytes_per_token_per_layer: int  # KV cache per token (0 for recurrent kinds)
    window_tokens: int | None         # most tokens a layer caches (sliding window); None = the whole context

    def kv_bytes_per_request_per_layer(self, context_tokens: int) -> int:
        """KV of one request of `context_tokens` in one layer of this kind: the window caps the tokens."""
        tokens = context_tokens if self.window_tokens is None else min(context_tokens, self.window_tokens)
        return self.kv_bytes_per_token_per_layer * tokens

    def kv_bytes_per_request(self, context_tokens: int) -> int:
        """KV of one request of `context_tokens` over all of this kind's layers."""
        return self.layers * self.kv_bytes_per_request_per_layer(context_tokens)


def kind_sizes(model: ModelConfig, tp: int = 1, state_dtype: str | None = None) -> list[KindSizes]:
    """Per-kind sizes of every mixer kind the model uses, in registry order; `state_dtype` overrides every
    recurrent kind's state dtype (None: each section's own, fp32 unless the config says otherwise)."""
    out = []
    for kind in model.mixer_kinds:
        k, cfg = MIXERS[kind], model.section(kind)
        out.append(KindSizes(kind, model.num_layers_with(kind), k.state_bytes(cfg, tp, state_dtype),
                             k.conv_state_bytes(cfg, tp), k.kv_bytes_per_token(cfg, tp), k.window_tokens(cfg)))
    return out


def recurrent_state_bytes_per_request(model: ModelConfig, tp: int = 1, state_dtype: str | None = None) -> int:
    """Recurrent state of one request over all recurrent layers (KDA, GDN, Mamba2, Mamba, lightning), without
    the conv state; fixed size, independent of the context. K3: the KDA state, 434,110,464 B."""
    return sum(s.layers * s.state_bytes_per_layer for s in kind_sizes(model, tp, state_dtype))


def all_conv_state_bytes_per_request(model: ModelConfig, tp: int = 1) -> int:
    """Short-conv state of one request over every kind with a conv (KDA, GDN, Mamba2, Mamba). K3: the KDA conv
    state, 15,261,696 B."""
    return sum(s.layers * s.conv_state_bytes_per_layer for s in kind_sizes(model, tp))


def kv_bytes_per_token(model: ModelConfig, tp: int = 1) -> int:
    """KV per token of the full-context attention layers (MLA, GQA); sliding-window layers are
    `kv_bytes_per_request`'s. K3: the MLA KV, 27,648 B."""
    return sum(s.layers * s.kv_bytes_per_token_per_layer for s in kind_sizes(model, tp) if s.window_tokens is None)


def kv_bytes_per_request(model: ModelConfig, context_tokens: int, tp: int = 1) -> int:
    """KV cache of one request of `context_tokens` over all attention layers, windows applied."""
    return sum(s.kv_bytes_per_request(context_tokens) for s in kind_sizes(model, tp))
