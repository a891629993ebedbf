"""Training activations saved for backward, bytes per token per layer (whole layer, before TP), by tensor.

Accounting follows Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys 2023): list each tensor a layer keeps for its backward pass, once (a tensor two ops save, such as
the attention output that the attention backward and o_proj's weight gradient both read, is one tensor).
With tensor + sequence parallelism every term divides by TP (their eq. 3-5), which the plan applies. No
dropout masks (these models use none). FlashAttention and fla's chunked KDA rebuild their score matrices
and chunk states in the backward, so neither keeps an S x S or per-chunk state tensor.

Selective recompute (`configs.planning.RECOMPUTE_MODULES`) drops a module's saved tensors and rebuilds them
from its inputs just before the layer's backward; the inputs stay saved. Megatron-Core's semantics
(`TransformerConfig.recompute_modules`: "moe_act, layernorm and mla_up_proj use output-discarding
checkpointing, core_attn ... normal checkpointing"), per tensor:
- `norms`: drops each RMSNorm's output (attention and FFN pre-norms, MLA's q_a / kv_a norms, KDA's gated
  output norm); keeps each norm's input (its own backward reads it anyway);
- `mla_up_proj`: drops q (q_b output, RoPE applied) and the expanded per-head K and V (kv_b output with the
  shared RoPE key broadcast); keeps the normed latents (the up-projections' inputs) and must now keep the
  RoPE key k_pe (rope dims, from the down-projection), which no saved tensor held apart before;
- `attention_core` (normal checkpointing, as Megatron's core_attn): drops the kernel's own state, the fp32
  log-sum-exp per head; keeps q, K, V (its inputs) and its output, which o_proj (or the output gate) saves as
  its own input. Korthikanti's selective recompute targeted the softmax and dropout tensors (5 a s / h per
  token); FlashAttention never keeps them, so under FlashAttention this module frees only the LSE;
- `moe_act`: drops the SwiGLU outputs of routed (weighted by the routing weight) and shared experts (the
  down-projections' inputs); keeps the SwiGLU inputs (gate/up outputs) and the routing weights;
- `kda_core` (normal checkpointing): drops the chunk kernel's saved q, k, v (the short conv's outputs, q and k
  L2-normed, with their fp32 inverse norms) and its chunk-local Aqk / Akk matrices (H x 64 per token each,
  fla `ChunkKDAFunction.save_for_backward`); keeps the conv input, the decay gate and beta (its inputs) and
  the chunk output, which the gated output norm saves as its own input;
- `linear_attn_core` (normal checkpointing): the same for every recurrent kind (GDN, Mamba2, Mamba, lightning,
  and KDA: it covers `kda_core`, `configs.planning.RECOMPUTE_MODULE_COVERS`): drops what the chunk kernel (or
  selective scan) saves of its own and the short conv's (or lightning's SiLU's) output; keeps their inputs and
  the core's output.
`attention_core` acts on every softmax-attention kind (MLA, GQA, SWA): FlashAttention's log-sum-exp.

What each mixer kind saves, from the autograd functions of the implementations its models train with:
- GDN (Qwen3-Next; fla `chunk_gated_delta_rule`, `ChunkGatedDeltaRuleFunction.save_for_backward(q, q_rstd, k,
  k_rstd, v, g, beta, A, ...)` with `use_qk_l2norm_in_kernel=True`): q and k after the in-kernel L2 norm (HK
  d_k each, the key heads: fla reads key head h // (HV / HK) for grouped value heads) with their fp32 inverse
  norms, v (HV d_v), the chunk-local cumulative decay g (fp32) and beta per value head, and the solved WY
  matrix A (HV x 64 per token, bf16); the chunk states are rebuilt in the backward (`chunk_gated_delta_rule_bwd`
  re-runs `chunk_gated_delta_rule_fwd_h`). Around it: the short conv's input (causal_conv1d saves x), the decay
  g = -exp(A_log) softplus(a + dt_bias) computed in fp32 (softplus saves its input, the product its operand),
  beta = sigmoid(b), the gated RMSNorm's input and gate z, and o_proj's input.
- Mamba2 (Nemotron-H, Granite-4.0-H; mamba_ssm `MambaChunkScanCombinedFn.save_for_backward(out, x, dt,
  dA_cumsum, A, B, C, D, z, dt_bias, ...)`): the conv's output x, B, C (d_inner + 2 G N), the raw dt (the
  kernel applies dt_bias and softplus), the fp32 cumulative decay per head, the scan output (the gated norm's
  input, or with z inside the scan its ungated output); the conv's input, z, and o_proj's input.
- Mamba (Jamba; mamba_ssm `SelectiveScanFn.save_for_backward(u, delta, A, B, C, D, z, delta_bias, x, out)`):
  the conv output u (x_proj's input too), delta, B and C, z, the chunk states x (fp32, d_inner x 2N per
  2048-token chunk of the CUDA kernel) and the ungated output; Jamba's RMSNorms on dt, B and C save their inputs.
- lightning (MiniMax-M1; the chunked linear attention with a fixed decay as fla `chunk_simple_gla` with
  `g_gamma`, `ChunkSimpleGLAFunction.save_for_backward(q, k, v, g, g_gamma, ...)`): q, k, v (SiLU's output),
  SiLU's input, the core output (the norm's input), the norm output and the sigmoid output gate (the gate
  multiply's operands), o_proj's input.
- GQA / SWA (FlashAttention-2 `FlashAttnFunc`: `ctx.save_for_backward(q, k, v, out_padded, softmax_lse, ...)`,
  K and V at the KV heads, no expansion): q, k, v after the q/k norms and RoPE, the output and the fp32 LSE per
  query head; with q/k norms their inputs; with Qwen3-Next's output gate, the sigmoid gate and the gated o_proj
  input (as MLA's gate). RoPE saves nothing (its backward needs only cos and sin).
FFN: a plain MLP (Nemotron-H's squared ReLU) saves its up-projection output (the activation's input) and the
activation output; a sigmoid-gated shared expert (Qwen3-Next) saves the shared expert's output and the gate,
the two operands of their product. A layer without a mixer saves only its FFN's tensors, a layer without an
FFN only its mixer's; parallel mixers (Falcon-H1) read one normed input and save each mixer's tensors.

Tensor parallelism: every figure is per token of the whole layer (tp = 1); at tp > 1 the lists give tp x one
rank's elements (`saved_tensors(..., tp)`), which is the whole layer's except where TP replicates a count:
GQA's KV heads past tp = KV heads (vLLM `QKVParallelLinear`) and a single Mamba2 B/C group, whole on every rank.

FP8 caching (precision "fp8", DeepSeek-V3 arXiv 2412.19437 sec. 3.3.4, "we cache the activations in FP8 format
for the backward pass of the Linear operator"): a tensor saved only as a linear layer's input is kept in e4m3
with one fp32 scale per 1x128 tile (1 + 4/128 B per element), with the report's exceptions:
- the attention output, which o_proj saves and the attention backward also reads, in DeepSeek's E5M6 (12 bits:
  1.5 B per element, with the same 1x128 tiling of scales: 1.5 + 4/128 B). Modelled at its stated width
  rather than BF16 because the report gives the format for exactly this tensor; its power-of-two scales are
  counted as fp32 (the report does not say how they are stored);
- the SwiGLU inputs in MoE (routed and shared experts), cached in FP8 with the same tiling;
- a tensor another op needs in higher precision stays in it: the MoE pre-norm output also feeds the router,
  which DeepSeek keeps in BF16 ("MoE gating modules"), so it is kept once in BF16 (the shared experts'
  weight gradient quantises it again); norm inputs, attention / KDA kernel inputs, gates and routing weights
  stay in BF16 or FP32.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Callable

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import ModelConfig
from k3sim.configs.recipe import RECOMPUTE_MODULE_COVERS
from k3sim.kernels.ops import KDA_CHUNK

FP32 = 4
# e4m3 values with one fp32 scale per 1x128 tile (DeepSeek-V3 sec. 3.3.2 fine-grained quantisation)
FP8_CACHED = 1 + 4 / 128
# DeepSeek's E5M6 (12 bits) for the attention output, same 1x128 scale tiling
E5M6_CACHED = 1.5 + 4 / 128

# How a saved tensor is stored: "act" the activation dtype, "fp32", "linear" a linear layer's input (FP8 under
# fp8), "attn_linear" the attention output o_proj saves (E5M6 under fp8), "moe_swiglu_in" (FP8 under fp8).
STORES = ("act", "fp32", "linear", "attn_linear", "moe_swiglu_in")
LINEAR_CORE = "linear_attn_core"  # the recompute module of the recurrent kinds' cores (KDA's is `kda_core`)
# mamba_ssm's selective scan keeps its running state once per chunk of this many tokens
# (csrc/selective_scan/selective_scan.cpp: n_chunks = (seqlen + 2048 - 1) / 2048)
SELECTIVE_SCAN_CHUNK = 2048


@dataclass(frozen=True)
class Saved:
    """One tensor a layer keeps for its backward: elements per token (whole layer, before TP), how it is
    stored, the recompute module that produces it (None: no module rebuilds it, always kept), and `only_if`:
    a tensor saved only when that module is recomputed (an input no other saved tensor held apart)."""

    name: str
    elements: float
    store: str
    module: str | None = None
    only_if: str | None = None


@dataclass(frozen=True)
class LayerActivations:
    """One layer's activations per token under a recompute set and precision: `kept_bytes` live from the
    forward to the layer's backward; `recomputed_bytes` are rebuilt just before it (alive only then);
    `fp8_tensors` / `e5m6_tensors` name the kept tensors in those formats."""

    kept_bytes: float
    recomputed_bytes: float
    fp8_tensors: tuple[str, ...] = ()
    e5m6_tensors: tuple[str, ...] = ()

    @property
    def full_bytes(self) -> float:
        return self.kept_bytes + self.recomputed_bytes


def element_bytes(store: str, precision: str, act_bytes: float) -> float:
    """Bytes per element of a saved tensor of class `store` under training `precision`."""
    if store == "fp32":
        return FP32
    if precision == "fp8" and store in ("linear", "moe_swiglu_in"):
        return FP8_CACHED
    if precision == "fp8" and store == "attn_linear":
        return E5M6_CACHED
    return act_bytes


def _norm_tensors(model: ModelConfig, index: int) -> list[Saved]:
    """The pre-norms of the sublayers the layer has: inputs kept (the layer input and the attention residual),
    outputs under `norms`. The MoE pre-norm output also feeds the BF16 router, so it is not FP8-cached. A layer
    without a mixer starts at its FFN norm (its input is the layer input, one tensor)."""
    d, layer = model.hidden_size, model.layers[index]
    out = []
    if layer.mixers:
        out += [Saved("layer_input", d, "act"), Saved("attn_norm_out", d, "linear", "norms")]
    if layer.ffn is not None:
        ffn_out = "act" if layer.ffn == "moe" else "linear"
        out += [Saved("ffn_norm_in", d, "act"), Saved("ffn_norm_out", d, ffn_out, "norms")]
    return out


def _tp_equivalent(count: int, rule, tp: int) -> int:
    """tp x the count one rank holds (`TPRule.per_rank`): the count itself where tp splits it, more where TP
    replicates it (every rank keeps one whole copy)."""
    return rule.per_rank(tp) * tp if tp > 1 else count


def mla_tensors(model: ModelConfig) -> list[Saved]:
    """MLA (DeepSeek-V3; K3 adds a sigmoid output gate): latents and their norms, q / K / V, the attention output
    and its fp32 log-sum-exp; with the gate, the gate and the gated o_proj input."""
    mla = model.mla
    h, qk, v = mla.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
    out = []
    if mla.q_lora_rank:
        out += [Saved("mla_q_a_out", mla.q_lora_rank, "act"),
                Saved("mla_q_a_norm_out", mla.q_lora_rank, "linear", "norms"),
                Saved("mla_q", h * qk, "act", "mla_up_proj")]
    else:  # q straight from the hidden state: no up-projection rebuilds it
        out.append(Saved("mla_q", h * qk, "act"))
    out += [Saved("mla_kv_a_out", mla.kv_lora_rank, "act"),
            Saved("mla_kv_a_norm_out", mla.kv_lora_rank, "linear", "norms"),
            Saved("mla_k", h * qk, "act", "mla_up_proj"), Saved("mla_v", h * v, "act", "mla_up_proj"),
            Saved("mla_k_pe", mla.qk_rope_head_dim, "act", only_if="mla_up_proj"),
            Saved("mla_attn_lse", h, "fp32", "attention_core")]
    if mla.output_gate:
        out += [Saved("mla_attn_out", h * v, "act"), Saved("mla_out_gate", h * v, "act"),
                Saved("mla_o_proj_in", h * v, "linear")]
    else:
        out.append(Saved("mla_attn_out", h * v, "attn_linear"))
    return out


def kda_tensors(model: ModelConfig) -> list[Saved]:
    """KDA (vLLM / fla): the conv input and output, fla's chunk kernel state (L2 inverse norms, Aqk / Akk of
    chunk 64), the decay gate and beta, low-rank gate intermediates, chunk output, output gate, o_proj input.
    fla's KDA layer calls `chunk_kda(..., use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)`, which saves
    the raw gate as the gate projection wrote it (bf16; its fp32 cumulative sum is dropped and rebuilt) and beta
    both raw (bf16) and after the in-kernel sigmoid (fp32) (fla/ops/kda/chunk.py `save_for_backward`,
    fla/ops/common/gate.py `fused_beta_sigmoid_fwd`)."""
    kda = model.kda
    h, dk, dv = kda.num_heads, kda.head_dim_k, kda.head_dim_v
    qkv = h * (2 * dk + dv)
    out = [Saved("kda_qkv_proj_out", qkv, "act"), Saved("kda_conv_out", qkv, "act", "kda_core"),
           Saved("kda_qk_inv_norm", 2 * h, "fp32", "kda_core"),
           Saved("kda_chunk_aqk_akk", 2 * h * KDA_CHUNK, "act", "kda_core"),
           Saved("kda_decay_gate", h * dk, "act"), Saved("kda_beta_raw", h, "act"), Saved("kda_beta", h, "fp32")]
    if kda.alpha_gate_rank:
        out.append(Saved("kda_decay_gate_a", kda.alpha_gate_rank, "linear"))
    if kda.output_gate_rank:
        out.append(Saved("kda_out_gate_a", kda.output_gate_rank, "linear"))
    return out + [Saved("kda_chunk_out", h * dv, "act"), Saved("kda_out_gate", h * dv, "act"),
                  Saved("kda_o_proj_in", h * dv, "linear", "norms")]


def gdn_tensors(model: ModelConfig, tp: int = 1) -> list[Saved]:
    """Gated DeltaNet (the module docstring's fla autograd): the conv input; the chunk kernel's q, k (key heads,
    after its L2 norm, fp32 inverse norms), v, solved WY matrix A and cumulative decay; the fp32 decay terms,
    beta, chunk output, output gate z and o_proj input (the gated norm's output)."""
    g = model.gdn
    hk, hv, dk, dv = g.num_key_heads, g.num_value_heads, g.head_dim_k, g.head_dim_v
    core = LINEAR_CORE
    return [Saved("gdn_conv_in", 2 * hk * dk + hv * dv, "act"),
            Saved("gdn_q", hk * dk, "act", core), Saved("gdn_k", hk * dk, "act", core),
            Saved("gdn_qk_inv_norm", 2 * hk, "fp32", core), Saved("gdn_v", hv * dv, "act", core),
            Saved("gdn_chunk_a", hv * KDA_CHUNK, "act", core), Saved("gdn_g_cumsum", hv, "fp32", core),
            Saved("gdn_g", hv, "fp32", only_if=core),  # the kernel's decay input, held apart only if it is rebuilt
            Saved("gdn_decay_softplus_in", hv, "fp32"), Saved("gdn_decay_softplus_out", hv, "fp32"),
            Saved("gdn_beta", hv, "act"), Saved("gdn_chunk_out", hv * dv, "act"),
            Saved("gdn_out_gate", hv * dv, "act"), Saved("gdn_o_proj_in", hv * dv, "linear", "norms")]


def mamba2_tensors(model: ModelConfig, tp: int = 1) -> list[Saved]:
    """Mamba2 (mamba_ssm's chunked scan): the conv's input and output (x, B, C), the raw dt, the fp32 cumulative
    decay, z, the scan output and o_proj's input. With the gated RMSNorm the scan output is the norm's input
    (kept); without it (z gates inside the scan) the scan keeps its ungated output of its own."""
    m = model.mamba2
    inner = m.num_heads * m.head_dim
    bc = 2 * _tp_equivalent(m.n_groups, MIXERS["mamba2"].tp_rules(m)[1], tp) * m.state_size
    core = LINEAR_CORE
    out = [Saved("mamba2_conv_in", inner + bc, "act"), Saved("mamba2_conv_out", inner + bc, "act", core),
           Saved("mamba2_dt", m.num_heads, "act"), Saved("mamba2_da_cumsum", m.num_heads, "fp32", core),
           Saved("mamba2_z", inner, "act")]
    if m.gated_norm:
        return out + [Saved("mamba2_scan_out", inner, "act"), Saved("mamba2_o_proj_in", inner, "linear", "norms")]
    return out + [Saved("mamba2_scan_out", inner, "act", core), Saved("mamba2_o_proj_in", inner, "linear")]


def mamba_tensors(model: ModelConfig, tp: int = 1) -> list[Saved]:
    """Mamba-1 (mamba_ssm's selective scan): the conv input and output u (which x_proj also reads, so no core
    recompute drops it), x_proj's output (dt low rank, B, C; with Jamba's inner norms their inputs, the outputs
    under `norms`), delta, z, the scan's chunk states and ungated output, o_proj's input."""
    m = model.mamba
    di, n, r = m.inner_size, m.state_size, m.dt_rank
    core = LINEAR_CORE
    out = [Saved("mamba_conv_in", di, "act"), Saved("mamba_conv_out", di, "act"), Saved("mamba_z", di, "act")]
    if m.inner_norms:
        out += [Saved("mamba_x_proj_out", r + 2 * n, "act"),
                Saved("mamba_dt_norm_out", r, "linear", "norms"), Saved("mamba_bc_norm_out", 2 * n, "act", "norms")]
    else:
        out += [Saved("mamba_dt_low_rank", r, "linear"), Saved("mamba_bc", 2 * n, "act")]
    return out + [Saved("mamba_delta", di, "act"),
                  Saved("mamba_scan_states", di * 2 * n / SELECTIVE_SCAN_CHUNK, "fp32", core),
                  Saved("mamba_scan_out", di, "act", core), Saved("mamba_o_proj_in", di, "linear")]


def lightning_tensors(model: ModelConfig, tp: int = 1) -> list[Saved]:
    """Lightning attention (MiniMax): SiLU's input (the qkv projection's output) and output (q, k, v, the chunk
    kernel's saved inputs, under the core module), the core output, the norm output and the sigmoid gate (the
    gate multiply's operands), o_proj's input."""
    lt = model.lightning
    inner = lt.num_heads * lt.head_dim
    return [Saved("lightning_qkv_proj_out", 3 * inner, "act"), Saved("lightning_qkv", 3 * inner, "act", LINEAR_CORE),
            Saved("lightning_chunk_out", inner, "act"), Saved("lightning_norm_out", inner, "act", "norms"),
            Saved("lightning_out_gate", inner, "act"), Saved("lightning_o_proj_in", inner, "linear")]


def gqa_tensors(model: ModelConfig, tp: int = 1, kind: str = "gqa") -> list[Saved]:
    """GQA / SWA under FlashAttention: q, k, v (after the q/k norms and RoPE; k and v at the KV heads, replicated
    past tp), the fp32 LSE per query head, the output; the q/k norms' inputs; with the output gate the gate and
    the gated o_proj input, else the output is o_proj's input (E5M6 under fp8, as MLA's)."""
    g = model.section(kind)
    hq, D = g.num_heads, g.head_dim
    kv = _tp_equivalent(g.num_kv_heads, MIXERS[kind].tp_rules(g)[1], tp) * D
    out = []
    if g.qk_norm:
        out += [Saved(f"{kind}_q_norm_in", hq * D, "act"), Saved(f"{kind}_k_norm_in", kv, "act")]
    out += [Saved(f"{kind}_q", hq * D, "act"), Saved(f"{kind}_k", kv, "act"), Saved(f"{kind}_v", kv, "act"),
            Saved(f"{kind}_attn_lse", hq, "fp32", "attention_core")]
    if g.output_gate:
        return out + [Saved(f"{kind}_attn_out", hq * D, "act"), Saved(f"{kind}_out_gate", hq * D, "act"),
                      Saved(f"{kind}_o_proj_in", hq * D, "linear")]
    return out + [Saved(f"{kind}_attn_out", hq * D, "attn_linear")]


# Every mixer kind's saved tensors (model, tp) -> list; `memory.plan.TRAINED_KINDS` is its keys.
MIXER_TENSORS: dict[str, Callable[[ModelConfig, int], list[Saved]]] = {
    "kda": lambda model, tp=1: kda_tensors(model), "mla": lambda model, tp=1: mla_tensors(model),
    "gdn": gdn_tensors, "mamba2": mamba2_tensors, "mamba": mamba_tensors, "lightning": lightning_tensors,
    "gqa": gqa_tensors, "swa": lambda model, tp=1: gqa_tensors(model, tp, "swa"),
}


def ffn_tensors(model: ModelConfig, kind: str) -> list[Saved]:
    """Dense GLU: gate/up output (the SwiGLU input) and the SwiGLU output (down's input); a plain MLP the same with
    the up output alone (its squared ReLU's input). MoE: fp32 router
    scores; the shared experts' SwiGLU input and output (with a sigmoid gate, its output and the gate);
    LatentMoE's latent down output (its norm's input)
    and the latent up-projection's input; per routed copy (top-k) the dispatched input, the SwiGLU input, its
    fp32 routing weight and the weighted SwiGLU output (down's input).

    The routing weight multiplies the SwiGLU output inside the activation, so the combine is a plain sum that
    saves nothing and no expert output is kept: Megatron-Core's GroupedMLP since v0.13 ("memory efficient token
    permutation by moving the probs multiplication from unpermutation to activation function",
    megatron/core/transformer/moe/README.md), the form in which DeepSeek-V3's "cache the inputs of the SwiGLU
    operator and recompute its output in the backward pass" (sec. 3.3.4) needs nothing more than the SwiGLU
    input. (A combine that weights the expert outputs instead would keep k x width_in more per token. The step's
    time model does price such a combine, the measured fused unpermute whose backward reads the rows for the
    routing-weight gradient, `calibration/permute_fused.py`: the two agree on a Megatron-style stack only up to
    where that dot product runs, one read of the rows either way.)"""
    glu = 2 if model.ffn_gated else 1  # a plain MLP's activation reads the up-projection alone
    if kind == "dense":
        w = model.dense_ffn_width
        return [Saved("dense_gate_up", glu * w, "act"), Saved("dense_act", w, "linear")]
    moe = model.moe
    out = [Saved("moe_router_scores", moe.num_routed_experts, "fp32")]
    shared_w = moe.num_shared_experts * (moe.shared_expert_ffn_width or moe.expert_ffn_width)
    if shared_w:
        out += [Saved("shared_gate_up", glu * shared_w, "moe_swiglu_in"),
                Saved("shared_act", shared_w, "linear", "moe_act")]
        if moe.shared_expert_gate:  # sigmoid(x w) x shared output: the product saves both operands
            out += [Saved("shared_out", model.hidden_size, "act"), Saved("shared_gate", 1, "act")]
    if moe.latent_width:
        if moe.latent_norm:
            out.append(Saved("moe_latent_down", moe.latent_width, "act"))
        out.append(Saved("moe_latent_up_in", moe.latent_width, "linear"))
    width_in, k, n = moe.latent_width or model.hidden_size, moe.num_active_experts, moe.expert_ffn_width
    return out + [Saved("routed_in", k * width_in, "linear"), Saved("routed_gate_up", k * glu * n, "moe_swiglu_in"),
                  Saved("routed_weight", k, "fp32"), Saved("routed_act", k * n, "linear", "moe_act")]


def saved_tensors(model: ModelConfig, index: int, tp: int = 1) -> list[Saved]:
    """Every tensor layer `index` (0-based) saves for its backward without recompute, plus the `only_if` ones:
    its pre-norms', each mixer's (`MIXER_TENSORS`) and its FFN's. `tp`: elements are tp x one rank's (the module
    docstring), the whole layer's at tp = 1."""
    layer = model.layers[index]
    out = _norm_tensors(model, index)
    for kind in layer.mixers:
        out += MIXER_TENSORS[kind](model, tp)
    return out + (ffn_tensors(model, layer.ffn) if layer.ffn is not None else [])


def module_parts(recompute_modules: tuple[str, ...]) -> frozenset[str]:
    """The modules whose tensors `recompute_modules` rebuild: each one and those it covers
    (`configs.planning.RECOMPUTE_MODULE_COVERS`: `linear_attn_core` rebuilds KDA's `kda_core` tensors too)."""
    return frozenset(recompute_modules).union(*(RECOMPUTE_MODULE_COVERS.get(m, ()) for m in recompute_modules))


def layer_activations(model: ModelConfig, index: int, recompute_modules: tuple[str, ...] = (),
                      precision: str = "bf16", tp: int = 1) -> LayerActivations:
    """Layer `index` under selective recompute of `recompute_modules` (empty: nothing recomputed) and `precision`:
    what stays saved, what is rebuilt before its backward, and which kept tensors are FP8 / E5M6. Bytes per token
    of the whole layer (tp = 1) or, given `tp`, tp x one rank's (divide by tp for one rank)."""
    a = bytes_per_element(model.activation_dtype)
    parts = module_parts(recompute_modules)
    kept = rebuilt = 0.0
    fp8, e5m6 = [], []
    for t in saved_tensors(model, index, tp):
        if t.only_if is not None and t.only_if not in parts:
            continue
        b = t.elements * element_bytes(t.store, precision, a)
        if t.module is not None and t.module in parts:
            rebuilt += b
            continue
        kept += b
        if precision == "fp8" and t.store in ("linear", "moe_swiglu_in"):
            fp8.append(t.name)
        elif precision == "fp8" and t.store == "attn_linear":
            e5m6.append(t.name)
    return LayerActivations(kept, rebuilt, tuple(fp8), tuple(e5m6))


def layer_activation_bytes_per_token(model: ModelConfig, index: int, precision: str = "bf16") -> int:
    """One layer without recompute: every saved tensor of `saved_tensors`."""
    return int(round(layer_activations(model, index, (), precision).kept_bytes))


def checkpointed_layer_bytes_per_token(model: ModelConfig) -> int:
    """With full per-layer recompute only the layer input (hidden, activation dtype) is kept: the residual
    stream is no linear layer's cached input, so FP8 caching leaves it in the activation dtype."""
    return int(model.hidden_size * bytes_per_element(model.activation_dtype))
