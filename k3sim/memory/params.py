"""Parameter counts by component, computed from the config (never typed in).

Shapes follow the published implementations, one formula per layer kind in `configs/kinds/`: KDA as in fla
`KimiDeltaAttention` / Kimi-Linear (q, k, v projections, depthwise short conv on each, decay-gate projection,
beta, A_log, dt_bias, output gate, o_norm, o_proj); MLA as in DeepSeek-V2/V3 (q_a/q_b or q, kv_a with rope
key, kv_b, o) plus K3's sigmoid output gate; gated (GLU) FFNs with 3 matrices for dense, shared and routed
experts (2 for the plain squared-ReLU FFNs of Nemotron-H); LatentMoE
(down-project d -> latent, RMSNorm, experts in latent space, up-project back) with the router reading
the full hidden state (fused with the latent down-projection, MISSION sec. 4). Biases are absent except
the router's score-correction bias (noaux_tc).

"Active per token" counts every parameter a text token is multiplied with: the top-k routed experts
instead of all of them, and everything else except the input embedding table (a lookup, not a matmul;
a table tied to the output head is multiplied there, so it counts once) and the vision tower (it runs on
image patches). With this convention K3, K2 and Kimi-Linear land within 1-4 % of their published active
counts. The other mixer kinds' formulas and their sources are in `configs/kinds/` (one module per kind).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.kinds import FFNS, MIXERS, ROUTED, MoE
from k3sim.configs.model import ModelConfig

# Components in table order: embeddings, the mixers by kind (registry order: kda, mla first), the FFNs, the rest.
COMPONENTS = ("embeddings", "lm_head", *MIXERS, "dense_ffn", ROUTED, "shared_experts", "latent_projections",
              "router", "norms", "attn_res", "vision")


def mixer_params(model: ModelConfig, kind: str) -> int:
    """Parameters of one layer of mixer kind `kind` (the registry's formula, `configs/kinds/<kind>.py`); 0 if
    the model has no section of that kind."""
    cfg = model.section(kind)
    return 0 if cfg is None else MIXERS[kind].params(cfg, model.hidden_size)


def kda_layer_params(model: ModelConfig) -> int:
    return mixer_params(model, "kda")


def mla_layer_params(model: ModelConfig) -> int:
    return mixer_params(model, "mla")


def routed_expert_params(model: ModelConfig) -> int:
    """One routed expert: gate, up, down of a GLU (up, down without `ffn_gated`) over the latent (or hidden)
    width."""
    return MoE.routed_expert_params(model)


def moe_layer_params(model: ModelConfig) -> dict[str, int]:
    """Total parameters of one MoE FFN by component."""
    return FFNS["moe"].params(model)


def layer_params(model: ModelConfig, index: int) -> dict[str, int]:
    """Total parameters of layer `index` (0-based) by component: its mixers by kind name, its FFN's
    components, one RMSNorm (d) before the mixers and one before the FFN where the layer has them."""
    d = model.hidden_size
    layer = model.layers[index]
    out = {kind: mixer_params(model, kind) for kind in layer.mixers}
    if layer.ffn is not None:
        out.update(FFNS[layer.ffn].params(model))
    out["norms"] = d * ((1 if layer.mixers else 0) + (1 if layer.ffn else 0))
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
    rows = []
    for comp in COMPONENTS:
        if comp not in totals:
            continue
        total = totals[comp]
        if comp == ROUTED:
            active = model.num_moe_layers * model.moe.num_active_experts * routed_expert_params(model)
        elif comp == "vision" or (comp == "embeddings" and not model.tie_word_embeddings):
            active = 0
        else:  # a tied table is the output head too: every token is multiplied with it once
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
