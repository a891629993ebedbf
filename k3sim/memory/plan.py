"""Per-GPU memory plans for serving and training under a parallel layout.

Both plans evaluate every pipeline rank and report the fullest one (`worst_stage`); a plan that does not
fit raises `DoesNotFit` with the figures, never a negative budget. Figures are bytes (SI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.hardware import HardwareProfile
from k3sim.configs.model import ModelConfig
from k3sim.configs.parallel import Parallelism, Workload
from k3sim.errors import DoesNotFit, InputError
from k3sim.memory import activations as act
from k3sim.memory import sizes
from k3sim.memory.layout import expert_tp, rank_layers
from k3sim.memory.params import ROUTED, layer_params, non_layer_params, stored_format

GB = 1e9  # datasheet gigabytes (HBM capacities are quoted in them)
GiB = 2 ** 30  # what tables and errors print
# The router is fused with the latent down-projection and sharded with it (MISSION sec. 4).
TP_SHARDED = ("kda", "mla", "dense_ffn", "shared_experts", "latent_projections", "router")
REPLICATED = ("norms", "attn_res")  # small; kept whole on every rank
COMPONENT_ORDER = ("embeddings", "lm_head", "kda", "mla", "dense_ffn", ROUTED, "shared_experts",
                   "latent_projections", "router", "norms", "attn_res", "vision")


@dataclass
class Row:
    """One line of a breakdown: component, bytes per GPU, and the formula it came from."""

    component: str
    bytes: int
    source: str


@dataclass
class StageMemory:
    stage: int
    layers: list[int]  # 1-based layer numbers on this pipeline rank
    rows: list[Row]
    per_request_bytes: int = 0  # serve only

    @property
    def fixed_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)


def _rank_params(model: ModelConfig, layers: list[int], stage: int, pp: int) -> dict[str, int]:
    """Parameters by component of the layers on one rank, plus embeddings/vision on the first rank
    and lm_head/final norm on the last."""
    out: dict[str, int] = {}
    for i in layers:
        for k, v in layer_params(model, i).items():
            out[k] = out.get(k, 0) + v
    extra = non_layer_params(model)
    if stage == 0:
        for k in ("embeddings", "vision"):
            if k in extra:
                out[k] = extra[k]
    if stage == pp - 1:
        # Tied embeddings: the last stage keeps its own copy when it is not also the first (Megatron).
        tied_copy = extra["embeddings"] if model.tie_word_embeddings and pp > 1 else 0
        out["lm_head"] = extra.get("lm_head", tied_copy)
        out["norms"] = out.get("norms", 0) + extra["norms"]
    return {k: v for k, v in out.items() if v}


def _serve_weight_rows(model: ModelConfig, par: Parallelism, params: dict[str, int]) -> list[Row]:
    """Serving weight bytes per GPU by component: routed experts in their format, linear weights in
    `weight_format`, embeddings in `embedding_format`, the small replicated rest in bf16."""
    rows = []
    etp = expert_tp(par)
    for comp in COMPONENT_ORDER:
        n = params.get(comp, 0)
        if not n:
            continue
        fmt = stored_format(model, comp)
        if comp == ROUTED and getattr(par, "redundant_experts", 0) and model.moe is not None:
            # EPLB slots: each GPU holds ceil((E + R) / ep) experts' weights, redundant copies included
            E, R = model.moe.num_routed_experts, par.redundant_experts
            slots = math.ceil((E + R) / par.ep)
            n = n * slots * par.ep // E
            div, how = par.ep * etp, (f"x {slots * par.ep}/{E} slots ({R} redundant, {slots} per GPU) "
                                      f"/ (ep={par.ep} x expert_tp={etp})")
        elif comp == ROUTED:
            div, how = par.ep * etp, f"/ (ep={par.ep} x expert_tp={etp})"
        elif comp in TP_SHARDED:
            div, how = par.tp, f"/ tp={par.tp}"
        elif comp in ("embeddings", "lm_head"):
            div, how = par.tp, f"/ tp={par.tp} (vocab-parallel)"
        else:  # norms, attn_res, vision: replicated
            div, how = 1, "replicated"
        rows.append(Row(f"weights_{comp}", math.ceil(n * bytes_per_element(fmt) / div),
                        f"{n:,} params x {fmt} {how}"))
    return rows


# ----------------------------------------------------------------------------------------------- serve
@dataclass
class ServePlan:
    model: str
    hardware: str
    mode: str
    parallelism: dict
    context_tokens: int
    hbm_bytes: int
    kda_state_bytes_per_request: int
    mla_kv_bytes_per_token: int
    conv_state_bytes_per_request: int
    attn_res_block_bytes_per_token: int
    per_request_bytes_per_gpu: int
    max_concurrent_requests: int
    worst_stage: int
    per_gpu_bytes: dict[str, int]
    breakdown: list[Row]
    stages: list[dict] = field(default_factory=list)


def serve_plan(model: ModelConfig, hw: HardwareProfile, par: Parallelism, context_tokens: int, *,
               prefill_chunk_tokens: int = 8192, workspace_fraction: float = 0.10,
               source: str | None = None) -> ServePlan:
    """Per-GPU serving memory and the most concurrent requests of `context_tokens` that fit.

    Assumptions (each a modelling choice, not a measurement):
    - attention, dense/shared FFN, latent projections and the router (fused with the latent
      down-projection) shard by TP; routed experts by EP (then TP if EP < TP); embeddings/lm_head
      vocab-parallel; norms, AttnRes queries, vision replicated.
    - MLA's latent KV is shared by all heads, so every TP rank caches all of it (vLLM/SGLang MLA under
      TP); CP splits it by tokens. KDA and conv state are per head, so they divide by TP.
    - AttnRes block representatives exist for tokens in flight: one prefill chunk, split over TP by
      sequence parallelism (MISSION sec. 3). The default chunk of 8192 tokens is vLLM V1's default
      `max_num_batched_tokens` for the OpenAI server on large-memory GPUs (vllm/engine/arg_utils.py).
    - `workspace_fraction` of HBM is held back for CUDA context, NCCL buffers and temporaries (vLLM's
      default gpu_memory_utilization = 0.9 leaves 10 %).
    """
    par.check_against(model, source=source)
    if context_tokens <= 0:
        raise InputError(f"must be positive (got {context_tokens})", source=source, field="context_tokens")
    hbm = int(hw.hbm_bytes)
    reserve = math.ceil(workspace_fraction * hbm)
    kv_tok_layer = sizes.mla_kv_bytes_per_token_per_layer(model)
    state_layer = sizes.kda_state_bytes_per_layer(model)
    conv_layer = sizes.conv_state_bytes_per_layer(model)
    attn_res_tok = sizes.attn_res_block_bytes_per_token(model)
    stages = []
    for r, layers in enumerate(rank_layers(model, par)):
        rows = _serve_weight_rows(model, par, _rank_params(model, layers, r, par.pp))
        if attn_res_tok:
            rows.append(Row("attn_res_blocks", math.ceil(attn_res_tok * prefill_chunk_tokens / par.tp),
                            f"{attn_res_tok} B/token x {prefill_chunk_tokens} prefill tokens / tp"))
        rows.append(Row("workspace_reserve", reserve, f"{workspace_fraction:g} x HBM"))
        n_mla = sum(model.layer_kinds[i] == "mla" for i in layers)
        n_kda = len(layers) - n_mla
        per_req = (math.ceil(n_mla * kv_tok_layer * context_tokens / par.cp)
                   + math.ceil(n_kda * (state_layer + conv_layer) / par.tp))
        stages.append(StageMemory(r, [i + 1 for i in layers], rows, per_req))

    def capacity(s: StageMemory) -> int:
        # per_request_bytes > 0: a stage holds >= 1 layer and every layer is MLA (KV grows with the
        # context) or KDA (fixed state), all of positive size.
        return (hbm - s.fixed_bytes) // s.per_request_bytes

    worst = min(stages, key=lambda s: (capacity(s), -s.fixed_bytes))
    max_req = capacity(worst)
    if max_req < 1:
        weights = sum(r.bytes for r in worst.rows if r.component.startswith("weights_"))
        routed = next((r.bytes for r in worst.rows if r.component == f"weights_{ROUTED}"), 0)
        attn_res = next((r.bytes for r in worst.rows if r.component == "attn_res_blocks"), 0)
        routed_txt = (f" (routed experts {routed / GiB:.1f} GiB = {routed / GB:.1f} GB in "
                      f"{model.moe.routed_weight_format})" if routed else "")
        # the advice follows from the largest term (a huge prefill chunk is not cured by more pipeline stages)
        terms = {"weights": weights, "attn_res": attn_res, "request": worst.per_request_bytes}
        advice = {"weights": "raise pp or ep (fewer weights per GPU)",
                  "attn_res": f"lower the prefill chunk ({prefill_chunk_tokens:,} tokens of AttnRes blocks)",
                  "request": f"lower the context ({context_tokens:,} tokens) or raise cp or pp"}[max(terms, key=terms.get)]
        raise DoesNotFit(
            f"does not fit: pipeline stage {worst.stage} (of 0..{par.pp - 1}) needs {weights / GiB:.1f} GiB of "
            f"weights per GPU{routed_txt} + {(worst.fixed_bytes - weights) / GiB:.1f} GiB AttnRes blocks and "
            f"workspace + {worst.per_request_bytes / GiB:.2f} GiB for one {context_tokens:,}-token request > "
            f"{hbm / GiB:.1f} GiB HBM of {hw.name} ({hbm / GB:.1f} GB); {advice}", source=source)
    kv_total = max_req * worst.per_request_bytes
    per_gpu = {r.component: r.bytes for r in worst.rows}
    per_gpu["kv_cache_and_state"] = kv_total
    per_gpu["total"] = worst.fixed_bytes + kv_total
    per_gpu["free"] = hbm - per_gpu["total"]
    breakdown = worst.rows + [Row("kv_cache_and_state", kv_total,
                                  f"{max_req} requests x {worst.per_request_bytes / 2 ** 20:,.2f} MiB "
                                  f"(each at the full {context_tokens:,}-token context)")]
    return ServePlan(
        model=model.name, hardware=hw.name, mode="serve", parallelism=par.model_dump(),
        context_tokens=context_tokens, hbm_bytes=hbm,
        kda_state_bytes_per_request=sizes.kda_state_bytes_per_request(model),
        mla_kv_bytes_per_token=sizes.mla_kv_bytes_per_token(model),
        conv_state_bytes_per_request=sizes.conv_state_bytes_per_request(model),
        attn_res_block_bytes_per_token=attn_res_tok,
        per_request_bytes_per_gpu=worst.per_request_bytes, max_concurrent_requests=int(max_req),
        worst_stage=worst.stage, per_gpu_bytes=per_gpu, breakdown=breakdown,
        stages=[{"stage": s.stage, "layers": s.layers, "fixed_bytes": s.fixed_bytes,
                 "per_request_bytes": s.per_request_bytes,
                 "max_concurrent_requests": int(capacity(s))} for s in stages],
    )


# ----------------------------------------------------------------------------------------------- train
# Mixed-precision Adam, Megatron-LM docs/source/distrib_optimizer.md ("bf16 param, fp32 grads"):
# 2 B bf16 weight + 4 B fp32 main grad + 12 B optimizer (fp32 master copy, Adam m and v) per parameter.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 12


@dataclass
class TrainPlan:
    model: str
    hardware: str
    mode: str
    parallelism: dict
    seq_len_tokens: int
    micro_batch_size: int
    activation_checkpointing: bool
    hbm_bytes: int
    params_per_gpu: int
    in_flight_micro_batches: float
    fits: bool
    worst_stage: int
    per_gpu_bytes: dict[str, int]
    breakdown: list[Row]
    stages: list[dict] = field(default_factory=list)


def in_flight_micro_batches(par: Parallelism, rank: int, num_micro_batches: int | None) -> float:
    """Micro-batches whose activations rank `rank` holds at peak (in units of one whole micro-batch on the
    rank; an interleaved model chunk is 1/v of it).

    1F1B: rank r runs pp - r forwards before its first backward (Narayanan et al. SC'21), at most m.
    Interleaved with v chunks: Megatron-LM's warm-up runs 2 (pp - r - 1) + (v - 1) pp chunk forwards, and
    one more is in flight at the first backward (megatron/core/pipeline_parallel/schedules.py,
    forward_backward_pipelining_with_interleaving), at most all m v chunks: the first rank holds
    pp + (pp - 1)/v micro-batches' worth (Korthikanti et al. MLSys'23 sec. 4.2.3), the last (v - 1) pp/v + 1/v.
    The discrete-event pipeline engine (`k3sim.pipeline`) measures the same peak on its timeline.
    """
    p, v = par.pp, par.virtual_stages
    m = num_micro_batches
    if v == 1:
        outstanding = p - rank
        return float(min(outstanding, m) if m is not None else outstanding)
    chunks = 2 * (p - rank - 1) + (v - 1) * p + 1
    if m is not None:
        chunks = min(chunks, m * v)
    return chunks / v


def train_plan(model: ModelConfig, hw: HardwareProfile, par: Parallelism, seq_len_tokens: int, *,
               micro_batch_size: int = 1, activation_checkpointing: bool = True,
               num_micro_batches: int | None = None, workspace_fraction: float = 0.10,
               source: str | None = None, allow_overflow: bool = False) -> TrainPlan:
    """Per-GPU training memory: weights, grads, optimizer states, activations.

    Weights are a bf16 working copy of every parameter, whatever the serving format (K3's MXFP4 experts
    come from quantization-aware training over high-precision weights).

    Sharding: non-expert weights by TP (norms, AttnRes queries, vision replicated), routed experts by EP
    (expert TP = 1), layers by PP. ZeRO stage z over the data-parallel replicas of each parameter: dp x cp for
    non-expert parameters, tp x cp x dp / ep for experts (Megatron's distributed optimizer shards over
    DP x CP, and expert-DP for experts). z >= 1 shards optimizer states, z >= 2 grads, z = 3 weights.
    Activations per token are divided by TP (sequence parallelism) and the sequence by CP; tokens per
    micro-batch per GPU = micro_batch_size x seq_len / cp. With checkpointing each layer keeps its
    input, plus one layer's full activations during recompute. AttnRes block representatives stay on
    the GPU per micro-batch in flight (MISSION sec. 3). The last rank also holds fp32 logits of one
    micro-batch. Vision tower activations are not modelled. `workspace_fraction` of HBM is held back
    as in `serve_plan`; for training that 10 % default is a modelling choice (CUDA context, NCCL
    buffers, allocator fragmentation), not a measured figure.
    """
    par.check_against(model, source=source)
    if seq_len_tokens % par.cp:
        raise InputError(f"cp={par.cp} does not divide the {seq_len_tokens}-token training sequence",
                         source=source, field="cp")
    hbm = int(hw.hbm_bytes)
    reserve = math.ceil(workspace_fraction * hbm)
    dense_dp = par.dp * par.cp
    expert_dp = par.stage_gpus // par.ep
    tokens = micro_batch_size * seq_len_tokens / par.cp
    z = par.zero_stage
    stages = []
    for r, layers in enumerate(rank_layers(model, par)):
        params = _rank_params(model, layers, r, par.pp)
        routed = math.ceil(params.get(ROUTED, 0) / par.ep)
        dense = sum(math.ceil(n / par.tp) for k, n in params.items()
                    if k != ROUTED and k not in REPLICATED and k != "vision")
        dense += sum(params.get(k, 0) for k in REPLICATED) + params.get("vision", 0)

        def per_gpu(per_param: int, sharded: bool) -> int:
            return math.ceil(dense * per_param / (dense_dp if sharded else 1)
                             + routed * per_param / (expert_dp if sharded else 1))

        rows = [
            Row("weights", per_gpu(WEIGHT_BYTES, z >= 3),
                f"({dense:,} non-expert + {routed:,} expert params) x {WEIGHT_BYTES} B bf16"
                + (" / dp (ZeRO-3)" if z >= 3 else "")),
            Row("gradients", per_gpu(GRAD_BYTES, z >= 2),
                f"params x {GRAD_BYTES} B fp32" + (" / dp (ZeRO-2)" if z >= 2 else "")),
            Row("optimizer_states", per_gpu(OPTIMIZER_BYTES, z >= 1),
                f"params x {OPTIMIZER_BYTES} B (fp32 master, Adam m, v)"
                + (f" / dp (ZeRO-{z}: {dense_dp} non-expert, {expert_dp} expert)" if z >= 1 else "")),
        ]
        n_mb = in_flight_micro_batches(par, r, num_micro_batches)
        full = [act.layer_activation_bytes_per_token(model, i) for i in layers]
        if activation_checkpointing:
            kept = len(layers) * act.checkpointed_layer_bytes_per_token(model)
            acts = (n_mb * kept + max(full)) * tokens / par.tp
            how = f"{n_mb:g} micro-batches x {len(layers)} layer inputs + 1 recomputed layer"
        else:
            acts = n_mb * sum(full) * tokens / par.tp
            how = f"{n_mb:g} micro-batches x {len(layers)} layers, no recompute"
        rows.append(Row("activations", math.ceil(acts), f"{how}; {tokens:g} tokens / tp"))
        attn_res = sizes.attn_res_block_bytes_per_token(model)
        if attn_res:
            rows.append(Row("attn_res_blocks", math.ceil(n_mb * attn_res * tokens / par.tp),
                            f"{n_mb:g} micro-batches x {attn_res} B/token / tp"))
        if r == par.pp - 1:
            rows.append(Row("logits", math.ceil(tokens * model.vocab_size * 4 / par.tp),
                            "1 micro-batch x vocab x fp32 / tp"))
        rows.append(Row("workspace_reserve", reserve, f"{workspace_fraction:g} x HBM"))
        stages.append((StageMemory(r, [i + 1 for i in layers], rows), dense + routed, n_mb))

    worst, params_gpu, n_mb = max(stages, key=lambda s: s[0].fixed_bytes)
    total = worst.fixed_bytes
    fits = total <= hbm
    if not fits and not allow_overflow:
        parts = ", ".join(f"{r.component} {r.bytes / GiB:.1f}" for r in worst.rows)
        raise DoesNotFit(
            f"does not fit: pipeline stage {worst.stage} (of 0..{par.pp - 1}) needs {total / GiB:.1f} GiB per "
            f"GPU ({parts} GiB) > {hbm / GiB:.1f} GiB HBM of {hw.name} ({hbm / GB:.1f} GB)",
            source=source)
    per_gpu = {r.component: r.bytes for r in worst.rows}
    per_gpu["total"] = total
    per_gpu["free"] = hbm - total
    return TrainPlan(
        model=model.name, hardware=hw.name, mode="train", parallelism=par.model_dump(),
        seq_len_tokens=seq_len_tokens, micro_batch_size=micro_batch_size,
        activation_checkpointing=activation_checkpointing, hbm_bytes=hbm, params_per_gpu=params_gpu,
        in_flight_micro_batches=n_mb, fits=fits, worst_stage=worst.stage, per_gpu_bytes=per_gpu,
        breakdown=worst.rows,
        stages=[{"stage": s.stage, "layers": s.layers, "params": p, "total_bytes": s.fixed_bytes}
                for s, p, _ in stages],
    )


def workload_plan(model: ModelConfig, hw: HardwareProfile, par: Parallelism, workload: Workload,
                  source: str | None = None) -> ServePlan | TrainPlan:
    """The plan a workload asks for: `serve_plan` or `train_plan` with the workload's settings."""
    if workload.mode == "serve":
        return serve_plan(model, hw, par, workload.context_tokens,
                          prefill_chunk_tokens=workload.prefill_chunk_tokens,
                          workspace_fraction=workload.workspace_fraction, source=source)
    return train_plan(model, hw, par, workload.context_tokens, micro_batch_size=workload.micro_batch_size,
                      activation_checkpointing=workload.activation_checkpointing,
                      num_micro_batches=workload.num_micro_batches,
                      workspace_fraction=workload.workspace_fraction, source=source)
