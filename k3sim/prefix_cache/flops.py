"""Prefill compute a prefix-cache hit saves: the FLOP of prefilling a sequence's first t tokens.

    prefill_flop(t) = linear_flop_per_token x t + attention_flop_per_token_pair x t (t + 1)

Linear: 2 FLOP per active weight per token (every layer's projections, the shared and the top-k routed
experts, the router, AttnRes queries; not the embedding lookup, not the LM head, which prefill applies to
the last token only), plus chunkwise KDA's own work per token and head (`kernels.ops.
kda_fwd_flop_per_token_head` at the model's head dims). Quadratic:
causal MLA attention, expanded heads as prefill runs it: query i attends to i + 1 keys, 2 FLOP per
multiply-add in Q K^T (d_qk = nope + rope) and in P V (d_v), summed over i < t: H (d_qk + d_v) t (t + 1)
per MLA layer. Both terms come from `k3sim.memory.flops` (the convention and its sources are there; training's
MFU counts the same terms). Marconi (MLSys 2025, section 4.2) weighs cache
entries by the same quantity: FLOP saved by a hit per byte of cache they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PrefillFlops:
    linear_flop_per_token: float
    attention_flop_per_token_pair: float

    def __call__(self, tokens: float) -> float:
        """FLOP to prefill the first `tokens` tokens (whole model, all ranks)."""
        return self.linear_flop_per_token * tokens + self.attention_flop_per_token_pair * tokens * (tokens + 1)

    def span(self, start: float, end: float) -> float:
        """FLOP of tokens [start, end) given the prefix before them (what a hit covering them saves)."""
        return self(end) - self(start)


def prefill_flops(model: Any) -> PrefillFlops:
    """The model's prefill FLOP polynomial (see module docstring): the forward terms of the one model-FLOP
    count (`k3sim.memory.flops.model_flop`, shared with training's MFU), without the LM head."""
    from k3sim.memory.flops import model_flop

    f = model_flop(model)
    return PrefillFlops(f.linear_flop_per_token, f.causal_attention_flop_coefficient)
