"""The recompute modules of a layer: which calls of `k3sim.step.layers` each training recompute module holds.

Selective recompute (`training.recompute: selective`) re-runs only some modules' forward before the backward
and keeps everything else; the memory planner drops those modules' saved tensors and the step adds their
forward once more. The names are the scenario's (`configs.planning.RECOMPUTE_MODULES`):
- `norms`: every RMSNorm of a layer (attention and FFN pre-norms, MLA's q_a / kv_a norms, the latent norm,
  KDA's gated output norm);
- `mla_up_proj`: MLA's up-projections (q_b and the kv_b expansion into per-head K and V); with `norms`,
  DeepSeek-V3's recipe (arXiv 2412.19437 sec. 3.2.3: "recompute all RMSNorm operations and MLA
  up-projections during back-propagation");
- `attention_core`: the causal attention kernel of an MLA layer (FlashAttention recomputes its scores
  anyway; this drops the saved output and log-sum-exp);
- `moe_act`: the SwiGLU of routed and shared experts (Megatron-Core's `moe_act` recompute module);
- `kda_core`: the chunked KDA kernel and its short convolution.
Megatron-Core names the same idea `--recompute-modules` (core_attn, moe_act, layernorm, mla_up_proj).
"""

from __future__ import annotations

from k3sim.configs.planning import RECOMPUTE_MODULE_NEEDS, RECOMPUTE_MODULES

_COMPONENTS: dict[str, tuple[str, ...]] = {
    "norms": ("attn_norm", "ffn_norm", "mla_q_a_norm", "mla_kv_a_norm", "moe_latent_norm", "kda_out_norm"),
    "mla_up_proj": ("mla_q_b_proj", "mla_kv_b_expand"),
    "attention_core": ("mla_prefill_attention",),
    "moe_act": ("routed_experts_swiglu", "shared_experts_swiglu"),
    "kda_core": ("kda_chunk_prefill", "kda_short_conv"),
}
assert set(_COMPONENTS) == set(RECOMPUTE_MODULES)
_MODULE_OF = {c: m for m, comps in _COMPONENTS.items() for c in comps}

# The layer part a module needs: a recompute module the model lacks is refused, naming it (the table lives in
# `configs.planning`, below the memory planner, which refuses the same modules).
MODULE_NEEDS: dict[str, str | None] = RECOMPUTE_MODULE_NEEDS


def module_of(component: str) -> str | None:
    """The recompute module a call's component belongs to, or None (kept under selective recompute)."""
    return _MODULE_OF.get(component)


def module_components(module: str) -> tuple[str, ...]:
    """The call components of one recompute module."""
    return _COMPONENTS[module]
