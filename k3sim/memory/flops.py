"""Model FLOP: the one count of a model's useful arithmetic, shared by MFU (`k3sim.training`) and the prefill
work a prefix-cache hit saves (`k3sim.prefix_cache.flops`).

Convention (Megatron-LM `num_floating_point_operations`, megatron/training/training.py, MLA branch; PaLM,
Chowdhery et al. 2022, appendix B; Chinchilla's 6N + attention, Hoffmann et al. 2022, appendix F):
- linear: 2 FLOP per active weight per token forward (every layer's projections, the shared and the
  top-k routed experts, the router, AttnRes queries, the LM head; the embedding lookup is not a GEMM);
  backward is the input gradient plus the weight gradient, each a forward's FLOP, so forward+backward is
  3 x the forward: 6 x active parameters;
- causal softmax attention (MLA, heads expanded): per head, 2 FLOP per multiply-add in Q K^T (d_qk = nope +
  rope) and in P V (d_v); query i attends to i + 1 keys, so a sequence of S tokens costs
  H (d_qk + d_v) S (S + 1) forward (the exact causal count, which prefill uses), and Megatron's per-token
  form, S / 2 keys per query on average, is H S (d_qk + d_v) per token and layer forward, 3 x that for
  forward+backward; V is not padded to the QK dim and nothing is recomputed (model FLOP, not hardware);
- KDA: chunkwise work per token and head (`kernels.ops.kda_fwd_flop_per_token_head` at the layer's head
  dims; not the padding to whole chunks), 3 x for forward+backward (`kernels.ops.KDA_FWD_BWD_FLOP_FACTOR`);
  the other recurrent kinds in the chunk form their kernels run (`RECURRENT_FLOP`): GDN KDA's chunk products
  once per value head (fla chunk_gated_delta_rule), Mamba2 the SSD block form per head
  (`kernels.ops.ssd_flop_per_token_head`, K = d_state, V = head_dim), lightning the same form with K = V =
  head_dim (scalar-decay linear attention, fla chunk_simple_gla), Mamba1 its selective scan as SSD heads of 64
  channels over d_state (the decomposition the step prices it with);
- GQA and SWA attention as MLA's, per head 2 x head_dim FLOP per pair in each product; a sliding window caps
  a query's keys at the window (`causal_pairs`).
Hardware FLOP (what the GPUs execute: FlashAttention's 3.5 x, V padded to the QK dim, chunk padding, the
recomputed forward) is the training step's `hardware_flop_per_step`, never this count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Backward = input gradient + weight gradient, each as many FLOP as the forward (Megatron's
# `expansion_factor` 3 x; Kaplan et al. 2020, section 2.1: C ~ 6N per token).
FWD_BWD_FACTOR = 3.0


@dataclass(frozen=True)
class ModelFlop:
    """Forward model FLOP of the whole model, all ranks, split by how it grows with the sequence."""

    linear_flop_per_token: float          # 2 x active weights without the LM head, + KDA chunkwise work
    lm_head_flop_per_token: float         # 2 x LM head weights (training: every token; prefill: the last)
    causal_attention_flop_coefficient: float  # sum over full causal layers of H (d_qk + d_v): FLOP per token pair
    windowed_attention_terms: tuple = ()  # (H (d_qk + d_v), window) of each sliding-window layer

    def causal_attention_flop(self, tokens: float) -> float:
        """Exact forward FLOP of causal attention over the first `tokens` tokens: c t (t + 1), a window capping
        the keys of its layers (`causal_pairs`)."""
        return (self.causal_attention_flop_coefficient * tokens * (tokens + 1)
                + sum(c * causal_pairs(tokens, w) for c, w in self.windowed_attention_terms))

    def forward_flop_per_token(self, seq_len: float, *, lm_head: bool = True) -> float:
        """Megatron's per-token forward FLOP at sequence length `seq_len` (S / 2 keys per query; a window's
        layers their mean keys per query)."""
        head = self.lm_head_flop_per_token if lm_head else 0.0
        windowed = sum(c * causal_pairs(seq_len, w) / max(seq_len, 1) for c, w in self.windowed_attention_terms)
        return self.linear_flop_per_token + head + self.causal_attention_flop_coefficient * seq_len + windowed

    def training_flop_per_token(self, seq_len: float) -> float:
        """Forward+backward model FLOP per token (what MFU counts): 3 x the forward, LM head included."""
        return FWD_BWD_FACTOR * self.forward_flop_per_token(seq_len, lm_head=True)


def _mla_pair(model: Any) -> float:
    from k3sim.configs.mla import mla_attention_head_dims

    dims = mla_attention_head_dims(model.mla)
    return float(model.mla.num_heads * (dims.qk + dims.v))


def _pair_terms(model: Any) -> list[tuple[float, int | None]]:
    """(H (d_qk + d_v), window or None) of every causal softmax-attention layer of the model (MLA, GQA, SWA)."""
    out: list[tuple[float, int | None]] = []
    for layer in model.layers:
        for kind in layer.mixers:
            if kind == "mla":
                out.append((_mla_pair(model), None))
            elif kind in ("gqa", "swa"):
                cfg = getattr(model, kind)
                out.append((float(cfg.num_heads * 2 * cfg.head_dim), getattr(cfg, "window_tokens", None)))
    return out


def causal_pairs(tokens: float, window: int | None) -> float:
    """Twice the causal (query, key) pairs of `tokens` tokens, t (t + 1), under a sliding window of `window`
    keys: the first w queries see i + 1 keys, the rest w each."""
    if window is None or tokens <= window:
        return tokens * (tokens + 1)
    return window * (window + 1) + 2 * (tokens - window) * window


def causal_attention_flop_coefficient(model: Any) -> float:
    """Sum over the model's full causal softmax-attention layers (MLA, GQA) of H (d_qk + d_v): half the forward
    FLOP of one query-key pair (2 FLOP per multiply-add in both products), the coefficient of S (S + 1).
    Sliding-window layers are `ModelFlop.windowed_attention_terms`."""
    return sum(c for c, w in _pair_terms(model) if w is None)


def _chunk(heads: float, D: int, V: int) -> float:
    from k3sim.kernels.ops import kda_fwd_flop_per_token_head

    return heads * kda_fwd_flop_per_token_head(D=D, V=V)


def _ssd(heads: float, K: int, V: int) -> float:
    from k3sim.kernels.ops import ssd_flop_per_token_head

    return heads * ssd_flop_per_token_head(K=K, V=V)


# forward FLOP per token of one layer's recurrence, by kind (module docstring)
RECURRENT_FLOP = {
    "kda": lambda c: _chunk(c.num_heads, c.head_dim_k, c.head_dim_v),
    "gdn": lambda c: _chunk(c.num_value_heads, c.head_dim_k, c.head_dim_v),
    "mamba2": lambda c: _ssd(c.num_heads, c.state_size, c.head_dim),
    "lightning": lambda c: _ssd(c.num_heads, c.head_dim, c.head_dim),
    "mamba": lambda c: _ssd(c.inner_size / 64, c.state_size, 64),
}


def recurrent_flop_per_token(model: Any) -> float:
    """Forward FLOP per token of every recurrent layer's chunkwise recurrence (`RECURRENT_FLOP`)."""
    return sum(RECURRENT_FLOP[k](getattr(model, k)) for layer in model.layers for k in layer.mixers
               if k in RECURRENT_FLOP)


def model_flop(model: Any) -> ModelFlop:
    """The model's forward FLOP terms (see the module docstring for the convention and its sources)."""
    from k3sim.memory.params import count_params

    report = count_params(model)
    lm_head = sum(r.active_params for r in report.rows if r.component == "lm_head")
    linear = 2.0 * (report.active_params - lm_head) + recurrent_flop_per_token(model)
    windowed = tuple((c, w) for c, w in _pair_terms(model) if w is not None)
    return ModelFlop(linear, 2.0 * lm_head, causal_attention_flop_coefficient(model), windowed)


def training_flop_per_token(model: Any, seq_len: float) -> float:
    """Forward+backward model FLOP per token of sequences of `seq_len` tokens: MFU's numerator per token."""
    return model_flop(model).training_flop_per_token(seq_len)
