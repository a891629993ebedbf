"""Per-GPU memory plans for serving and training under a parallel layout.

Both plans evaluate every pipeline rank and report the fullest one (`worst_stage`); a plan that does not
fit raises `DoesNotFit` with the figures, never a negative budget. Figures are bytes (SI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.hardware import HardwareProfile
from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import ModelConfig
from k3sim.configs.parallel import Parallelism, Workload
from k3sim.configs.recipe import PRECISIONS, resolve_recompute
from k3sim.errors import DoesNotFit, InputError, shorten
from k3sim.memory import activations as act
from k3sim.memory import sizes
from k3sim.memory.layout import expert_tp, rank_layers
from k3sim.memory.params import COMPONENTS, ROUTED, layer_params, non_layer_params, stored_format

GB = 1e9  # datasheet gigabytes (HBM capacities are quoted in them)
GiB = 2 ** 30  # what tables and errors print
# The router is fused with the latent down-projection and sharded with it (MISSION sec. 4). Every mixer kind's
# weights shard by TP (its heads, value heads or channels: `configs/kinds`).
TP_SHARDED = (*MIXERS, "dense_ffn", "shared_experts", "latent_projections", "router")
REPLICATED = ("norms", "attn_res")  # small; kept whole on every rank
COMPONENT_ORDER = COMPONENTS
# Mixer kinds whose saved training tensors `memory.activations` lists (every kind of the registry today); a kind
# added to `configs.kinds` without its list is refused in mode train.
TRAINED_KINDS = tuple(act.MIXER_TENSORS)


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
NO_LIMIT = 2 ** 62  # capacity of a stage that holds nothing per request


def _request_bytes(model: ModelConfig, per_kind: dict, layers: list[int], context_tokens: int, cp: int) -> int:
    """One request's bytes on one GPU of a stage: the KV of its attention layers (a window caps the tokens;
    CP splits the tokens) plus the recurrent and conv state of its recurrent layers (each kind's TP split,
    `memory.sizes.kind_sizes`). MLA's latent KV is whole on every TP rank, GQA's KV heads split (one
    replicated copy once tp exceeds them)."""
    kv = state = 0
    for i in layers:
        for kind in model.layers[i].mixers:
            k = per_kind[kind]
            kv += k.kv_bytes_per_request_per_layer(context_tokens)
            state += k.state_bytes_per_layer + k.conv_state_bytes_per_layer
    return math.ceil(kv / cp) + state


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
    recurrent_state_bytes_per_request: int   # every recurrent kind (whole model), without conv state
    kv_bytes_per_token: int                  # every full-context attention kind (whole model)
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
      TP); CP splits it by tokens. KDA and conv state are per head, so they divide by TP. The other kinds
      as `configs/kinds` splits them: GQA / SWA KV by KV head (replicated past tp = KV heads; a window
      caps the tokens), GDN by value head, Mamba2 by head (a single B/C group replicated), Mamba by inner
      channel, lightning by head.
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
    per_kind = {k.kind: k for k in sizes.kind_sizes(model, tp=par.tp)}
    attn_res_tok = sizes.attn_res_block_bytes_per_token(model)
    stages = []
    for r, layers in enumerate(rank_layers(model, par)):
        rows = _serve_weight_rows(model, par, _rank_params(model, layers, r, par.pp))
        if attn_res_tok:
            rows.append(Row("attn_res_blocks", math.ceil(attn_res_tok * prefill_chunk_tokens / par.tp),
                            f"{attn_res_tok} B/token x {prefill_chunk_tokens} prefill tokens / tp"))
        rows.append(Row("workspace_reserve", reserve, f"{workspace_fraction:g} x HBM"))
        stages.append(StageMemory(r, [i + 1 for i in layers], rows,
                                  _request_bytes(model, per_kind, layers, context_tokens, par.cp)))

    def capacity(s: StageMemory) -> int:
        # a stage of FFN-only blocks (Nemotron-H's MLP layers) holds nothing per request: memory bounds it
        # only if its weights do not fit
        if not s.per_request_bytes:
            return NO_LIMIT if hbm >= s.fixed_bytes else -1
        return (hbm - s.fixed_bytes) // s.per_request_bytes

    worst = min(stages, key=lambda s: (capacity(s), -s.fixed_bytes))
    max_req = capacity(worst)
    if max_req == NO_LIMIT:
        raise InputError(f"model '{model.name}' has no layer that keeps a KV cache or a recurrent state per "
                         "request: the serving memory plan has nothing to size", source=source)
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
        recurrent_state_bytes_per_request=sizes.recurrent_state_bytes_per_request(model),
        kv_bytes_per_token=sizes.kv_bytes_per_token(model),
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
    activation_checkpointing: bool   # full per-layer recompute (recompute == "full")
    hbm_bytes: int
    params_per_gpu: int
    in_flight_micro_batches: float
    fits: bool
    worst_stage: int
    per_gpu_bytes: dict[str, int]
    breakdown: list[Row]
    stages: list[dict] = field(default_factory=list)
    recompute: str = "full"                      # none | full | selective
    recompute_modules: tuple[str, ...] = ()      # the modules rebuilt under selective recompute
    precision: str = "bf16"                      # bf16 | fp8 (FP8 activation caching)
    fp8_tensors: tuple[str, ...] = ()            # saved tensors of the worst stage kept in e4m3 + 1x128 scales
    e5m6_tensors: tuple[str, ...] = ()           # ... kept in DeepSeek's E5M6
    parameter_copies: int = 1                    # copies of weights and gradients per GPU (DualPipe: 2)


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


def _stage_layers(model: ModelConfig, par: Parallelism, stage_layers, source: str | None) -> list[list[int]]:
    """The layers (0-based) of each pipeline rank: `stage_layers` as given (one list per rank, every layer on
    exactly one rank: a DualPipe rank's mirror copy is `parameter_copies`, not a second listing), or the
    default placement (`memory.layout.rank_layers`)."""
    if stage_layers is None:
        return rank_layers(model, par)
    out = [[int(i) for i in ls] for ls in stage_layers]
    flat = sorted(i for ls in out for i in ls)
    if len(out) != par.pp or flat != list(range(model.num_layers)):
        raise InputError(f"needs one list per pipeline rank ({par.pp}) holding each of the model's "
                         f"{model.num_layers} layers (0-based) exactly once; got {len(out)} lists of {len(flat)} "
                         f"layers", source=source, field="stage_layers")
    return out


def _in_flight(par: Parallelism, num_micro_batches: int | None, in_flight, source: str | None) -> list[float]:
    """Micro-batches in flight per rank: `in_flight` (one number for every rank, or one per rank) or the
    1F1B / interleaved count of `in_flight_micro_batches`."""
    if in_flight is None:
        return [in_flight_micro_batches(par, r, num_micro_batches) for r in range(par.pp)]
    vals = [float(in_flight)] * par.pp if isinstance(in_flight, (int, float)) else [float(x) for x in in_flight]
    if len(vals) != par.pp or not all(0 < x <= 1e6 for x in vals):
        raise InputError(f"needs one positive count (at most 1e6), or one per pipeline rank ({par.pp}); got "
                         f"{shorten(str(in_flight), 60)}", source=source, field="in_flight")
    return vals


def _rank_counts(model: ModelConfig, par: Parallelism, layers: list[int], rank: int) -> tuple[int, int]:
    """(non-expert, routed) parameters one GPU of pipeline rank `rank` holds: non-expert ones after TP (norms,
    AttnRes queries, vision replicated), routed experts after EP."""
    params = _rank_params(model, layers, rank, par.pp)
    routed = math.ceil(params.get(ROUTED, 0) / par.ep)
    dense = sum(math.ceil(n / par.tp) for k, n in params.items()
                if k != ROUTED and k not in REPLICATED and k != "vision")
    return dense + sum(params.get(k, 0) for k in REPLICATED) + params.get("vision", 0), routed


def _state_rows(par: Parallelism, own: tuple[int, int], mirror: tuple[int, int] | None) -> list[Row]:
    """Weights, gradients and optimizer states of one rank's (non-expert, routed) parameters `own`. ZeRO stage z
    shards over the data-parallel replicas of each parameter (train_plan's docstring). `mirror`: DualPipe's
    second copy (arXiv 2412.19437 sec. 3.2.1, "two copies of the model parameters"): rank r also runs the
    reverse direction's stage pp-1-r, so it holds that stage's weights and gradients too; the fp32 master and
    Adam states stay one ZeRO-sharded set per parameter, on the rank that owns the stage."""
    z, dense_dp, expert_dp = par.zero_stage, par.dp * par.cp, par.stage_gpus // par.ep

    def per_gpu(counts: tuple[int, int], per_param: float, sharded: bool) -> int:
        return math.ceil(counts[0] * per_param / (dense_dp if sharded else 1)
                         + counts[1] * per_param / (expert_dp if sharded else 1))

    held = own if mirror is None else (own[0] + mirror[0], own[1] + mirror[1])
    twice = "" if mirror is None else (f" (own stage + DualPipe's mirror stage: {mirror[0]:,} non-expert + "
                                       f"{mirror[1]:,} expert params)")
    return [
        Row("weights", per_gpu(held, WEIGHT_BYTES, z >= 3),
            f"({held[0]:,} non-expert + {held[1]:,} expert params) x {WEIGHT_BYTES} B bf16{twice}"
            + (" / dp (ZeRO-3)" if z >= 3 else "")),
        Row("gradients", per_gpu(held, GRAD_BYTES, z >= 2),
            f"params x {GRAD_BYTES} B fp32" + (" / dp (ZeRO-2)" if z >= 2 else "")),
        Row("optimizer_states", per_gpu(own, OPTIMIZER_BYTES, z >= 1),
            f"({own[0]:,} + {own[1]:,} own params) x {OPTIMIZER_BYTES} B (fp32 master, Adam m, v)"
            + (f" / dp (ZeRO-{z}: {dense_dp} non-expert, {expert_dp} expert)" if z >= 1 else "")),
    ]


def _activation_row(model: ModelConfig, layers: list[int], mode: str, modules: tuple[str, ...], precision: str,
                    n_mb: float, tokens: float, tp: int) -> tuple[Row, tuple[str, ...], tuple[str, ...]]:
    """The activations of one rank and the names of its FP8 / E5M6 tensors.

    none: every saved tensor of every layer for each micro-batch in flight. full: each layer's input, plus one
    layer's whole activations while it is rebuilt before its backward. selective: each layer's kept tensors,
    plus one layer's rebuilt modules (`memory.activations.layer_activations`)."""
    per = [act.layer_activations(model, i, () if mode == "full" else modules, precision, tp) for i in layers]
    if mode == "full":
        kept = len(layers) * act.checkpointed_layer_bytes_per_token(model)
        transient, how = max((p.full_bytes for p in per), default=0.0), \
            f"{n_mb:g} micro-batches x {len(layers)} layer inputs + 1 recomputed layer"
    elif mode == "selective":
        kept = sum(p.kept_bytes for p in per)
        transient = max((p.recomputed_bytes for p in per), default=0.0)
        how = (f"{n_mb:g} micro-batches x {len(layers)} layers, selective recompute of {', '.join(modules)} "
               f"+ 1 layer's rebuilt tensors")
    else:
        kept, transient = sum(p.kept_bytes for p in per), 0.0
        how = f"{n_mb:g} micro-batches x {len(layers)} layers, no recompute"
    fp8 = tuple(dict.fromkeys(n for p in per for n in p.fp8_tensors))
    e5m6 = tuple(dict.fromkeys(n for p in per for n in p.e5m6_tensors))
    if precision == "fp8":
        held = " while a layer is rebuilt" if mode == "full" else ""
        how += (f"; FP8-cached{held} (e4m3 + 1x128 fp32 scales, DeepSeek-V3 sec. 3.3.4): {', '.join(fp8) or 'none'}"
                + (f"; E5M6: {', '.join(e5m6)}" if e5m6 else ""))
    acts = (n_mb * kept + transient) * tokens / tp
    return Row("activations", math.ceil(acts), f"{how}; {tokens:g} tokens / tp"), fp8, e5m6


def check_trainable(model: ModelConfig, source: str | None = None) -> None:
    """Refuse, in one line naming the first kind, a model whose training activations `memory.activations` does
    not list (a mixer kind without a `MIXER_TENSORS` entry). Its serving plan and its parameter counts still
    answer."""
    model.require_kinds(TRAINED_KINDS, "the training activations (memory.activations)", source=source, field="mode")


def train_plan(model: ModelConfig, hw: HardwareProfile, par: Parallelism, seq_len_tokens: int, *,
               micro_batch_size: int = 1, activation_checkpointing: bool = True,
               num_micro_batches: int | None = None, workspace_fraction: float = 0.10,
               source: str | None = None, allow_overflow: bool = False, recompute: str | None = None,
               recompute_modules: tuple[str, ...] = (), precision: str = "bf16",
               stage_layers: list[list[int]] | None = None, parameter_copies: int = 1,
               in_flight: float | list[float] | None = None) -> TrainPlan:
    """Per-GPU training memory: weights, grads, optimizer states, activations.

    Weights are a bf16 working copy of every parameter, whatever the serving format (K3's MXFP4 experts
    come from quantization-aware training over high-precision weights).

    Sharding: non-expert weights by TP (norms, AttnRes queries, vision replicated), routed experts by EP
    (expert TP = 1), layers by PP. ZeRO stage z over the data-parallel replicas of each parameter: dp x cp for
    non-expert parameters, tp x cp x dp / ep for experts (Megatron's distributed optimizer shards over
    DP x CP, and expert-DP for experts). z >= 1 shards optimizer states, z >= 2 grads, z = 3 weights.
    Activations per token are divided by TP (sequence parallelism) and the sequence by CP; tokens per
    micro-batch per GPU = micro_batch_size x seq_len / cp. Recompute (`recompute`, None = from
    `activation_checkpointing`: full if true, none if false; `recompute_modules` under selective, empty =
    DeepSeek-V3's norms + MLA up-projections; `configs.planning.resolve_recompute`) and FP8 activation caching
    (`precision` fp8) as `memory.activations` accounts them. AttnRes block representatives stay on the GPU
    per micro-batch in flight (MISSION sec. 3). The last rank also holds fp32 logits of one micro-batch.
    Vision tower activations are not modelled. `workspace_fraction` of HBM is held back as in `serve_plan`;
    for training that 10 % default is a modelling choice (CUDA context, NCCL buffers, allocator
    fragmentation), not a measured figure. For the pipeline schedules: `stage_layers` (the layers of each
    rank, None = `rank_layers`), `parameter_copies` (2 for DualPipe: rank r also holds the weights and gradients
    of the mirror stage pp-1-r), `in_flight` (micro-batches in flight per rank, one number or one per rank, None
    = the 1F1B / interleaved count; the activations are those of the rank's own `stage_layers`).
    """
    par.check_against(model, source=source)
    check_trainable(model, source)
    if seq_len_tokens % par.cp:
        raise InputError(f"cp={par.cp} does not divide the {seq_len_tokens}-token training sequence",
                         source=source, field="cp")
    mode, modules = resolve_recompute(model, recompute, recompute_modules, activation_checkpointing, source)
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision '{shorten(str(precision), 40)}' (known: {', '.join(PRECISIONS)})",
                         source=source, field="training.precision")
    if isinstance(parameter_copies, bool) or parameter_copies not in (1, 2):
        raise InputError(f"must be 1 or 2 (DualPipe), got {shorten(str(parameter_copies), 40)}", source=source,
                         field="parameter_copies")
    hbm = int(hw.hbm_bytes)
    reserve = math.ceil(workspace_fraction * hbm)
    tokens = micro_batch_size * seq_len_tokens / par.cp
    flights = _in_flight(par, num_micro_batches, in_flight, source)
    placed = _stage_layers(model, par, stage_layers, source)
    stages = []
    for r, layers in enumerate(placed):
        dense, routed = _rank_counts(model, par, layers, r)
        m = par.pp - 1 - r
        rows = _state_rows(par, (dense, routed),
                           _rank_counts(model, par, placed[m], m) if parameter_copies == 2 else None)
        n_mb = flights[r]
        row, fp8, e5m6 = _activation_row(model, layers, mode, modules, precision, n_mb, tokens, par.tp)
        rows.append(row)
        attn_res = sizes.attn_res_block_bytes_per_token(model)
        if attn_res:
            rows.append(Row("attn_res_blocks", math.ceil(n_mb * attn_res * tokens / par.tp),
                            f"{n_mb:g} micro-batches x {attn_res} B/token / tp"))
        if r == par.pp - 1:
            rows.append(Row("logits", math.ceil(tokens * model.vocab_size * 4 / par.tp),
                            "1 micro-batch x vocab x fp32 / tp"))
        rows.append(Row("workspace_reserve", reserve, f"{workspace_fraction:g} x HBM"))
        stages.append((StageMemory(r, [i + 1 for i in layers], rows), dense + routed, n_mb, fp8, e5m6))

    worst, params_gpu, n_mb, fp8, e5m6 = max(stages, key=lambda s: s[0].fixed_bytes)
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
        activation_checkpointing=mode == "full", hbm_bytes=hbm, params_per_gpu=params_gpu,
        in_flight_micro_batches=n_mb, fits=fits, worst_stage=worst.stage, per_gpu_bytes=per_gpu,
        breakdown=worst.rows,
        stages=[{"stage": s.stage, "layers": s.layers, "params": p, "in_flight_micro_batches": n,
                 "activation_bytes": next(r.bytes for r in s.rows if r.component == "activations"),
                 "total_bytes": s.fixed_bytes} for s, p, n, _, _ in stages],
        recompute=mode, recompute_modules=modules, precision=precision, fp8_tensors=fp8, e5m6_tensors=e5m6,
        parameter_copies=parameter_copies,
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
