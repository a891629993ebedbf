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
  the chunk output, which the gated output norm saves as its own input.

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

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.model import ModelConfig
from k3sim.kernels.ops import KDA_CHUNK

FP32 = 4
# e4m3 values with one fp32 scale per 1x128 tile (DeepSeek-V3 sec. 3.3.2 fine-grained quantisation)
FP8_CACHED = 1 + 4 / 128
# DeepSeek's E5M6 (12 bits) for the attention output, same 1x128 scale tiling
E5M6_CACHED = 1.5 + 4 / 128

# How a saved tensor is stored: "act" the activation dtype, "fp32", "linear" a linear layer's input (FP8 under
# fp8), "attn_linear" the attention output o_proj saves (E5M6 under fp8), "moe_swiglu_in" (FP8 under fp8).
STORES = ("act", "fp32", "linear", "attn_linear", "moe_swiglu_in")


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
    """The two pre-norms: inputs kept (the layer input and the attention residual), outputs under `norms`. The
    MoE pre-norm output also feeds the BF16 router, so it is not FP8-cached."""
    d = model.hidden_size
    ffn_out = "act" if model.ffn_kinds[index] == "moe" else "linear"
    return [Saved("layer_input", d, "act"), Saved("attn_norm_out", d, "linear", "norms"),
            Saved("ffn_norm_in", d, "act"), Saved("ffn_norm_out", d, ffn_out, "norms")]


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


def ffn_tensors(model: ModelConfig, kind: str) -> list[Saved]:
    """Dense GLU: gate/up output (the SwiGLU input) and the SwiGLU output (down's input). MoE: fp32 router
    scores; the shared experts' SwiGLU input and output; LatentMoE's latent down output (its norm's input)
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
    if kind == "dense":
        w = model.dense_ffn_width
        return [Saved("dense_gate_up", 2 * w, "act"), Saved("dense_act", w, "linear")]
    moe = model.moe
    out = [Saved("moe_router_scores", moe.num_routed_experts, "fp32")]
    shared_w = moe.num_shared_experts * (moe.shared_expert_ffn_width or moe.expert_ffn_width)
    if shared_w:
        out += [Saved("shared_gate_up", 2 * shared_w, "moe_swiglu_in"),
                Saved("shared_act", shared_w, "linear", "moe_act")]
    if moe.latent_width:
        if moe.latent_norm:
            out.append(Saved("moe_latent_down", moe.latent_width, "act"))
        out.append(Saved("moe_latent_up_in", moe.latent_width, "linear"))
    width_in, k, n = moe.latent_width or model.hidden_size, moe.num_active_experts, moe.expert_ffn_width
    return out + [Saved("routed_in", k * width_in, "linear"), Saved("routed_gate_up", k * 2 * n, "moe_swiglu_in"),
                  Saved("routed_weight", k, "fp32"), Saved("routed_act", k * n, "linear", "moe_act")]


def saved_tensors(model: ModelConfig, index: int) -> list[Saved]:
    """Every tensor layer `index` (0-based) saves for its backward without recompute, plus the `only_if` ones."""
    attn = kda_tensors(model) if model.layer_kinds[index] == "kda" else mla_tensors(model)
    return _norm_tensors(model, index) + attn + ffn_tensors(model, model.ffn_kinds[index])


def layer_activations(model: ModelConfig, index: int, recompute_modules: tuple[str, ...] = (),
                      precision: str = "bf16") -> LayerActivations:
    """Layer `index` under selective recompute of `recompute_modules` (empty: nothing recomputed) and `precision`:
    what stays saved, what is rebuilt before its backward, and which kept tensors are FP8 / E5M6."""
    a = bytes_per_element(model.activation_dtype)
    kept = rebuilt = 0.0
    fp8, e5m6 = [], []
    for t in saved_tensors(model, index):
        if t.only_if is not None and t.only_if not in recompute_modules:
            continue
        b = t.elements * element_bytes(t.store, precision, a)
        if t.module is not None and t.module in recompute_modules:
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
