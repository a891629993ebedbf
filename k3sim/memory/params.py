"""Parameter counts by component, computed from the config (never typed in).

Shapes follow the published implementations: KDA as in fla `KimiDeltaAttention` / Kimi-Linear
(q, k, v projections, depthwise short conv on each, decay-gate projection, beta, A_log, dt_bias, output
gate, o_norm, o_proj); MLA as in DeepSeek-V2/V3 (q_a/q_b or q, kv_a with rope key, kv_b, o) plus K3's
sigmoid output gate; gated (GLU) FFNs with 3 matrices for dense, shared and routed experts; LatentMoE
(down-project d -> latent, RMSNorm, experts in latent space, up-project back) with the router reading
the full hidden state (fused with the latent down-projection, MISSION sec. 4). Biases are absent except
the router's score-correction bias (noaux_tc).

"Active per token" counts every parameter a text token is multiplied with: the top-k routed experts
instead of all of them, and everything else except the input embedding table (a lookup, not a matmul)
and the vision tower (it runs on image patches). With this convention K3, K2 and Kimi-Linear land within
1-4 % of their published active counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.model import ModelConfig

ROUTED = "routed_experts"


def kda_layer_params(model: ModelConfig) -> int:
    kda, d = model.kda, model.hidden_size
    if kda is None:
        return 0
    h, dk, dv = kda.num_heads, kda.head_dim_k, kda.head_dim_v
    qkv = d * h * (2 * dk + dv)
    conv = kda.conv_kernel_size * h * (2 * dk + dv)  # depthwise, no bias
    r = kda.alpha_gate_rank
    alpha_gate = d * h * dk if r is None else d * r + r * h * dk
    beta = d * h
    decay = h + h * dk  # A_log per head, dt_bias per channel
    r = kda.output_gate_rank
    out_gate = d * h * dv if r is None else d * r + r * h * dv
    o_norm = dv
    o_proj = h * dv * d
    return qkv + conv + alpha_gate + beta + decay + out_gate + o_norm + o_proj


def mla_layer_params(model: ModelConfig) -> int:
    mla, d = model.mla, model.hidden_size
    if mla is None:
        return 0
    h, qk = mla.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank is None:
        q = d * h * qk
    else:
        q = d * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * h * qk  # q_a, q_a_norm, q_b
    kv_a = d * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank  # + kv_a_norm
    kv_b = mla.kv_lora_rank * h * (mla.qk_nope_head_dim + mla.v_head_dim)
    o = h * mla.v_head_dim * d
    gate = d * h * mla.v_head_dim if mla.output_gate else 0
    return q + kv_a + kv_b + o + gate


def routed_expert_params(model: ModelConfig) -> int:
    """One routed expert: gate, up, down of a GLU over the latent (or hidden) width."""
    moe = model.moe
    width_in = moe.latent_width or model.hidden_size
    return 3 * width_in * moe.expert_ffn_width


def moe_layer_params(model: ModelConfig) -> dict[str, int]:
    """Total parameters of one MoE FFN by component."""
    moe, d = model.moe, model.hidden_size
    e = moe.num_routed_experts
    shared_w = moe.shared_expert_ffn_width or moe.expert_ffn_width
    latent = 0
    if moe.latent_width:
        latent = 2 * d * moe.latent_width + (moe.latent_width if moe.latent_norm else 0)
    return {
        ROUTED: e * routed_expert_params(model),
        "shared_experts": moe.num_shared_experts * 3 * d * shared_w,
        "latent_projections": latent,
        "router": d * e + (e if moe.router_bias else 0),
    }


def layer_params(model: ModelConfig, index: int) -> dict[str, int]:
    """Total parameters of layer `index` (0-based) by component."""
    d = model.hidden_size
    out = {"kda": 0, "mla": 0}
    out[model.layer_kinds[index]] = (
        kda_layer_params(model) if model.layer_kinds[index] == "kda" else mla_layer_params(model))
    if model.ffn_kinds[index] == "dense":
        out["dense_ffn"] = 3 * d * model.dense_ffn_width
    else:
        out.update(moe_layer_params(model))
    out["norms"] = 2 * d  # pre-attention and pre-FFN RMSNorm
    if model.attn_res_block_size:
        # Assumption: per sublayer one pseudo-query (d) and one key RMSNorm (d) (AttnRes, arXiv 2603.15031).
        out["attn_res"] = 2 * 2 * d
    return {k: v for k, v in out.items() if v}


def vision_params(model: ModelConfig) -> int:
    """ViT: patch embedding (conv, with bias) + per layer QKV/O with biases, MLP, two LayerNorms."""
    v = model.vision
    if v is None:
        return 0
    h, f = v.hidden_size, v.intermediate_size
    patch = v.num_channels * v.patch_size**2 * h + h
    mlp = (3 if v.mlp_gated else 2) * h * f + f + h
    per_layer = 4 * (h * h + h) + mlp + 2 * 2 * h
    return patch + v.num_layers * per_layer + 2 * h


def non_layer_params(model: ModelConfig) -> dict[str, int]:
    """Embeddings, lm_head (absent if tied), final norm, vision tower."""
    emb = model.vocab_size * model.hidden_size
    out = {
        "embeddings": emb,
        "lm_head": 0 if model.tie_word_embeddings else emb,
        "norms": model.hidden_size,
        "vision": vision_params(model),
    }
    return {k: v for k, v in out.items() if v}


@dataclass
class ParamRow:
    component: str
    total_params: int
    active_params: int


@dataclass
class ParamReport:
    total_params: int
    active_params: int
    rows: list[ParamRow] = field(default_factory=list)

    def by_component(self) -> dict[str, dict[str, int]]:
        return {r.component: {"total": r.total_params, "active": r.active_params} for r in self.rows}


def count_params(model: ModelConfig) -> ParamReport:
    """Total and active-per-token parameters by component, summed over all layers."""
    totals: dict[str, int] = {}
    for i in range(model.num_layers):
        for k, v in layer_params(model, i).items():
            totals[k] = totals.get(k, 0) + v
    for k, v in non_layer_params(model).items():
        totals[k] = totals.get(k, 0) + v
    order = ["embeddings", "lm_head", "kda", "mla", "dense_ffn", ROUTED, "shared_experts",
             "latent_projections", "router", "norms", "attn_res", "vision"]
    rows = []
    for comp in order:
        if comp not in totals:
            continue
        total = totals[comp]
        if comp == ROUTED:
            active = model.num_moe_layers * model.moe.num_active_experts * routed_expert_params(model)
        elif comp in ("embeddings", "vision"):
            active = 0
        else:
            active = total
        rows.append(ParamRow(comp, total, active))
    return ParamReport(
        total_params=sum(r.total_params for r in rows),
        active_params=sum(r.active_params for r in rows),
        rows=rows,
    )


def stored_format(model: ModelConfig, component: str) -> str:
    """Weight format a component is stored in: routed experts in their format, embeddings/lm_head in
    `embedding_format`, the small rest (norms, AttnRes queries, vision) in bf16, other linears in
    `weight_format`."""
    if component == ROUTED:
        return model.moe.routed_weight_format
    if component in ("embeddings", "lm_head"):
        return model.embedding_format
    if component in ("norms", "attn_res", "vision"):
        return "bf16"
    return model.weight_format


def stored_weight_bytes(model: ModelConfig, report: ParamReport | None = None) -> int:
    """Bytes of all weights in their stored formats (sum over components of params x bytes/element)."""
    report = report or count_params(model)
    return int(sum(r.total_params * bytes_per_element(stored_format(model, r.component))
                   for r in report.rows))
