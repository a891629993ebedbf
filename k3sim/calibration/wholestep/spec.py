"""Per-rank shapes of a whole-step measurement and the kernel sequence ("manifest") of each layer kind.

Torch-free on purpose: the shapes come from a k3sim `ModelConfig` here (CPU, CI), are written to
`specs.json` beside this file, and the GPU machine (whose image has torch but not pydantic) builds its
random-weight model from that JSON. A test checks the JSON still equals what the configs give, so the
configs stay the one source of truth.

Per-rank shapes under tensor parallelism `tp` and expert parallelism `ep` (one GPU plays one rank; the
TP all-reduce and the EP dispatch/combine are NOT run, so a measured step is the compute of one rank):
- KDA: heads / tp; q, k, v projections as one GEMM (modelling choice: K3 fuses them (domain-facts 2.2);
  Kimi-Linear's checkpoint keeps three matrices a serving engine can stack); the decay-gate projection
  low rank (Kimi-Linear f_a/f_b, A replicated, B column-split) or full rank (K3); beta projection;
  low-rank output gate (g_a replicated, g_b column-split); o_proj row-split.
- MLA: heads / tp; q (or q_a replicated + q_b split), kv_a (replicated), kv_b split by heads, o split;
  K3's sigmoid output gate split by heads. No rotary embedding: both models set `mla_use_nope: true`
  (domain-facts 2.1/2.2), so the 64 rope dims carry no rotation. Every rank caches the whole latent
  (512 + 64 per token), as vLLM/SGLang MLA under TP do (memory/plan.py makes the same choice).
- Dense FFN and shared experts: width / tp. Routed experts: E / ep experts per rank, full width.
- LatentMoE (K3): the latent down-projection and the router are one GEMM (d -> latent + E), its weights
  whole on every rank (issue 10 item 4: sharded and all-gathered, the gather not run here); the latent
  up-projection whole too. A token's routed picks are its global top-k; a rank computes the picks that
  fall in its E / ep local experts (on average k / ep per token).
- Embedding, final norm and LM head (vocab / tp rows) only when the slice is the whole model.
- Gated DeltaNet (Qwen3-Next; issue 23 item 7): key and value heads / tp; in_proj_qkvz and in_proj_ba as ONE
  GEMM (d -> 2 HK dk + 2 HV dv + 2 HV, the step model's `gdn_in_proj`), its output laid out [q | k | v | z | b | a]
  (a serving engine permutes the checkpoint's per-key-head interleave once, at load); a depthwise short conv
  over q, k, v; the gated RMSNorm with SiLU(z) (HF Qwen3NextRMSNormGated); out_proj row-split.
- Gated GQA (Qwen3-Next's full attention): query heads / tp, KV heads / tp replicated to one past tp = KV
  heads (vLLM QKVParallelLinear); q (with its output gate, 2 x head_dim per head), k, v as ONE GEMM; per-head
  q/k RMSNorm; RoPE on the first `rope_dim` dims of each head (partial_rotary_factor); KV cache bf16.
- Softmax router with top-k renormalised (Qwen norm_topk_prob), no score-correction bias; the shared expert
  behind a sigmoid gate d -> 1 (Qwen3-Next shared_expert_gate).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

SPECS_PATH = Path(__file__).with_name("specs.json")

# The configurations the measurement runs: name -> (model YAML relative to the repo root, tp, ep,
# 1-based first and last layer or None for the whole model, embedding + LM head forced on a slice).
# Layers 5-8 of both models are three KDA layers then one MLA layer, all with MoE FFNs; layers 1-4 of
# Kimi-Linear hold its dense-FFN layer and its first MLA layer (the smoke test's small whole model);
# layers 1-4 of either model without the head are the training check's second layer mix.
CONFIGS = {
    "kimi-linear-48b": ("models/kimi-linear-48b.yaml", 1, 1, None, False),
    "kimi-linear-48b-l5-8": ("models/kimi-linear-48b.yaml", 1, 1, (5, 8), False),
    "kimi-linear-48b-l1-4h": ("models/kimi-linear-48b.yaml", 1, 1, (1, 4), True),
    "k3-tp8-ep8-l5-8": ("models/kimi-k3.yaml", 8, 8, (5, 8), False),
    # training slices with the dense-FFN layer (issue 15 item 2, out-of-sample layer mix)
    "kimi-linear-48b-l1-4": ("models/kimi-linear-48b.yaml", 1, 1, (1, 4), False),
    "k3-tp8-ep8-l1-4": ("models/kimi-k3.yaml", 8, 8, (1, 4), False),
    "k3-tp4-ep8-l5-8": ("models/kimi-k3.yaml", 4, 8, (5, 8), False),  # another TP degree (24 KDA heads)
    # Qwen3-Next-80B-A3B at TP 1 (issue 23 item 7): the first 16 layers (12 GDN + 4 gated GQA, 3:1), the most
    # that fit one H200 beside the decode grid's largest cache and states (`fit_layers`), with embedding and head
    "qwen3-next-80b-l1-16h": ("models/qwen3-next-80b-a3b.yaml", 1, 1, (1, 16), True),
}


@dataclass(frozen=True)
class KDAShape:
    heads: int                 # per rank
    head_dim: int              # K = V
    conv: int                  # short-conv width (tokens)
    gate_rank: int | None      # None = full-rank decay gate
    out_gate_rank: int | None  # None = full-rank output gate


@dataclass(frozen=True)
class MLAShape:
    heads: int                 # per rank
    q_lora: int | None
    kv_lora: int
    nope: int
    rope: int
    v: int
    out_gate: bool


@dataclass(frozen=True)
class GDNShape:
    key_heads: int             # per rank
    value_heads: int           # per rank
    head_k: int
    head_v: int
    conv: int                  # short-conv width (tokens)

    @property
    def conv_channels(self) -> int:
        """q, k, v: the channels the short conv runs over."""
        return 2 * self.key_heads * self.head_k + self.value_heads * self.head_v

    @property
    def in_proj(self) -> int:
        """q, k, v, z, b, a: the one input projection's outputs."""
        return self.conv_channels + self.value_heads * self.head_v + 2 * self.value_heads


@dataclass(frozen=True)
class GQAShape:
    q_heads: int               # per rank
    kv_heads: int              # per rank (one replicated head past tp = KV heads)
    head_dim: int
    out_gate: bool             # q_proj also emits a sigmoid output gate per channel
    rope_dim: int              # rotated dims per head (0 = no RoPE)
    qk_norm: bool

    @property
    def qkv(self) -> int:
        return self.q_heads * self.head_dim * (2 if self.out_gate else 1) + 2 * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class MoEShape:
    experts: int               # all routed experts (the router scores every one)
    experts_local: int         # on this rank
    topk: int                  # global picks per token
    width: int                 # routed expert intermediate width
    latent: int | None         # LatentMoE width; None = experts read the hidden state
    latent_norm: bool
    shared_width: int          # all shared experts stacked, per rank (0 = none)
    routed_format: str         # "bf16" | "mxfp4"
    router: str = "sigmoid"    # "sigmoid" (+ score-correction bias) | "softmax"
    shared_gate: bool = False  # sigmoid gate d -> 1 on the shared experts


@dataclass(frozen=True)
class StepSpec:
    name: str
    model: str
    tp: int
    ep: int
    hidden: int
    layers: list = field(default_factory=list)  # [{"index": 1-based, "attn": kda|mla, "ffn": dense|moe}]
    embed_head: bool = False
    vocab_local: int = 0
    dense_width: int = 0       # dense FFN width per rank (0 = no dense layer in the slice)
    kda: KDAShape | None = None
    mla: MLAShape | None = None
    moe: MoEShape | None = None
    gdn: GDNShape | None = None
    gqa: GQAShape | None = None

    @property
    def num_kda(self) -> int:
        return sum(1 for x in self.layers if x["attn"] == "kda")

    @property
    def num_mla(self) -> int:
        return sum(1 for x in self.layers if x["attn"] == "mla")

    @property
    def num_gdn(self) -> int:
        return sum(1 for x in self.layers if x["attn"] == "gdn")

    @property
    def num_gqa(self) -> int:
        return sum(1 for x in self.layers if x["attn"] == "gqa")

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "StepSpec":
        d = dict(d)
        d["kda"] = KDAShape(**d["kda"]) if d.get("kda") else None
        d["mla"] = MLAShape(**d["mla"]) if d.get("mla") else None
        d["moe"] = MoEShape(**d["moe"]) if d.get("moe") else None
        d["gdn"] = GDNShape(**d["gdn"]) if d.get("gdn") else None
        d["gqa"] = GQAShape(**d["gqa"]) if d.get("gqa") else None
        return StepSpec(**d)


def _div(total: int, parts: int, what: str, option: str) -> int:
    from k3sim.errors import InputError

    if total % parts:
        raise InputError(f"{what} ({total}) is not divisible by {parts}", source=option, field=what)
    return total // parts


def spec_from_config(model, *, tp: int = 1, ep: int = 1, layers: tuple[int, int] | None = None,
                     name: str | None = None, source: str = "", head: bool = False) -> StepSpec:
    """Per-rank shapes of layers `layers` (1-based, inclusive; None = all) of `model` at (tp, ep); the
    embedding and LM head come with the whole model, or with a slice when `head`."""
    from k3sim.errors import InputError

    for opt, v in (("--tp", tp), ("--ep", ep)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"must be a positive integer (got {v!r})", source=opt, field=opt.lstrip("-"))
    L = model.num_layers
    lo, hi = layers if layers is not None else (1, L)
    if not (1 <= lo <= hi <= L):
        raise InputError(f"layers {lo}-{hi} outside 1-{L} of {model.name}", source="--layers", field="layers")
    kinds, ffns = model.layer_kinds, model.ffn_kinds
    rows = [{"index": i, "attn": kinds[i - 1], "ffn": ffns[i - 1]} for i in range(lo, hi + 1)]
    bad = sorted({r["attn"] for r in rows} - set(MIXER_OPS))
    if bad or any(r["ffn"] not in ("dense", "moe") for r in rows):
        raise InputError(f"the whole-step model builds {', '.join(MIXER_OPS)} mixers with dense or MoE FFNs; layers "
                         f"{lo}-{hi} of {model.name} have {', '.join(bad) or 'other FFNs'}: pick other layers",
                         source="--layers", field="layers")
    kda = mla = moe = gdn = gqa = None
    if any(r["attn"] == "kda" for r in rows):
        k = model.kda
        if k.head_dim_k != k.head_dim_v:
            raise InputError("KDA head_dim_k != head_dim_v is not supported by fla's kernels here",
                             source=source, field="kda.head_dim_v")
        kda = KDAShape(_div(k.num_heads, tp, "kda.num_heads", "--tp"), k.head_dim_k, k.conv_kernel_size,
                       k.alpha_gate_rank, k.output_gate_rank)
    if any(r["attn"] == "mla" for r in rows):
        m = model.mla
        mla = MLAShape(_div(m.num_heads, tp, "mla.num_heads", "--tp"), m.q_lora_rank, m.kv_lora_rank,
                       m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.output_gate)
    if any(r["attn"] == "gdn" for r in rows):
        gdn = _gdn_shape(model.gdn, tp)
    if any(r["attn"] == "gqa" for r in rows):
        gqa = _gqa_shape(model.gqa, tp)
    if any(r["ffn"] == "moe" for r in rows):
        e = model.moe
        shared = e.num_shared_experts * (e.shared_expert_ffn_width or e.expert_ffn_width)
        if e.router_score == "softmax" and e.router_bias:
            raise InputError("a softmax router with a score-correction bias is not built here", source=source,
                             field="moe.router_bias")
        moe = MoEShape(e.num_routed_experts, _div(e.num_routed_experts, ep, "moe.num_routed_experts", "--ep"),
                       e.num_active_experts, e.expert_ffn_width, e.latent_width, e.latent_norm,
                       _div(shared, tp, "shared expert width", "--tp") if shared else 0, e.routed_weight_format,
                       router=e.router_score, shared_gate=bool(shared and e.shared_expert_gate))
    dense = 0
    if any(r["ffn"] == "dense" for r in rows):
        dense = _div(model.dense_ffn_width, tp, "dense_ffn_width", "--tp")
    whole = (lo == 1 and hi == L) or head
    return StepSpec(name=name or model.name, model=source or model.name, tp=tp, ep=ep, hidden=model.hidden_size,
                    layers=rows, embed_head=whole,
                    vocab_local=_div(model.vocab_size, tp, "vocab_size", "--tp") if whole else 0,
                    dense_width=dense, kda=kda, mla=mla, moe=moe, gdn=gdn, gqa=gqa)


def _gdn_shape(g, tp: int) -> GDNShape:
    return GDNShape(_div(g.num_key_heads, tp, "gdn.num_key_heads", "--tp"),
                    _div(g.num_value_heads, tp, "gdn.num_value_heads", "--tp"), g.head_dim_k, g.head_dim_v,
                    g.conv_kernel_size)


def _gqa_shape(a, tp: int) -> GQAShape:
    """Query heads split over tp; KV heads split, or one replicated head per rank past tp = KV heads (the
    kinds registry's rule, vLLM's QKVParallelLinear)."""
    from k3sim.configs.kinds import MIXERS

    q_rule, kv_rule = MIXERS["gqa"].tp_rules(a)
    for rule in (q_rule, kv_rule):
        why = rule.problem(tp)
        if why:
            from k3sim.errors import InputError

            raise InputError(why, source="--tp", field="tp")
    return GQAShape(q_rule.per_rank(tp), kv_rule.per_rank(tp), a.head_dim, a.output_gate,
                    int(a.rope_fraction * a.head_dim), a.qk_norm)


def build_specs(root: Path) -> dict[str, dict]:
    """Every configuration of CONFIGS from the shipped YAML files (CPU side)."""
    from k3sim.configs import load_model

    out = {}
    for name, (path, tp, ep, layers, head) in CONFIGS.items():
        model = load_model(root / path)
        out[name] = spec_from_config(model, tp=tp, ep=ep, layers=layers, name=name, source=path, head=head).to_dict()
    return out


def load_specs(path: Path = SPECS_PATH) -> dict[str, StepSpec]:
    return {k: StepSpec.from_dict(v) for k, v in json.loads(Path(path).read_text()).items()}


# ----------------------------------------------------------------------------------------------------
# Manifest: the kernels one layer of each kind runs, in order, with shapes in k3sim's op vocabulary
# (kernels/ops.py: gemm_bf16, moe_grouped_bf16, recurrent_kda_decode, chunk_kda_fwd, sdpa_causal_fwd;
# issue 10 / decode_ops: moe_mxfp4_decode (route + both kernels + combine), mla_decode (B, C, H),
# rmsnorm (T, D), silu_mul (T, N), router_topk (T, E, topk), residual_add (T, D), embedding (T, D)).
# Ops without a calibrated family yet keep descriptive names (gated_rmsnorm, moe_permute, moe_combine,
# conv1d_update, causal_conv1d_fwd, split_copy, kv_cache_write, bmm_bf16, sigmoid, ...).
# ----------------------------------------------------------------------------------------------------

def _op(op: str, what: str, **params) -> dict:
    return {"op": op, "what": what, "params": params}


def _gemm(M: int, N: int, K: int, what: str) -> dict:
    return _op("gemm_bf16", what, M=M, N=N, K=K)


@dataclass(frozen=True)
class StepShape:
    """Token work of one step: `chunk` prefill tokens (0 = none) after a cached `prefix`, `decodes`
    sequences of one token at context `context`, `seqs` sequences of `chunk` tokens each (training)."""

    decodes: int = 0
    context: int = 0
    chunk: int = 0
    prefix: int = 0
    seqs: int = 1
    train: bool = False

    @property
    def prefill_tokens(self) -> int:
        return self.chunk * self.seqs

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decodes


def kda_ops(s: StepSpec, st: StepShape) -> list[dict]:
    k, d, N = s.kda, s.hidden, st.tokens
    hk = k.heads * k.head_dim
    ops = [_op("rmsnorm", "input norm", T=N, D=d), _gemm(N, 3 * hk, d, "q/k/v projection (fused)")]
    if st.chunk:
        ops.append(_op("causal_conv1d_fwd", "short conv + SiLU on q/k/v (prefill, from conv state)" if st.prefix
                       else "short conv + SiLU on q/k/v", B=st.seqs, T=st.chunk, D=3 * hk, W=k.conv))
    if st.decodes:
        ops.append(_op("conv1d_update", "short conv + SiLU on q/k/v (decode, conv state in place)",
                       B=st.decodes, D=3 * hk, W=k.conv))
    if k.gate_rank is None:
        ops.append(_gemm(N, hk, d, "decay gate projection (full rank)"))
    else:
        ops += [_gemm(N, k.gate_rank, d, "decay gate f_a"), _gemm(N, hk, k.gate_rank, "decay gate f_b")]
    ops += [_gemm(N, k.heads, d, "beta projection"), _op("sigmoid", "beta", T=N, D=k.heads),
            _op("split_copy", "q, k, v made contiguous for fla", T=N, D=3 * hk)]
    if st.chunk:
        name = "chunk_kda_fwd_bwd" if st.train else "chunk_kda_fwd"
        p = dict(T=st.chunk, H=k.heads) if st.seqs == 1 else dict(T=st.chunk, H=k.heads, B=st.seqs)
        ops.append(_op(name, "KDA chunked" + (" from the prefix's state" if st.prefix else ""), **p))
    if st.decodes:
        ops.append(_op("recurrent_kda_decode", "KDA recurrent step (state read + written, fp32)",
                       B=st.decodes, T=1, H=k.heads))
    if k.out_gate_rank is None:
        ops.append(_gemm(N, hk, d, "output gate (full rank)"))
    else:
        ops += [_gemm(N, k.out_gate_rank, d, "output gate g_a"), _gemm(N, hk, k.out_gate_rank, "output gate g_b")]
    ops += [_op("gated_rmsnorm", "o_norm with sigmoid gate (per head)", T=N * k.heads, D=k.head_dim),
            _gemm(N, d, hk, "o_proj"), _op("residual_add", "residual", T=N, D=d)]
    return ops


def mla_ops(s: StepSpec, st: StepShape) -> list[dict]:
    m, d, N = s.mla, s.hidden, st.tokens
    H, qk = m.heads, m.nope + m.rope
    kv_a = m.kv_lora + m.rope
    ops = [_op("rmsnorm", "input norm", T=N, D=d)]
    if m.q_lora is None:
        ops += [_gemm(N, H * qk, d, "q projection"), _gemm(N, kv_a, d, "kv_a projection (latent + rope key)")]
    else:
        ops += [_gemm(N, m.q_lora + kv_a, d, "q_a + kv_a projection (fused, replicated)"),
                _op("rmsnorm", "q_a norm", T=N, D=m.q_lora), _gemm(N, H * qk, m.q_lora, "q_b projection")]
    ops += [_op("rmsnorm", "kv_a norm", T=N, D=m.kv_lora)]
    if not st.train:
        ops.append(_op("kv_cache_write", "latent + rope key into the cache", T=N, D=kv_a))
    if st.chunk:
        kv_len = st.prefix + st.chunk
        ops.append(_gemm(st.seqs * kv_len, H * (m.nope + m.v), m.kv_lora,
                         "kv_b up-projection of prefix + chunk latents" if st.prefix else "kv_b up-projection"))
        D = max(qk, m.v)  # v padded to the q/k head dim so the flash backend applies (as vLLM pads v for FA)
        if st.prefix:
            ops.append(_op("sdpa_prefix_causal_fwd", "chunk queries against prefix + chunk keys (causal, lower right)",
                           Tq=st.chunk, Tkv=kv_len, H=H, D=D))
        else:
            name = "sdpa_causal_fwd_bwd" if st.train else "sdpa_causal_fwd"
            p = dict(T=st.chunk, H=H, D=D) if st.seqs == 1 else dict(T=st.chunk, H=H, D=D, B=st.seqs)
            ops.append(_op(name, "causal attention of the chunk", **p))
    if st.decodes:
        B, C = st.decodes, st.context
        ops += [_op("bmm_bf16", "absorb W_UK into q (per head)", batch=H, M=B, N=m.kv_lora, K=m.nope),
                _op("mla_decode", "absorbed MLA attention over the latent cache", B=B, C=C, H=H),
                _op("bmm_bf16", "W_UV: latent -> v (per head)", batch=H, M=B, N=m.v, K=m.kv_lora)]
    if m.out_gate:
        ops += [_gemm(N, H * m.v, d, "output gate projection"), _op("sigmoid_mul", "output gate", T=N, D=H * m.v)]
    ops += [_gemm(N, d, H * m.v, "o_proj"), _op("residual_add", "residual", T=N, D=d)]
    return ops


def gdn_ops(s: StepSpec, st: StepShape) -> list[dict]:
    """Qwen3-Next's Gated DeltaNet layer (HF Qwen3NextGatedDeltaNet, vLLM's kernels): the kernels fla's chunk and
    in-place recurrent GDN are measured as (hybrid_ops), the glue around them named as it runs."""
    g, d, N = s.gdn, s.hidden, st.tokens
    Hk, H, K, V = g.key_heads, g.value_heads, g.head_k, g.head_v
    ch = g.conv_channels
    ops = [_op("rmsnorm", "input norm", T=N, D=d), _gemm(N, g.in_proj, d, "q/k/v/z + b/a projection (one GEMM)")]
    if st.chunk:
        ops.append(_op("causal_conv1d_fwd", "short conv + SiLU on q/k/v (prefill, from conv state)" if st.prefix
                       else "short conv + SiLU on q/k/v", B=st.seqs, T=st.chunk, D=ch, W=g.conv))
    if st.decodes:
        ops.append(_op("conv1d_update", "short conv + SiLU on q/k/v (decode, conv state in place)",
                       B=st.decodes, D=ch, W=g.conv))
    ops += [_op("gdn_gating", "beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias) in fp32", T=N, H=H),
            _op("split_copy", "q, k, v made contiguous for fla", T=N, D=ch),
            _op("split_copy", "z made contiguous for the gated norm", T=N, D=H * V)]
    if st.chunk:
        name = "chunk_gdn_fwd_bwd" if st.train else "chunk_gdn_fwd"
        p = dict(T=st.chunk, H=H, Hk=Hk) if st.seqs == 1 else dict(T=st.chunk, H=H, Hk=Hk, B=st.seqs)
        ops.append(_op(name, "GDN chunked" + (" from the prefix's state" if st.prefix else ""), **p))
    if st.decodes:
        ops.append(_op("recurrent_gdn_decode", "GDN recurrent step, fp32 state updated in place",
                       B=st.decodes, H=H, Hk=Hk))
    ops += [_op("gated_rmsnorm", "o norm with SiLU(z) gate (per value head)", T=N * H, D=V),
            _gemm(N, d, H * V, "out_proj"), _op("residual_add", "residual", T=N, D=d)]
    return ops


def gqa_ops(s: StepSpec, st: StepShape) -> list[dict]:
    """Qwen3-Next's gated attention (HF Qwen3NextAttention): one q(+gate)/k/v GEMM, per-head q/k norms, partial
    RoPE, the KV cache write, FlashAttention-2 through torch (prefill: causal over the chunk, or the chunk's queries
    against prefix + chunk aligned bottom right; decode: SDPA's flash backend over each request's cache), the
    sigmoid output gate, o_proj."""
    a, d, N = s.gqa, s.hidden, st.tokens
    Hq, Hkv, D = a.q_heads, a.kv_heads, a.head_dim
    ops = [_op("rmsnorm", "input norm", T=N, D=d), _gemm(N, a.qkv, d, "q (+ gate) / k / v projection (one GEMM)")]
    if a.qk_norm:
        ops += [_op("rmsnorm", "q norm (per head)", T=N * Hq, D=D), _op("rmsnorm", "k norm (per head)", T=N * Hkv, D=D)]
    if a.rope_dim:
        ops += [_op("rope", "partial RoPE on q", T=N, H=Hq, D=a.rope_dim),
                _op("rope", "partial RoPE on k", T=N, H=Hkv, D=a.rope_dim)]
    if not st.train:
        ops.append(_op("kv_cache_write", "k and v into the cache", T=N, D=2 * Hkv * D))
    if st.chunk:
        if st.train:
            p = dict(T=st.chunk, H=Hq, D=D) if st.seqs == 1 else dict(T=st.chunk, H=Hq, D=D, B=st.seqs)
            ops.append(_op("sdpa_causal_fwd_bwd", "causal attention of the chunk (GQA forward + backward)", **p))
        elif st.prefix:
            ops.append(_op("gqa_prefix_causal_fwd", "chunk queries against prefix + chunk keys (causal, bottom right)",
                           Tq=st.chunk, Tkv=st.prefix + st.chunk, Hq=Hq, Hkv=Hkv, D=D,
                           **({} if st.seqs == 1 else {"B": st.seqs})))
        else:
            ops.append(_op("gqa_prefill_fwd", "causal attention of the chunk", T=st.chunk, Hq=Hq, Hkv=Hkv, D=D,
                           window=st.chunk, **({} if st.seqs == 1 else {"B": st.seqs})))
    if st.decodes:
        ops.append(_op("gqa_decode", "one query per request over its cache", B=st.decodes, C=st.context, Hq=Hq,
                       Hkv=Hkv, D=D))
    if a.out_gate:
        ops.append(_op("sigmoid_mul", "output gate", T=N, D=Hq * D))
    ops += [_gemm(N, d, Hq * D, "o_proj"), _op("residual_add", "residual", T=N, D=d)]
    return ops


def dense_ffn_ops(s: StepSpec, st: StepShape) -> list[dict]:
    N, d, w = st.tokens, s.hidden, s.dense_width
    return [_op("rmsnorm", "post-attention norm", T=N, D=d), _gemm(N, 2 * w, d, "dense gate+up"),
            _op("silu_mul", "SwiGLU", T=N, N=w), _gemm(N, d, w, "dense down"),
            _op("residual_add", "residual", T=N, D=d)]


def moe_rows(tokens: int, topk: int, local: int, experts: int) -> int:
    """Sorted picks a rank gathers for its grouped GEMM: all tokens*topk without EP; under EP the
    expected local picks m = tokens*topk*local/experts plus 6 sqrt(m) + 16 (modelling choice: a pick
    count is binomial, sd <= sqrt(m), so an overflow is a 6-sigma event; the 16 covers tiny batches),
    never more than tokens*topk. Standing in for the picks an all-to-all delivers to the rank."""
    total = tokens * topk
    if local >= experts:
        return total
    m = total * local / experts
    return min(total, math.ceil(m + 6 * math.sqrt(m) + 16))


def moe_ops(s: StepSpec, st: StepShape, expert_kernel: str = "grouped_bf16") -> list[dict]:
    """expert_kernel: "grouped_bf16" (torch._grouped_mm) or "mxfp4" (helper H4's token-centric kernel)."""
    e, N, d = s.moe, st.tokens, s.hidden
    x_w = e.latent or d
    local_picks = "global top-k, local picks" if e.experts_local < e.experts else "top-k"
    ops = [_op("rmsnorm", "post-attention norm", T=N, D=d)]
    if e.latent:
        ops.append(_gemm(N, e.latent + e.experts, d, "latent down-projection + router (one GEMM)"))
        if e.latent_norm:
            ops.append(_op("rmsnorm", "latent norm", T=N, D=e.latent))
    else:
        ops.append(_gemm(N, e.experts, d, "router"))
    if e.router == "softmax":
        ops.append(_op("router_softmax_topk", "softmax (fp32), top-k, renormalise", T=N, E=e.experts, topk=e.topk))
    else:
        ops.append(_op("router_topk", "sigmoid + bias, top-k, renormalise", T=N, E=e.experts, topk=e.topk))
    topk_local = e.topk * e.experts_local / e.experts  # expected local picks per token
    tk = int(topk_local) if float(topk_local).is_integer() else topk_local
    if expert_kernel == "mxfp4":
        ops.append(_op("moe_mxfp4_decode", "routed experts: gate/up + SwiGLU + down (MXFP4 weights, reads the ids)",
                       B=N, E=e.experts_local, K=x_w, N=e.width, topk=tk))
    else:
        rows = moe_rows(N, e.topk, e.experts_local, e.experts)
        ops += [_op("moe_permute", f"sort picks by expert, gather rows ({local_picks})", T=N, topk=e.topk, rows=rows, D=x_w),
                _op("moe_grouped_bf16", "routed experts gate+up", B=N, E=e.experts_local, K=x_w, N=2 * e.width, topk=tk),
                _op("silu_mul", "SwiGLU (routed)", T=f"{N}x{tk}", N=e.width),
                _op("moe_grouped_bf16", "routed experts down", B=N, E=e.experts_local, K=e.width, N=x_w, topk=tk),
                _op("moe_combine", "weighted sum of the picks (fp32 accumulate)", T=N, topk=tk, rows=rows, D=x_w)]
    if e.latent:
        ops.append(_gemm(N, d, e.latent, "latent up-projection"))
    if e.shared_width:
        ops += [_gemm(N, 2 * e.shared_width, d, "shared experts gate+up (stacked)"),
                _op("silu_mul", "SwiGLU (shared)", T=N, N=e.shared_width),
                _gemm(N, d, e.shared_width, "shared experts down")]
        if e.shared_gate:
            ops.append(_op("shared_expert_gate", "sigmoid(x w_gate) x shared expert", T=N, D=d))
    ops.append(_op("residual_add", "routed + shared + residual", T=N, D=d))
    return ops


MIXER_OPS = {"kda": kda_ops, "mla": mla_ops, "gdn": gdn_ops, "gqa": gqa_ops}  # mixer kind -> its kernel list


def head_ops(s: StepSpec, st: StepShape) -> dict[str, list[dict]]:
    # Logits for every prefill token is what a training step computes; a serving step needs only each
    # sequence's last token (the decodes and one per prefill chunk).
    n_out = st.tokens if st.train else st.decodes + (st.seqs if st.chunk else 0)
    return {"embedding": [_op("embedding", "token embedding gather", T=st.tokens, D=s.hidden)],
            "lm_head": [_op("rmsnorm", "final norm", T=n_out, D=s.hidden),
                        _gemm(n_out, s.vocab_local, s.hidden, "LM head (vocab-parallel rows)")]}


def manifest(s: StepSpec, st: StepShape, expert_kernel: str = "grouped_bf16") -> dict:
    """The kernel sequence of one layer of each kind present, and how many layers of each kind run."""
    kinds: dict[str, list[dict]] = {}
    counts: dict[str, int] = {}
    for r in s.layers:
        for part in (r["attn"], "dense_ffn" if r["ffn"] == "dense" else "moe"):
            counts[part] = counts.get(part, 0) + 1
    for kind, fn in MIXER_OPS.items():
        if getattr(s, kind) and counts.get(kind):
            kinds[kind] = fn(s, st)
    if counts.get("dense_ffn"):
        kinds["dense_ffn"] = dense_ffn_ops(s, st)
    if counts.get("moe"):
        kinds["moe"] = moe_ops(s, st, expert_kernel)
    if s.embed_head:
        kinds.update(head_ops(s, st))
        counts["embedding"] = counts["lm_head"] = 1
    return {"config": s.name, "model": s.model, "tp": s.tp, "ep": s.ep, "step": asdict(st),
            "expert_kernel": expert_kernel, "layer_counts": counts, "layers": kinds,
            "not_run": "TP all-reduce, EP dispatch/combine, latent-weight all-gather (one GPU = one rank's compute)"}


def sequence(s: StepSpec, st: StepShape, expert_kernel: str = "grouped_bf16") -> list[dict]:
    """The whole step's kernel list in execution order (op + params), as `model.trace` records it."""
    ops: list[dict] = []
    heads = head_ops(s, st) if s.embed_head else {}
    ops += heads.get("embedding", [])
    for r in s.layers:
        ops += MIXER_OPS[r["attn"]](s, st)
        ops += dense_ffn_ops(s, st) if r["ffn"] == "dense" else moe_ops(s, st, expert_kernel)
    ops += heads.get("lm_head", [])
    return [{"op": o["op"], "params": o["params"]} for o in ops]


# ----------------------------------------------------------------------------------------------------
# Memory a step needs beyond the weights (bytes): MLA latent cache, KDA recurrent and conv states.
# ----------------------------------------------------------------------------------------------------

BF16, FP32 = 2, 4


def cache_bytes(s: StepSpec, batch: int, context: int) -> int:
    """KV of `batch` sequences x `context` tokens: MLA's latent, layers x B x C x (kv_lora + rope) x 2 B, and
    GQA's keys and values, layers x B x C x 2 Hkv D x 2 B."""
    n = 0
    if s.mla:
        n += s.num_mla * batch * context * (s.mla.kv_lora + s.mla.rope) * BF16
    if s.gqa:
        n += s.num_gqa * batch * context * 2 * s.gqa.kv_heads * s.gqa.head_dim * BF16
    return n


def state_bytes(s: StepSpec, batch: int) -> int:
    """Recurrent state (fp32, H x K x V) and conv state (bf16, channels x W, fla's cache layout) of `batch`
    sequences: KDA (3 H K channels) and GDN (2 HK dk + HV dv channels, HV states)."""
    n = 0
    if s.kda:
        k = s.kda
        n += s.num_kda * batch * (k.heads * k.head_dim * k.head_dim * FP32 + 3 * k.heads * k.head_dim * k.conv * BF16)
    if s.gdn:
        g = s.gdn
        n += s.num_gdn * batch * (g.value_heads * g.head_k * g.head_v * FP32 + g.conv_channels * g.conv * BF16)
    return n


def weight_bytes(s: StepSpec, expert_kernel: str = "grouped_bf16") -> int:
    """Bytes of the random weights the builder allocates (bf16; MXFP4 routed experts at 4.25 bit)."""
    from k3sim.calibration import mxfp4  # the format's bits per element, one definition

    d = s.hidden
    n = 0
    if s.kda:
        k = s.kda
        hk = k.heads * k.head_dim
        per = d * 3 * hk + 3 * hk * k.conv + (d * hk if k.gate_rank is None else d * k.gate_rank + k.gate_rank * hk)
        per += d * k.heads + (d * hk if k.out_gate_rank is None else d * k.out_gate_rank + k.out_gate_rank * hk)
        per += hk * d + 2 * d + k.head_dim
        n += s.num_kda * per * BF16
    if s.mla:
        m = s.mla
        qk, kv_a = m.nope + m.rope, m.kv_lora + m.rope
        q = d * m.heads * qk if m.q_lora is None else d * m.q_lora + m.q_lora * m.heads * qk
        per = q + d * kv_a + m.kv_lora * m.heads * (m.nope + m.v) + m.heads * m.v * d
        per += d * m.heads * m.v if m.out_gate else 0
        n += s.num_mla * per * BF16
    n += s.num_gdn * _gdn_weights(s) * BF16 + s.num_gqa * _gqa_weights(s) * BF16
    for r in s.layers:
        if r["ffn"] == "dense":
            n += 3 * d * s.dense_width * BF16
        elif s.moe:
            e = s.moe
            x_w = e.latent or d
            routed = e.experts_local * 3 * x_w * e.width
            n += int(routed * (mxfp4.BITS_PER_ELEMENT / 8 if expert_kernel == "mxfp4" else BF16))
            n += (d * (e.latent + e.experts) + e.latent * d if e.latent else d * e.experts) * BF16
            n += (3 * d * e.shared_width + (d if e.shared_gate else 0)) * BF16
    if s.embed_head:
        n += 2 * s.vocab_local * d * BF16
    return n


def _gdn_weights(s: StepSpec) -> int:
    """Elements of one GDN layer as the builder allocates them (A_log and dt_bias fp32 counted as bf16 pairs)."""
    if not s.gdn:
        return 0
    g, d = s.gdn, s.hidden
    return d * g.in_proj + g.conv_channels * g.conv + 2 * 2 * g.value_heads + g.head_v + g.value_heads * g.head_v * d + 2 * d


def _gqa_weights(s: StepSpec) -> int:
    if not s.gqa:
        return 0
    a, d = s.gqa, s.hidden
    return d * a.qkv + (2 * a.head_dim if a.qk_norm else 0) + a.q_heads * a.head_dim * d + 2 * d


CONTEXT_BYTES = 2 * 2 ** 30  # harness choice: CUDA context, cuBLAS workspaces and allocator slack beside the weights


def fit_layers(model, *, period: int, batch: int, context: int, hbm_bytes: int, tp: int = 1, ep: int = 1,
               head: bool = True, reserve_bytes: int = 6 * 2 ** 30) -> int:
    """The most layers 1..L (L a multiple of the layer pattern's `period`, so a slice keeps the model's mix) whose
    weights, CONTEXT_BYTES and the decode step's reserve leave room for the caches and states of `batch`
    sequences at `context` tokens (the largest point of the decode grid). 0 if not even one period fits."""
    best = 0
    for L in range(period, model.num_layers + 1, period):
        sp = spec_from_config(model, tp=tp, ep=ep, layers=(1, L), head=head)
        need = weight_bytes(sp) + CONTEXT_BYTES + reserve_bytes + cache_bytes(sp, batch, context) + state_bytes(sp, batch)
        if need > hbm_bytes:
            break
        best = L
    return best


def decode_points(s: StepSpec, batches: list[int], contexts: list[int], free_bytes: int) -> list[tuple[int, int]]:
    """(B, C) points whose MLA cache and KDA states fit in `free_bytes`, context-major as given."""
    return [(b, c) for c in contexts for b in batches if cache_bytes(s, b, c) + state_bytes(s, b) <= free_bytes]


def plan_pools(s: StepSpec, batches: list[int], contexts: list[int], free_bytes: int) -> list[tuple[list, int, int]]:
    """Group the points that fit into decode pools [(points, pool batch, MLA cache tokens per layer)].

    One pool holds KDA/conv states for its largest batch and one latent cache of its largest B x C; a
    point needs both at once. Greedy: each pool takes the batch bound that serves the most remaining
    points (ties: the larger bound); the next pool serves what is left (B = 64 at 64K context, say,
    which does not fit beside the states of B = 256). Points keep their order inside a pool."""
    left = decode_points(s, batches, contexts, free_bytes)
    per_tok = cache_bytes(s, 1, 1)
    pools = []
    while left:
        best = None
        for mb in sorted({b for b, _ in left}):
            room = free_bytes - state_bytes(s, mb)
            pts = [(b, c) for b, c in left if b <= mb and b * c * per_tok <= room]
            if pts and (best is None or len(pts) >= len(best[0])):
                best = (pts, mb)
        pts, mb = best
        pools.append((pts, mb, max(b * c for b, c in pts) if per_tok else 0))
        left = [p for p in left if p not in pts]
    return pools


def main() -> None:  # python3 -m k3sim.calibration.wholestep.spec  (CPU): rewrite specs.json
    from k3sim.files import atomic_write_text

    root = Path(__file__).resolve().parents[3]
    atomic_write_text(SPECS_PATH, json.dumps(build_specs(root), indent=1) + "\n")
    print(SPECS_PATH)


if __name__ == "__main__":
    main()
