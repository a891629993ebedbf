"""How many distinct routed experts a batch touches: the bytes a memory-bound MoE step must stream.

Uniform top-k routing: each token picks k of E experts; an expert is missed by one token with
probability 1 - k/E, by B independent tokens with (1 - k/E)^B, so E[distinct] = E (1 - (1 - k/E)^B)
(the issue's facts: K3 at B = 1 / 8 / 32 / 64 / 128 gives 16 / 120 / 393 / 613 / 807).

Skewed routing: expert e is chosen by one token with probability q_e = k w_e (w a popularity
distribution summing to 1, q capped at 1), missed by B tokens with (1 - q_e)^B. Uniform w = 1/E gives
back the formula above. Real routers are skewed (hot experts), which lowers the distinct count and so
the weight traffic at a given batch; a Zipf exponent s (w_e ∝ e^-s) is the usual one-parameter model.
"""

from __future__ import annotations

from typing import Sequence


def expected_distinct_experts(tokens: float, experts: int, topk: float) -> float:
    """E (1 - (1 - k/E)^B): uniform top-k routing (one formula: `kernels.ops`)."""
    from k3sim.kernels.ops import expected_distinct_experts as f

    return f(tokens, experts, topk)


def zipf_weights(experts: int, exponent: float) -> list[float]:
    """w_e ∝ (e+1)^-s, normalised; s = 0 is uniform (the ranking is irrelevant to a count over all experts:
    `k3sim.comm.routing.popularity` is the same weights shuffled)."""
    raw = [(e + 1) ** -exponent for e in range(experts)]
    total = sum(raw)
    return [r / total for r in raw]


def expected_distinct_skewed(tokens: float, weights: Sequence[float], topk: float) -> float:
    """Σ_e 1 - (1 - q_e)^B with q_e an expert's picks per token (`k3sim.comm.routing.top_k_inclusion`, the one
    routing model: k w_e water-filled so that no expert takes more than one pick per token and the picks still
    sum to k) over a popularity distribution `weights` (sums to 1)."""
    from k3sim.comm.routing import top_k_inclusion

    q = top_k_inclusion(list(weights), topk)
    return float(sum(1.0 - (1.0 - float(x)) ** tokens for x in q))


def distinct_experts(tokens: float, experts: int, topk: float, zipf: float = 0.0) -> float:
    """Expected distinct experts hit by `tokens` tokens, uniform (zipf 0) or Zipf-skewed routing."""
    if tokens <= 0:
        return 0.0
    if zipf == 0.0:
        return expected_distinct_experts(tokens, experts, topk)
    return expected_distinct_skewed(tokens, zipf_weights(experts, zipf), topk)


def routed_expert_bytes(model) -> float:
    """Bytes of one routed expert in its stored format: gate, up, down over the latent (or hidden) width.
    K3: 3 x 3584 x 3072 x 4.25 / 8 = 17.55 MB (MXFP4, one e8m0 scale per 32 e2m1 values)."""
    from k3sim.configs.dtypes import bytes_per_element
    from k3sim.memory.params import routed_expert_params

    return routed_expert_params(model) * bytes_per_element(model.moe.routed_weight_format)


def routed_bytes_per_step(model, tokens: float, zipf: float = 0.0) -> float:
    """Routed-expert weight bytes one decode step streams over the whole model (all EP ranks): distinct
    experts per MoE layer x bytes per expert x MoE layers. K3 at one token: 16 x 17.55 MB x 92 = 25.8 GB."""
    moe = model.moe
    per_layer = distinct_experts(tokens, moe.num_routed_experts, moe.num_active_experts, zipf)
    return per_layer * routed_expert_bytes(model) * model.num_moe_layers
