"""The recompute modules of a layer: which calls of `k3sim.step.layers` each training recompute module holds.

Selective recompute (`training.recompute: selective`) re-runs only some modules' forward before the backward
and keeps everything else; the memory planner drops those modules' saved tensors (`k3sim.memory.activations`)
and the step adds their forward once more. The names are the scenario's (`configs.planning.RECOMPUTE_MODULES`):
- `norms`: every pre-norm and output norm of a layer whose output the memory plan drops (attention and FFN
  pre-norms, MLA's q_a / kv_a norms, the latent norm, each mixer kind's gated output norm `<kind>_out_norm`,
  Jamba's RMSNorms on dt, B and C); the per-head q/k norms of GQA are not among them (FlashAttention keeps q and
  k after them, so rebuilding them frees nothing);
- `mla_up_proj`: MLA's up-projections (q_b and the kv_b expansion into per-head K and V); with `norms`,
  DeepSeek-V3's recipe (arXiv 2412.19437 sec. 3.2.3: "recompute all RMSNorm operations and MLA
  up-projections during back-propagation");
- `attention_core`: the causal softmax-attention kernel of every attention kind (MLA, GQA, SWA: FlashAttention
  recomputes its scores anyway; this drops the saved log-sum-exp);
- `moe_act`: the activation (SwiGLU, or squared ReLU for a plain MLP) of routed and shared experts
  (Megatron-Core's `moe_act` recompute module);
- `kda_core`: the chunked KDA kernel and its short convolution;
- `linear_attn_core`: every recurrent kind's chunk kernel and short convolution (GDN, Mamba2, Mamba, lightning's
  qkv SiLU in the conv's place) and KDA's (it covers `kda_core`).
Megatron-Core names the same idea `--recompute-modules` (core_attn, moe_act, layernorm, mla_up_proj).

The recurrent kinds' components follow the step's naming contract (`<kind>_chunk_prefill`, `<kind>_short_conv`,
`<kind>_out_norm`), so a kind added to the registry (`configs.kinds.MIXERS`, `recurrent`) joins its module
without a list to extend here.
"""

from __future__ import annotations

from k3sim.configs.kinds import MIXERS
from k3sim.configs.recipe import RECOMPUTE_MODULE_COVERS, RECOMPUTE_MODULE_NEEDS, RECOMPUTE_MODULES

# A recurrent kind with a recompute module of its own (kept valid: scenarios name it); the others' cores are
# `linear_attn_core`'s alone.
_OWN_CORE = {"kda": "kda_core"}
_CORE_PARTS = ("chunk_prefill", "short_conv")
# lightning has no short conv: the SiLU over its q/k/v projection feeds the chunk kernel in the conv's place
_CORE_EXTRA = {"lightning": ("lightning_qkv_act",)}


def _core(kind: str) -> tuple[str, ...]:
    return tuple(f"{kind}_{p}" for p in _CORE_PARTS) + _CORE_EXTRA.get(kind, ())


_RECURRENT = tuple(k for k, m in MIXERS.items() if m.recurrent)
_COMPONENTS: dict[str, tuple[str, ...]] = {
    "norms": ("attn_norm", "ffn_norm", "mla_q_a_norm", "mla_kv_a_norm", "moe_latent_norm",
              *(f"{k}_out_norm" for k in MIXERS), "mamba_dt_norm", "mamba_b_norm", "mamba_c_norm"),
    "mla_up_proj": ("mla_q_b_proj", "mla_kv_b_expand"),
    "attention_core": tuple(f"{k}_prefill_attention" for k, m in MIXERS.items() if not m.recurrent),
    "moe_act": ("routed_experts_swiglu", "shared_experts_swiglu", "routed_experts_relu2", "shared_experts_relu2"),
    **{mod: _core(k) for k, mod in _OWN_CORE.items()},
    "linear_attn_core": tuple(c for k in _RECURRENT if k not in _OWN_CORE for c in _core(k)),
}
assert set(_COMPONENTS) == set(RECOMPUTE_MODULES)
_MODULE_OF = {c: m for m, comps in _COMPONENTS.items() for c in comps}

# The layer part a module needs: a recompute module the model lacks is refused, naming it (the table lives in
# `configs.planning`, below the memory planner, which refuses the same modules).
MODULE_NEEDS: dict[str, str | None] = RECOMPUTE_MODULE_NEEDS


def module_of(component: str) -> str | None:
    """The recompute module a call's component belongs to, or None (kept under selective recompute). A module
    covered by another (`kda_core` by `linear_attn_core`) is the one named: `module_parts` widens a selection."""
    return _MODULE_OF.get(component)


def module_components(module: str) -> tuple[str, ...]:
    """The call components of one recompute module, those of the modules it covers included."""
    return tuple(c for m in (module, *RECOMPUTE_MODULE_COVERS.get(module, ())) for c in _COMPONENTS[m])


def module_parts(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The `module_of` names a selection of recompute modules re-runs, each once: the modules and those they
    cover (`linear_attn_core` adds `kda_core`), so a selection naming both counts KDA's core once."""
    out: dict[str, None] = {}
    for m in modules:
        out.update(dict.fromkeys((m, *RECOMPUTE_MODULE_COVERS.get(m, ()))))
    return tuple(out)
