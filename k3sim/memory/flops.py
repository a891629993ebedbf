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
  dims; not the padding to whole chunks), 3 x for forward+backward (`kernels.ops.KDA_FWD_BWD_FLOP_FACTOR`).
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
    causal_attention_flop_coefficient: float  # sum over causal layers of H (d_qk + d_v): FLOP per token pair

    def causal_attention_flop(self, tokens: float) -> float:
        """Exact forward FLOP of causal attention over the first `tokens` tokens: c t (t + 1)."""
        return self.causal_attention_flop_coefficient * tokens * (tokens + 1)

    def forward_flop_per_token(self, seq_len: float, *, lm_head: bool = True) -> float:
        """Megatron's per-token forward FLOP at sequence length `seq_len` (S / 2 keys per query)."""
        head = self.lm_head_flop_per_token if lm_head else 0.0
        return self.linear_flop_per_token + head + self.causal_attention_flop_coefficient * seq_len

    def training_flop_per_token(self, seq_len: float) -> float:
        """Forward+backward model FLOP per token (what MFU counts): 3 x the forward, LM head included."""
        return FWD_BWD_FACTOR * self.forward_flop_per_token(seq_len, lm_head=True)


def causal_attention_flop_coefficient(model: Any) -> float:
    """Sum over the model's causal softmax-attention (MLA) layers of H (d_qk + d_v): half the forward FLOP
    of one query-key pair (2 FLOP per multiply-add in both products), the coefficient of S (S + 1)."""
    from k3sim.configs.mla import mla_attention_head_dims

    mla = getattr(model, "mla", None)
    if mla is None or not model.num_mla_layers:
        return 0.0
    dims = mla_attention_head_dims(mla)
    return float(model.num_mla_layers * mla.num_heads * (dims.qk + dims.v))


def model_flop(model: Any) -> ModelFlop:
    """The model's forward FLOP terms (see the module docstring for the convention and its sources)."""
    from k3sim.kernels.ops import kda_fwd_flop_per_token_head
    from k3sim.memory.params import count_params

    report = count_params(model)
    lm_head = sum(r.active_params for r in report.rows if r.component == "lm_head")
    linear = 2.0 * (report.active_params - lm_head)
    kda = getattr(model, "kda", None)
    if kda is not None and model.num_kda_layers:
        linear += model.num_kda_layers * kda.num_heads * kda_fwd_flop_per_token_head(D=kda.head_dim_k,
                                                                                     V=kda.head_dim_v)
    return ModelFlop(linear, 2.0 * lm_head, causal_attention_flop_coefficient(model))


def training_flop_per_token(model: Any, seq_len: float) -> float:
    """Forward+backward model FLOP per token of sequences of `seq_len` tokens: MFU's numerator per token."""
    return model_flop(model).training_flop_per_token(seq_len)
