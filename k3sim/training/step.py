"""One training step of a parallel layout on a cluster: step time with its breakdown, tokens/s, MFU, memory.

Composition (each term's source is in its row):
- per-layer compute (forward, input-gradient and weight-gradient backward) of one micro-batch on one GPU
  comes from `k3sim.step.training_layer_costs` (calibrated kernels); full activation checkpointing
  re-runs each layer's forward before its backward;
- TP with sequence parallelism: every sublayer (attention, FFN/shared experts) opens with an all-gather
  and closes with a reduce-scatter of the sequence-sharded activations (Korthikanti et al., MLSys'23;
  MISSION sec. 3), forward, backward, and again in the recompute; exposed unless `tp_overlap` hides part;
- EP: dispatch and combine all-to-alls of each MoE layer in the latent width (LatentMoE dispatches the
  down-projected tokens), forward, backward and recompute, stretched by the EP load imbalance of the
  routing distribution (k3sim.comm.routing), which also stretches the routed-expert GEMMs; MoonEP
  redundant experts (option) flatten the imbalance at the price of prefetching their weights;
- CP: KCP on KDA layers, the chosen scheme on MLA layers (`k3sim.cp`): what CP adds on top of the local
  attention kernel (exposed communication and the scheme's own compute: KCP pre-process and fold, latent
  up-projection); a model with other mixer kinds trains at cp = 1 (cp > 1 is refused in one line by the CP
  geometry, `k3sim.cp.geometry_from_model`);
- TP counts one all-gather / reduce-scatter pair per sublayer a layer has (a mixer-only or MLP-only layer of
  Nemotron-H has one);
- PP: layers split over the stages by cost (k3sim.training.partition, `training.stage_split: balanced`, the
  default) or by count; the schedule (k3sim.training.schedule: the pipeline engine, or Megatron's closed form)
  over the per-stage micro-batch costs gives the bubble; stage-to-stage sends are overlapped in steady state and
  exposed along the fill and drain chains (2 (p v - 1) hops; modelling choice);
- DP with ZeRO-1: gradient reduce-scatter after the last micro-batch's backward and parameter all-gather
  before the next step's first forward, overlapped with that micro-batch's backward / forward (Megatron
  `overlap_grad_reduce`, `overlap_param_gather`): only the part beyond that compute is exposed; the
  optimizer update streams its shard of weights, grads and Adam states through HBM once.
Memory comes from `k3sim.memory.plan.train_plan` (never re-derived here); MFU counts model FLOP
(`k3sim.memory.flops`: 6 x active parameters per token plus causal attention, Megatron's convention) against
the bf16 peak of every GPU; HFU counts what the GPUs execute (the kernels' own FLOP, the recomputed forward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from k3sim.configs.parallel import Parallelism
from k3sim.configs.planning import TrainOptions, check_redundant_experts
from k3sim.cp.groups import Collectives
from k3sim.errors import InputError
from k3sim.step.modules import module_parts
from k3sim.step.training import precision_assumption
from k3sim.training.placement import groups, pp_hop_links
from k3sim.comm.routing import ep_imbalance
from k3sim.training.overlap import schedule_pipeline

BF16 = 2
SUBLAYERS_PER_LAYER = 2   # attention block + FFN block, each AG in / RS out under sequence parallelism
COMM_KINDS = ("tp", "ep", "cp", "pp", "dp")


@dataclass
class Row:
    component: str
    seconds: float
    source: str
    kind: str = "compute"      # compute | tp | ep | cp | pp | dp | bubble | optimizer


@dataclass
class StageCost:
    """One pipeline rank, one micro-batch (all its virtual chunks)."""

    stage: int
    layers: list[int]
    forward_s: float           # compute
    backward_s: float          # input + weight gradients
    recompute_s: float
    comm_s: dict[str, float] = field(default_factory=dict)   # exposed, per kind, fwd+bwd+recompute
    imbalance_s: float = 0.0   # extra routed-expert compute on the busiest EP rank

    @property
    def fwd_total(self) -> float:
        return self.forward_s + self.comm_fwd

    comm_fwd: float = 0.0
    comm_bwd: float = 0.0

    @property
    def bwd_total(self) -> float:
        return self.backward_s + self.recompute_s + self.comm_bwd + self.imbalance_s

    @property
    def per_micro_batch_s(self) -> float:
        return self.fwd_total + self.bwd_total


@dataclass
class TrainStepResult:
    model: str
    hardware: str
    parallelism: dict
    gpus: int
    seq_len_tokens: int
    micro_batch_size: int
    num_micro_batches: int
    tokens_per_step: int
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_flop_per_step: float
    mfu: float
    compute_s: float
    exposed_comm_s: dict[str, float]
    bubble_s: float
    bubble_ratio: float
    optimizer_s: float
    fits: bool
    verdict: str
    memory: Any
    ep_imbalance: float
    pipeline_source: str
    breakdown: list[Row]
    stages: list[dict]
    options: dict
    assumptions: list[dict] = field(default_factory=list)
    pipeline: Any = field(default=None, repr=False)   # PipelineTime (engine timeline for the Gantt chart)
    hardware_flop_per_step: float = 0.0   # FLOP the GPUs execute, recompute included (HFU's numerator)
    hfu: float = 0.0                      # hardware FLOP / (step time x GPUs x bf16 peak)
    stage_split: str = "uniform"          # layers over pipeline stages: "balanced" (by cost) | "uniform" (by count)


# ------------------------------------------------------------------------------------------- helpers
class TrainingContext:
    """Memoised pieces shared by every layout of one (model, hardware, kernel_time): a sweep evaluates
    thousands of layouts that reuse the same layer costs, collectives and CP costs."""

    def __init__(self, model, hw, kernel_time: Callable | None = None, layer_costs: Callable | None = None):
        if kernel_time is None:
            from k3sim.predict import predict_kernel_time as kernel_time
        if layer_costs is None:
            from k3sim.step import training_layer_costs as layer_costs
        self.model, self.hw = model, hw
        self.kernel_time, self.layer_costs_fn = kernel_time, layer_costs
        self.coll = Collectives(hw, kernel_time)
        self._layers: dict[tuple, list] = {}
        self._cp: dict[tuple, dict] = {}
        self._experts: dict[tuple, tuple[float, str]] = {}
        self._rank_params: dict[tuple, list[tuple[int, int]]] = {}
        self._flop: dict[int, float] = {}
        self._hw_flop: dict[tuple, float] = {}
        self._stages: dict[tuple, list] = {}
        self._splits: dict[tuple, list | None] = {}     # per-layer seconds and stage splits (`_stage_split`)

    def layer_costs(self, tp: int, ep: int, cp: int, tokens: int, seq_len: int, glue: str = "calibrated",
                    precision: str = "bf16") -> list:
        key = (tp, ep, cp, tokens, seq_len, glue, precision)
        if key not in self._layers:
            from k3sim.step.glue import glue_for

            self._layers[key] = list(self.layer_costs_fn(self.model, self.hw, tp=tp, ep=ep, cp=cp, tokens=tokens,
                                                         seq_len=seq_len, kernel_time=self.kernel_time,
                                                         glue=glue_for(self.hw, glue, self.model), precision=precision))
        return self._layers[key]

    def cp_overhead(self, tp: int, cp: int, seq_len: int, opts: TrainOptions, source: str | None) -> dict:
        """Per layer kind: seconds CP adds per sequence beyond the local attention kernel, fwd and bwd,
        split into exposed communication and the scheme's own compute."""
        key = (tp, cp, seq_len, opts.kda_cp, opts.mla_cp)
        if key in self._cp:
            return self._cp[key]
        from k3sim.cp import cp_step, geometry_from_model

        g = geometry_from_model(self.model, tp)
        try:
            res = cp_step(g, self.hw, seq_len, cp, opts.kda_cp, opts.mla_cp, kernel_time=self.kernel_time,
                          intra=None)
        except InputError as err:
            field_name = "kda_cp" if err.source == "--strategy" else "mla_cp" if err.source == "--mla-strategy" \
                else "cp"
            raise InputError(err.reason, source=source, field=field_name) from None
        out = {}
        L = seq_len // cp
        for kind, lc in (("kda", res.kda), ("mla", res.mla)):
            if lc is None:
                continue
            # What the step package's layer costs already hold for this layer on one CP rank: KDA, the
            # chunked kernel over the local tokens (the CP model's first row); MLA, causal attention of the
            # local tokens among themselves. CP's own cost is the rest: the scheme's extra compute (KCP
            # pre-process and fold, attention against the other ranks' keys, latent up-projection) and its
            # exposed communication.
            if kind == "mla":
                kt = lambda op: float(self.kernel_time(op, {"T": L, "H": g.mla_heads_per_rank,  # noqa: E731
                                                            "D": g.mla_sdpa_head_dim}, hardware=self.hw).seconds)
                f = kt("sdpa_causal_fwd")
                local = {"fwd": f, "bwd": max(0.0, kt("sdpa_causal_fwd_bwd") - f)}
            else:
                local = {ph: (getattr(lc, ph).rows[0]["seconds"] if getattr(lc, ph).rows else 0.0)
                         for ph in ("fwd", "bwd")}
            per = {}
            for phase in ("fwd", "bwd"):
                ph = getattr(lc, phase)
                extra = max(0.0, ph.time_s - local[phase])
                comm = min(ph.exposed_comm_s, extra)
                per[phase] = {"comm": comm, "compute": extra - comm}
            per["scheme"] = lc.strategy
            per["link"] = lc.link
            out[kind] = per
        self._cp[key] = out
        return out

    def expert_compute(self, tp: int, ep: int, tokens: int, fold: int = 1,
                       precision: str = "bf16") -> tuple[float, str]:
        """Forward seconds of the routed-expert GEMMs of one MoE layer on one rank for a micro-batch of
        `tokens` per TP group (the step package's calls, timed by its Timer): the part EP load imbalance
        stretches. `fold`: how many TP groups' tokens meet in one EP group (the step layout's attention DP).
        `precision`: fp8 prices the grouped GEMMs as the layer costs do (`k3sim.step.training.call_forward`)."""
        key = (tp, ep, tokens, fold, precision)
        if key not in self._experts:
            from k3sim.step.batch import Batch
            from k3sim.step.calls import Timer
            from k3sim.step.layers import expert_calls
            from k3sim.step.layout import StepLayout
            from k3sim.step.training import call_forward

            lay = StepLayout(tp=tp, ep=ep, attention_dp=fold)
            timer = Timer(self.hw, self.kernel_time)
            batch = Batch(prefill=((tokens, 0),))
            rows = [call_forward(timer, c, precision) for c in expert_calls(self.model, lay, batch, "grouped_bf16")]
            main = max(rows) if rows else None
            self._experts[key] = (sum(r[0] for r in rows), main[1] if main else "none")
        return self._experts[key]

    def model_flop_per_token(self, seq_len: int) -> float:
        """Training model FLOP per token (MFU's numerator): `k3sim.memory.flops.training_flop_per_token`, the one
        count the prefix cache also uses (6 x active parameters + 3 H S (d_qk + d_v) per causal MLA layer +
        KDA's chunkwise work x 3; Megatron-LM `num_floating_point_operations`)."""
        if seq_len not in self._flop:
            from k3sim.memory.flops import training_flop_per_token

            self._flop[seq_len] = training_flop_per_token(self.model, seq_len)
        return self._flop[seq_len]

    def hardware_flop_per_token(self, seq_len: int, recompute: bool | tuple[str, ...]) -> float:
        """FLOP the GPUs execute per token (HFU's numerator): the GEMMs' model count (a GEMM executes what it
        is counted with) x 3, the attention kernels' own registry counts (`sdpa_causal_fwd_bwd`: FlashAttention's
        3.5 x forward, V padded to the QK dim; `chunk_kda_fwd_bwd`: padded chunks; every other kind's core calls,
        `_kind_core_flop`), and under full activation
        checkpointing the forward of all of it once more; under selective recompute (`recompute` a tuple of
        modules) the forward of those modules only. Not counted: CP schemes' own extra work (KCP fold, latent
        up-projection), redundant experts, elementwise kernels (so norms and moe_act add none)."""
        key = (seq_len, recompute if isinstance(recompute, tuple) else bool(recompute))
        if key not in self._hw_flop:
            self._hw_flop[key] = _hardware_flop_per_token(self.model, seq_len, key[1])
        return self._hw_flop[key]

    def stage_sums(self, par: Parallelism, tokens: int, seq_len: int, glue: str = "calibrated",
                   chunks: list[list[int]] | None = None, precision: str = "bf16") -> list[tuple[list[int], dict]]:
        """Per pipeline rank: its layers and the sums a step needs (compute of its layers, the embedding
        on the first rank and the LM head on the last; layer counts by kind), memoised per layout shape.
        `chunks`: the 0-based layers of each virtual chunk (`_stage_split`); None = uniform by layer count."""
        split = None if chunks is None else tuple(tuple(c) for c in chunks)
        key = (par.tp, par.ep, par.cp, par.pp, par.virtual_stages, tokens, seq_len, glue, split, precision)
        hit = self._stages.get(key)
        if hit is None:
            from k3sim.memory.layout import rank_layers

            costs = self.layer_costs(par.tp, par.ep, par.cp, tokens, seq_len, glue, precision)
            ends = ("embedding", "lm_head")
            by_layer = {c.layer: c for c in costs if c.kind not in ends}
            extra = {c.kind: c for c in costs if c.kind in ends}
            model_layers, ffn = self.model.layers, self.model.ffn_kinds
            hit = []
            for r, layers in enumerate(rank_layers(self.model, par, chunks)):
                agg = {"forward_s": 0.0, "backward_s": 0.0, "layer_forward_s": 0.0, "moe": 0, "sublayers": 0,
                       **{k: 0 for k in self.model.mixer_kinds}, "moe_layer_compute_s": []}
                for i in layers:
                    c = by_layer[i]
                    agg["forward_s"] += c.forward_s
                    agg["layer_forward_s"] += c.forward_s
                    agg["backward_s"] += c.backward_input_s + c.backward_weight_s
                    for kind in model_layers[i].mixers:   # layers of each mixer kind (CP prices them per kind)
                        agg[kind] += 1
                    agg["sublayers"] += bool(model_layers[i].mixers) + (model_layers[i].ffn is not None)
                    if ffn[i] == "moe":
                        agg["moe"] += 1
                        agg["moe_layer_compute_s"].append(c.forward_s + c.backward_input_s + c.backward_weight_s)
                for kind, first in (("embedding", r == 0), ("lm_head", r == par.pp - 1)):
                    if first and kind in extra:
                        e = extra[kind]
                        agg["forward_s"] += e.forward_s
                        agg["backward_s"] += e.backward_input_s + e.backward_weight_s
                hit.append((layers, agg))
            self._stages[key] = hit
        return hit

    def rank_params(self, par: Parallelism, chunks: list[list[int]] | None = None) -> list[tuple[int, int]]:
        """(non-expert, routed-expert) parameters held by each pipeline rank before TP/EP sharding, for the
        chunks' layers (`stage_sums`; None = uniform)."""
        key = (par.pp, par.virtual_stages, None if chunks is None else tuple(tuple(c) for c in chunks))
        if key not in self._rank_params:
            from k3sim.memory.layout import rank_layers
            from k3sim.memory.params import ROUTED
            from k3sim.memory.plan import _rank_params

            out = []
            for r, layers in enumerate(rank_layers(self.model, par, chunks)):
                p = _rank_params(self.model, layers, r, par.pp)
                out.append((sum(v for k, v in p.items() if k != ROUTED), p.get(ROUTED, 0)))
            self._rank_params[key] = out
        return self._rank_params[key]


def _kind_of(row) -> str:
    return getattr(row, "kind", "")


# ------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class _MicroBatch:
    """The token counts of one micro-batch that every part of the step prices, computed once so that the
    parts agree on them."""

    seq_len: int
    size: int            # sequences per micro-batch
    count: int           # micro-batches per step
    recompute: int       # 1 under full activation checkpointing: each layer's forward runs again before its backward
    tokens: int          # tokens of one micro-batch
    tokens_rank: int     # ... on one CP rank (one TP group)
    sp_tokens: float     # ... the sequence-parallel shard on one TP rank
    recompute_mode: str = "full"                  # none | full | selective (configs.planning.resolve_recompute)
    recompute_modules: tuple[str, ...] = ()       # the modules re-run under selective recompute
    precision: str = "bf16"                       # bf16 | fp8: the memory plan's activation caching

    @classmethod
    def of(cls, par: Parallelism, seq_len: int, size: int, count: int, checkpointing: bool,
           opts: TrainOptions | None = None, model=None, source: str | None = None) -> "_MicroBatch":
        """`opts.recompute` (the scenario's `training.recompute`) wins over `checkpointing` (the workload's
        `activation_checkpointing`) when given: `recompute: none` with checkpointing true runs no recompute."""
        from k3sim.configs.planning import resolve_recompute

        tokens = size * seq_len
        tokens_rank = tokens // par.cp
        opts = opts or TrainOptions()
        if model is None:  # no model to check modules against: the workload's checkpointing alone
            mode, modules = ("full" if checkpointing else "none"), ()
        else:
            mode, modules = resolve_recompute(model, opts.recompute, opts.recompute_modules, checkpointing, source)
        return cls(seq_len, size, count, 1 if mode == "full" else 0, tokens, tokens_rank, tokens_rank / par.tp,
                   mode, modules, opts.precision)

    @property
    def flop_recompute(self) -> bool | tuple[str, ...]:
        """What the recompute re-runs, for the hardware FLOP: True (every layer), or the selective modules."""
        return True if self.recompute else self.recompute_modules


@dataclass
class _EpCost:
    """What EP adds to one MoE layer of one micro-batch's forward (the backward and the recompute repeat the
    all-to-alls), kept together because the stages and the breakdown both read it."""

    imbalance: float = 1.0       # max/mean routed tokens of the busiest EP rank
    layer_fwd_s: float = 0.0     # exposed dispatch + combine all-to-alls, stretched by the imbalance
    expert_fwd_s: float = 0.0    # routed-expert GEMMs: the compute the imbalance stretches
    fold_fix_fwd_s: float = 0.0  # expert compute the step package's layer costs miss when EP folds TP groups
    prefetch_s: float = 0.0      # MoonEP: all-to-all of the redundant experts' weights, per layer
    source: str = ""
    imbalance_source: str = ""


def _check_step(model, hw, par: Parallelism, seq_len: int, num_micro_batches: int | None, opts: TrainOptions,
                source: str | None) -> int:
    """Refuse a layout or step shape the model cannot price before any cost is computed; the micro-batch count
    (default: one per virtual pipeline stage, the fewest that fill the pipeline)."""
    from k3sim.configs.parallel import check_layout

    check_layout(model, par, mode="train", source=source, hardware=hw)  # the one layout check (configs/parallel.py)
    if opts.redundant_experts and model.moe is not None and par.ep > 1:  # bounded before the balancer runs
        check_redundant_experts(opts.redundant_experts, model.moe.num_routed_experts, par.ep, source)
    if seq_len % par.cp:
        raise InputError(f"cp={par.cp} does not divide the {seq_len}-token sequence", source=source, field="cp")
    if opts.precision == "fp8" and not (hw.peak_flops_per_s or {}).get("fp8"):
        raise InputError(f"FP8 training needs FP8 tensor cores; profile '{hw.name}' has no fp8 peak in "
                         "peak_flops_per_s: set training.precision: bf16, or use a profile with an fp8 peak",
                         source=source, field="training.precision")
    m = num_micro_batches or par.pp * par.virtual_stages
    if par.virtual_stages > 1 and m % par.pp:
        raise InputError(f"interleaved 1F1B needs the micro-batch count ({m}) to be a multiple of pp={par.pp}",
                         source=source, field="num_micro_batches")
    return m


def _tp_comm(coll: Collectives, g: dict, par: Parallelism, mb: _MicroBatch, d: int,
             opts: TrainOptions) -> tuple[float, str]:
    """Exposed TP seconds of one layer's forward, with their source: sequence parallelism opens each sublayer
    with an all-gather and closes it with a reduce-scatter of the SP shard (nccl-tests per-rank shard bytes),
    less what `tp_overlap` hides. The stages repeat it for the backward and the recompute."""
    t_ag, src_ag, link_tp = coll.time("all_gather", mb.sp_tokens * d * BF16, g["tp"])
    t_rs, src_rs, _ = coll.time("reduce_scatter", mb.sp_tokens * d * BF16, g["tp"])
    return (SUBLAYERS_PER_LAYER * (t_ag + t_rs) * (1 - opts.tp_overlap),
            f"all_gather {src_ag} + reduce_scatter {src_rs} over tp={par.tp} ({link_tp})")


def _ep_comm(ctx: TrainingContext, model, par: Parallelism, g: dict, mb: _MicroBatch, opts: TrainOptions) -> _EpCost:
    """EP per MoE layer forward: the DeepEP-class dispatch + combine of the latent tokens (ops ep_dispatch /
    ep_combine, `k3sim.comm.ep`: normal kernels, FP8 dispatch under training.precision fp8 and BF16 combine,
    node-limited routing when the model has it; `k3sim.training.overlap.ep_all_to_all`), whose busiest link
    already carries the routing distribution (no imbalance stretch on top); the routing imbalance stretches
    the routed-expert GEMMs; MoonEP's redundant experts add their weights' prefetch. The backward runs the
    same two in reverse (the gradient of combine has dispatch's shape and vice versa: the same bytes) and
    the recompute repeats the forward's (`_stage_compute` counts them). `training.ep_overlap` given: that
    share is hidden here; None: the pipeline schedule hides what its paired chunks can
    (`k3sim.training.overlap`). Apart from the stages because it depends on the layout only, not on which
    layers a stage holds."""
    moe, coll = model.moe, ctx.coll
    ep = _EpCost()
    # Training folds EP over the stage's ranks: an EP group wider than TP gathers the tokens of ep/tp TP
    # groups (data-parallel or CP ranks), so each rank's experts see tokens x k / tp pairs. The step
    # package's layer costs assume the tokens of one TP group (k / ep pairs each): add the difference.
    fold = max(1, par.ep // par.tp)
    if moe is not None and fold > 1:
        e_true, _ = ctx.expert_compute(par.tp, par.ep, mb.tokens_rank, fold, precision=mb.precision)
        e_step, _ = ctx.expert_compute(par.tp, par.ep, mb.tokens_rank, 1, precision=mb.precision)
        ep.fold_fix_fwd_s = e_true - e_step
    if moe is None or par.ep <= 1:
        return ep
    from k3sim.training.overlap import ep_all_to_all, overlap_note

    a2a = ep_all_to_all(ctx.kernel_time, ctx.hw, model, par, mb.sp_tokens, opts, ctx.__dict__.setdefault("_ep_a2a", {}))
    im = ep_imbalance(moe.num_routed_experts, par.ep, moe.num_active_experts,
                      int(round(mb.sp_tokens * par.ep)), skew=opts.routing_skew,
                      redundant_per_rank=opts.redundant_experts, seed=opts.seed)
    imb = ep.imbalance = im.max_over_mean
    ep.layer_fwd_s = a2a.seconds * (1 - (opts.ep_overlap or 0.0))
    ep.expert_fwd_s, src_exp = ctx.expert_compute(par.tp, par.ep, mb.tokens_rank, fold, precision=mb.precision)
    ep.imbalance_source = f"{im.describe()}; routed-expert GEMMs: {src_exp}"
    ep.source = f"{a2a.source}; {overlap_note(opts, par)}"
    if opts.redundant_experts:
        from k3sim.memory.params import routed_expert_params

        # bf16 weights of the redundant experts, fetched from their home ranks once per micro-batch
        wbytes = opts.redundant_experts * routed_expert_params(model) * BF16
        ep.prefetch_s, src_pf, _ = coll.time("all_to_all", wbytes, g["ep"])
        ep.source += f"; MoonEP prefetch {wbytes:.3g} B/layer ({src_pf}), overlapped with the layer"
    return ep


def _stage_compute(ctx: TrainingContext, par: Parallelism, mb: _MicroBatch, glue: str, tp_layer_fwd: float,
                   ep: _EpCost, cp: dict, chunks: list[list[int]] | None = None,
                   precision: str = "bf16") -> list[StageCost]:
    """Per pipeline rank, one micro-batch: the compute of its layers (with the EP fold correction and the
    recompute) and the exposed TP, EP and CP seconds of those layers, forward and backward apart, because the
    pipeline schedule takes each stage's forward and backward separately."""
    recompute, fold_fix_f = mb.recompute, ep.fold_fix_fwd_s
    # selective: the chosen modules' forward again (`LayerCost.module_forward_s`); no TP / EP all-to-all or expert
    # GEMM is re-run, and CP's forward repeats only for an attention / KDA core that is (`module_parts`: the modules a
    # selection re-runs, `linear_attn_core` covering KDA's `kda_core`)
    modules = mb.recompute_modules
    by_layer = ({c.layer: c for c in ctx.layer_costs(par.tp, par.ep, par.cp, mb.tokens, mb.seq_len, glue, precision)}
                if modules else {})
    parts = module_parts(modules)
    cp_again = {"mla": recompute or "attention_core" in parts, "kda": recompute or "kda_core" in parts}
    stages = []
    for r, (layers, agg) in enumerate(ctx.stage_sums(par, mb.tokens, mb.seq_len, glue, chunks, precision)):
        F, B, Rf = agg["forward_s"], agg["backward_s"], agg["layer_forward_s"]
        n_moe = agg["moe"]
        F += fold_fix_f * n_moe
        B += 2 * fold_fix_f * n_moe            # input grad (transposed GEMM) + weight grad, each ~ the forward
        comm_f = {k: 0.0 for k in COMM_KINDS}
        comm_b = {k: 0.0 for k in COMM_KINDS}
        tp_f = agg["sublayers"] / SUBLAYERS_PER_LAYER * tp_layer_fwd   # a mixer-only or FFN-only layer: one sublayer
        comm_f["tp"] = tp_f
        comm_b["tp"] = tp_f * (1 + recompute)
        imb_extra = 0.0
        if par.ep > 1 and n_moe:
            pf = sum(max(0.0, ep.prefetch_s - t) for t in agg["moe_layer_compute_s"]) if ep.prefetch_s else 0.0
            comm_f["ep"] = n_moe * ep.layer_fwd_s + pf
            comm_b["ep"] = n_moe * ep.layer_fwd_s * (1 + recompute)
            # busiest rank: fwd, bwd (2x fwd: input + weight grads), recompute
            imb_extra = n_moe * (ep.imbalance - 1.0) * ep.expert_fwd_s * (1 + 2 + recompute)
        for kind, ov in cp.items():
            f_cp = mb.size * (ov["fwd"]["comm"] + ov["fwd"]["compute"])
            b_cp = mb.size * (ov["bwd"]["comm"] + ov["bwd"]["compute"])
            comm_f["cp"] += agg.get(kind, 0) * f_cp
            comm_b["cp"] += agg.get(kind, 0) * (b_cp + cp_again.get(kind, recompute) * f_cp)
        R = recompute * (Rf + fold_fix_f * n_moe) + sum(by_layer[i].module_forward_s.get(mod, 0.0)
                                                         for i in layers for mod in parts)
        st = StageCost(r, [i + 1 for i in layers], F, B, R,
                       {k: comm_f[k] + comm_b[k] for k in COMM_KINDS}, imb_extra)
        st.comm_fwd = sum(comm_f.values())
        st.comm_bwd = sum(comm_b.values())
        stages.append(st)
    return stages


def _stage_split(ctx: TrainingContext, par: Parallelism, mb: _MicroBatch, opts: TrainOptions, tp_layer_fwd: float,
                 ep: _EpCost, cp: dict) -> list[list[int]] | None:
    """The 0-based layers of each virtual chunk under `opts.stage_split`: None (uniform by layer count) unless
    balanced with pp > 1 and the balanced split is not the uniform one. Balanced =
    `k3sim.training.partition.balanced_split` over each layer's seconds per micro-batch as `_stage_compute`
    prices a stage of that one layer: forward, backward, recompute, the EP fold correction, the EP imbalance
    of its routed experts, and its exposed TP, EP (and MoonEP prefetch) and CP seconds (the CP scheme's
    attention to other ranks' keys included); the embedding rides with layer 0 and the LM head with the last
    layer, which always sit in the first and last chunk. Not counted: PP sends (one per hop, the same for
    every cut), DP / optimizer time (outside the micro-batch loop) and the EP all-to-all the schedule hides
    afterwards (`k3sim.training.overlap`: it depends on the stage, not on one layer). Memoised: the layer seconds per
    (tp, ep, cp, micro-batch shape, options and the TP / EP seconds they came to), which no pp or v changes;
    the split per layout (a sweep's micro-batch counts share it)."""
    if opts.stage_split != "balanced" or par.pp == 1:
        return None
    from dataclasses import astuple, replace

    from k3sim.memory.layout import chunk_layers
    from k3sim.training.partition import balanced_split

    shape = (par.tp, par.ep, par.cp, replace(mb, count=0), opts, tp_layer_fwd, astuple(ep))
    per_layer = ctx._splits.get(shape)
    if per_layer is None:
        one_per_rank = par.model_copy(update={"pp": ctx.model.num_layers, "virtual_stages": 1})
        per_layer = ctx._splits[shape] = [s.per_micro_batch_s for s in _stage_compute(
            ctx, one_per_rank, mb, opts.moe_glue, tp_layer_fwd, ep, cp, precision=opts.precision)]
    key = (par, shape)
    hit = ctx._splits.get(key, key)
    if hit is key:
        split = balanced_split(per_layer, par.pp, par.virtual_stages)
        hit = ctx._splits[key] = None if split == chunk_layers(len(per_layer), len(split)) else split
    return hit


def _fastest_fitting(runs: list[tuple], memory_of: Callable[[tuple], tuple]) -> tuple[tuple, tuple]:
    """Of the stage splits priced by `train_step` (fastest first; the cost-balanced one first on a tie), the
    fastest whose memory plan fits, with that plan; the fastest when none fits. The balanced split is kept
    unless the uniform one runs faster (the schedule sees more than the slowest rank: which ranks fill and drain
    the pipeline, forward and backward apart) or only the uniform one fits (balancing time can put more layers,
    hence more weights and activations, on a rank)."""
    first = None
    for run in runs:
        mem = memory_of(run)
        if mem[1]:
            return run, mem
        first = first or (run, mem)
    return first


def _pp_sends(model, hw, par: Parallelism, coll: Collectives, mb: _MicroBatch) -> tuple[float, str]:
    """Seconds of one stage-to-stage send and its source: the hidden shard plus the AttnRes blocks produced in
    the sending chunk (cache-based transport), at the mean hop (the pipeline engine takes one send time):
    hops inside a scale-up domain on NVLink, the rest on NICs."""
    if par.pp <= 1:
        return 0.0, "none"
    d = model.hidden_size
    chunk_layers = math.ceil(model.num_layers / (par.pp * par.virtual_stages))
    blocks = math.ceil(chunk_layers / model.attn_res_block_size) if model.attn_res_block_size else 0
    hop_bytes = mb.size * mb.seq_len / par.cp / par.tp * d * BF16 * (1 + blocks)
    links = pp_hop_links(par, hw)
    times = {lk: coll.p2p(hop_bytes, lk) for lk in set(links)}
    t_hop = sum(times[lk][0] for lk in links) / len(links)
    out = links.count("scale-out")
    how = "; ".join(f"{lk}: {times[lk][1]}" for lk in sorted(times))
    return t_hop, (f"send_recv of {hop_bytes:.3g} B per hop (hidden + {blocks} AttnRes block(s), SP shard), "
                   f"{out} of {len(links)} hops scale-out, mean hop; {how}")


def _dp_exposure(ctx: TrainingContext, par: Parallelism, g: dict, stages: list[StageCost], m: int,
                 chunks: list[list[int]] | None = None) -> tuple[float, str]:
    """Exposed DP seconds and their source, on the stage where they are largest: the gradient reduction
    (all-reduce without ZeRO, reduce-scatter with it) and the parameter all-gather, each beyond the
    micro-batch backward / forward it overlaps (Megatron overlap_grad_reduce / overlap_param_gather); ZeRO-3
    gathers the weights again for every micro-batch's forward and backward."""
    from k3sim.memory.plan import GRAD_BYTES, WEIGHT_BYTES

    coll, zero = ctx.coll, par.zero_stage
    gd, ge = g["dp"], g["edp"]
    dp_exposed, dp_src = 0.0, "none"
    for st, (dense, routed) in zip(stages, ctx.rank_params(par, chunks)):
        dense_rank = dense / par.tp
        routed_rank = routed / par.ep
        if zero == 0:
            t_grad = coll.time("all_reduce", dense_rank * GRAD_BYTES, gd)[0] + \
                coll.time("all_reduce", routed_rank * GRAD_BYTES, ge)[0]
            t_par = 0.0
        else:
            t_grad = coll.time("reduce_scatter", dense_rank * GRAD_BYTES / gd.gpus, gd)[0] + \
                coll.time("reduce_scatter", routed_rank * GRAD_BYTES / ge.gpus, ge)[0]
            t_par = coll.time("all_gather", dense_rank * WEIGHT_BYTES / gd.gpus, gd)[0] + \
                coll.time("all_gather", routed_rank * WEIGHT_BYTES / ge.gpus, ge)[0]
        exposed = max(0.0, t_grad - st.bwd_total) + max(0.0, t_par - st.fwd_total)
        if zero == 3:  # weights gathered again for every micro-batch's forward and backward
            exposed += m * (max(0.0, t_par - st.fwd_total) + max(0.0, t_par - st.bwd_total))
        if exposed >= dp_exposed:
            dp_exposed = exposed
            dp_src = (f"grads {'all-reduce' if zero == 0 else 'reduce-scatter'} {t_grad:.3g} s + params all-gather "
                      f"{t_par:.3g} s over dp x cp={gd.gpus} (non-expert) and {ge.gpus} (expert) ranks, "
                      f"overlapped with one micro-batch's backward / forward (stage {st.stage})")
    return dp_exposed, dp_src


def _optimizer_step(ctx: TrainingContext, par: Parallelism, g: dict,
                    chunks: list[list[int]] | None = None) -> tuple[float, str]:
    """Seconds of the optimizer update on the slowest pipeline rank and their source: it streams the rank's
    shard of weights, grads and Adam states through HBM once (ZeRO >= 1 shards them over DP)."""
    from k3sim.memory.plan import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES

    zero = par.zero_stage
    gd, ge = g["dp"], g["edp"]
    opt_s, opt_src = 0.0, "none"
    for dense, routed in ctx.rank_params(par, chunks):
        dense_rank = dense / par.tp
        routed_rank = routed / par.ep
        shard = (dense_rank / (gd.gpus if zero >= 1 else 1) + routed_rank / (ge.gpus if zero >= 1 else 1))
        t_opt, src_o = ctx.coll.kernel("hbm_copy", bytes=max(1, shard * (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES)))
        if t_opt >= opt_s:
            opt_s, opt_src = t_opt, f"hbm_copy of the optimizer shard's weights, grads, Adam states ({src_o})"
    return opt_s, opt_src


def _breakdown(m: int, crit: StageCost, tp_src: str, ep: _EpCost, cp: dict, pipe, pp_src: str,
               dp: tuple[float, str], opt: tuple[float, str], glue_note: str = "") -> list[Row]:
    """The step's rows, the per-stage ones from the critical (slowest) pipeline rank times the micro-batches,
    in the order a reader adds them up: compute, EP imbalance, exposed TP / EP / CP, bubble, PP sends, DP,
    optimizer. Zero rows are dropped except the bubble and the optimizer, which a reader looks for.
    `glue_note`: how the layer costs priced the glue (`GlueCalibration.note`), in each compute row's source."""
    (dp_exposed, dp_src), (opt_s, opt_src) = dp, opt
    g = f"; {glue_note}" if glue_note else ""
    breakdown = [
        Row("compute: forward", m * crit.forward_s, f"k3sim.step.training_layer_costs (calibrated kernels){g}"),
        Row("compute: backward", m * crit.backward_s, f"k3sim.step.training_layer_costs (calibrated kernels){g}"),
        Row("compute: recompute (activation checkpointing)", m * crit.recompute_s,
            f"forward again before backward{g}"),
    ]
    if crit.imbalance_s:
        breakdown.append(Row("compute: EP imbalance (busiest rank)", m * crit.imbalance_s, ep.imbalance_source, "ep"))
    labels = {"tp": "exposed comm: TP all-gather + reduce-scatter (SP)", "ep": "exposed comm: EP all-to-all",
              "cp": "CP: attention to other ranks' keys, scheme compute, exposed comm", "pp": "", "dp": ""}
    cp_src = ", ".join(f"{k.upper()} {v['scheme']} ({v['link']})" for k, v in cp.items()) or "none"
    rows_src = {"tp": tp_src, "ep": ep.source,
                "cp": (f"k3sim.cp: {cp_src}; beyond the local tokens' own attention (in the layer costs): "
                       "MLA attention against the other ranks' keys, KCP pre-process and fold, exposed communication")}
    for k in ("tp", "ep", "cp"):
        if crit.comm_s.get(k):
            breakdown.append(Row(labels[k], m * crit.comm_s[k], rows_src[k], k))
    breakdown.append(Row("pipeline bubble", pipe.bubble_s, pipe.source, "bubble"))
    if pipe.p2p_s:
        breakdown.append(Row("exposed comm: PP sends", pipe.p2p_s, f"{pp_src}; {pipe.source}", "pp"))
    if dp_exposed:
        breakdown.append(Row("exposed comm: DP grad reduce-scatter / param all-gather", dp_exposed, dp_src, "dp"))
    breakdown.append(Row("optimizer step", opt_s, opt_src, "optimizer"))
    return [r for r in breakdown if r.seconds or r.kind in ("bubble", "optimizer")]


def _totals(breakdown: list[Row]) -> tuple[dict[str, float], float]:
    """Exposed communication per kind and the compute seconds, summed from the breakdown so that they add up
    to the rows a reader sees."""
    exposed = {k: 0.0 for k in COMM_KINDS}
    for r in breakdown:
        if r.kind in exposed and not r.component.startswith("compute"):
            exposed[r.kind] += r.seconds
    return exposed, sum(r.seconds for r in breakdown if r.component.startswith("compute"))


def _memory_plan(model, hw, par: Parallelism, mb: _MicroBatch, activation_checkpointing: bool,
                 workspace_fraction: float, source: str | None,
                 stage_layers: list[list[int]] | None = None, pipe=None) -> tuple[Any, bool, str]:
    """(plan, fits, verdict) from `k3sim.memory.plan.train_plan`: memory is never re-derived here.
    `stage_layers`: each pipeline rank's 0-based layers when the stages are split by cost (None = uniform).
    `pipe` (`k3sim.training.schedule.PipelineTime`): the schedule's parameter copies (DualPipe: 2) and
    micro-batches in flight per rank (None: the 1F1B / interleaved count)."""
    from k3sim.memory.plan import train_plan

    memory = train_plan(model, hw, par, mb.seq_len, micro_batch_size=mb.size,
                        activation_checkpointing=activation_checkpointing, num_micro_batches=mb.count,
                        workspace_fraction=workspace_fraction, source=source, allow_overflow=True,
                        recompute=mb.recompute_mode, recompute_modules=mb.recompute_modules,
                        precision=mb.precision, stage_layers=stage_layers,
                        parameter_copies=pipe.parameter_copies if pipe is not None else 1,
                        in_flight=pipe.in_flight if pipe is not None else None)
    return memory, memory.fits, memory_verdict(memory)


def _hardware_flop_per_token(model, seq_len: int, recompute: bool | tuple[str, ...]) -> float:
    """See `TrainingContext.hardware_flop_per_token`: whole model, all ranks, per token of `seq_len` sequences.
    `recompute`: True (full), False / () (none), or the selectively recomputed modules."""
    from k3sim.configs.mla import mla_attention_head_dims
    from k3sim.kernels.ops import OPS
    from k3sim.memory.flops import FWD_BWD_FACTOR
    from k3sim.memory.params import count_params

    gemm = 2.0 * count_params(model).active_params   # forward GEMM FLOP, LM head included
    fwd = fwd_bwd = 0.0
    if model.mla is not None and model.num_mla_layers:
        p = {"T": seq_len, "H": model.mla.num_heads, "D": mla_attention_head_dims(model.mla).kernel_head_dim}
        fwd += model.num_mla_layers * OPS["sdpa_causal_fwd"].flop(p) / seq_len
        fwd_bwd += model.num_mla_layers * OPS["sdpa_causal_fwd_bwd"].flop(p) / seq_len
    if model.kda is not None and model.num_kda_layers:
        p = {"T": seq_len, "H": model.kda.num_heads, "K": model.kda.head_dim_k, "V": model.kda.head_dim_v}
        fwd += model.num_kda_layers * OPS["chunk_kda_fwd"].flop(p) / seq_len
        fwd_bwd += model.num_kda_layers * OPS["chunk_kda_fwd_bwd"].flop(p) / seq_len
    for f, fb in _kind_core_flop(model, seq_len).values():
        fwd, fwd_bwd = fwd + f, fwd_bwd + fb
    if isinstance(recompute, tuple):
        return FWD_BWD_FACTOR * gemm + fwd_bwd + _module_flop_per_token(model, seq_len, recompute)
    return FWD_BWD_FACTOR * gemm + fwd_bwd + (gemm + fwd if recompute else 0.0)


# Mixer kinds whose core FLOP `_hardware_flop_per_token` writes out from their sections (as before the other
# kinds were modelled); every other kind's come from its calls (`_kind_core_flop`).
_CORE_BY_FORMULA = ("kda", "mla")


def _kind_core_flop(model, seq_len: int) -> dict[str, tuple[float, float]]:
    """Per mixer kind other than `_CORE_BY_FORMULA`: (forward, forward+backward) FLOP per token of its core
    kernels, whole model (tp = 1, one `seq_len` sequence): the registry FLOP of each of the kind's calls that has
    a measured backward (`step.training.backward_op`: chunk kernels, attention), its backward op's at the share
    the call runs. The components of a kind start with its name (the step's naming contract)."""
    from k3sim.kernels.ops import OPS
    from k3sim.step.batch import Batch
    from k3sim.step.layers import layer_calls
    from k3sim.step.layout import StepLayout
    from k3sim.step.training import backward_op

    out: dict[str, list[float]] = {}
    batch, layout, done = Batch(prefill=((seq_len, 0),)), StepLayout(), {}
    for layer in model.layers:
        kinds = [k for k in layer.mixers if k not in _CORE_BY_FORMULA]
        if not kinds:
            continue
        key = layer.mixer
        if key not in done:
            calls = layer_calls(model, layer.index, layout, batch, "grouped_bf16")
            done[key] = {}
            for k in kinds:
                f = fb = 0.0
                for c in calls:
                    bwd = backward_op(c) if c.component.startswith(f"{k}_") else None
                    if bwd is not None:
                        f += OPS[c.op].flop(c.params) * c.count / seq_len
                        fb += OPS[bwd[0]].flop(bwd[1]) * bwd[2] * c.count / seq_len
                done[key][k] = (f, fb)
        for k, (f, fb) in done[key].items():
            acc = out.setdefault(k, [0.0, 0.0])
            acc[0] += f
            acc[1] += fb
    return {k: (v[0], v[1]) for k, v in out.items()}


def _module_flop_per_token(model, seq_len: int, modules: tuple[str, ...]) -> float:
    """Forward FLOP per token of the selectively recomputed modules, whole model: the MLA up-projection GEMMs
    (q_b: q_lora x H x d_qk, kv_b: kv_lora x H x (d_nope + d_v), 2 FLOP per multiply-add), the attention and
    chunked-KDA kernels' registry forward counts, and the other kinds' cores (`_kind_core_flop`: attention kinds
    under `attention_core`, recurrent ones under `linear_attn_core`); norms and the SwiGLU are elementwise (not
    counted)."""
    from k3sim.configs.kinds import MIXERS
    from k3sim.configs.mla import mla_attention_head_dims
    from k3sim.kernels.ops import OPS

    out, mla = 0.0, model.mla
    parts = module_parts(modules)
    if mla is not None and model.num_mla_layers:
        h, qk = mla.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if "mla_up_proj" in parts:
            up = (mla.q_lora_rank or 0) * h * qk + mla.kv_lora_rank * h * (mla.qk_nope_head_dim + mla.v_head_dim)
            out += model.num_mla_layers * 2.0 * up
        if "attention_core" in parts:
            p = {"T": seq_len, "H": h, "D": mla_attention_head_dims(mla).kernel_head_dim}
            out += model.num_mla_layers * OPS["sdpa_causal_fwd"].flop(p) / seq_len
    if "kda_core" in parts and model.kda is not None and model.num_kda_layers:
        p = {"T": seq_len, "H": model.kda.num_heads, "K": model.kda.head_dim_k, "V": model.kda.head_dim_v}
        out += model.num_kda_layers * OPS["chunk_kda_fwd"].flop(p) / seq_len
    if "attention_core" in parts or "linear_attn_core" in parts:
        for kind, (f, _) in _kind_core_flop(model, seq_len).items():
            if ("linear_attn_core" if MIXERS[kind].recurrent else "attention_core") in parts:
                out += f
    return out


def train_step(model, hw, par: Parallelism, *, seq_len: int, micro_batch_size: int = 1,
               num_micro_batches: int | None = None, activation_checkpointing: bool = True,
               workspace_fraction: float = 0.10, options: TrainOptions | None = None,
               kernel_time: Callable | None = None, layer_costs: Callable | None = None,
               context: TrainingContext | None = None, source: str | None = None,
               with_memory: bool = True) -> TrainStepResult:
    """Step time, breakdown, tokens/s, MFU and the memory plan of one training layout, built from the parts the
    module docstring lists, in its order: per-layer TP, EP and CP; the stages (split by cost, `_stage_split`,
    or by layer count; `_fastest_fitting` keeps one); the PP schedule over them with its sends; DP and the
    optimizer; the breakdown of the slowest stage."""
    opts = options or TrainOptions()   # a pydantic schema: its ranges were checked when it was built
    m = _check_step(model, hw, par, seq_len, num_micro_batches, opts, source)
    ctx = context or TrainingContext(model, hw, kernel_time, layer_costs)
    g = groups(par)
    mb = _MicroBatch.of(par, seq_len, micro_batch_size, m, activation_checkpointing, opts, model, source)
    tp_layer_fwd, tp_src = _tp_comm(ctx.coll, g, par, mb, model.hidden_size, opts)
    ep = _ep_comm(ctx, model, par, g, mb, opts)
    cp = ctx.cp_overhead(par.tp, par.cp, seq_len, opts, source) if par.cp > 1 else {}  # per sequence
    t_hop, pp_src = _pp_sends(model, hw, par, ctx.coll, mb)

    def priced(chunks):   # one stage split through the schedule, DP and the optimizer
        stages = _stage_compute(ctx, par, mb, opts.moe_glue, tp_layer_fwd, ep, cp, chunks, precision=opts.precision)
        pipe = schedule_pipeline(stages, model, hw, par, m, t_hop, ep, opts, mb.recompute,
                                 ctx.layer_costs(par.tp, par.ep, par.cp, mb.tokens, mb.seq_len, opts.moe_glue,
                                                 opts.precision), source)
        dp, opt = _dp_exposure(ctx, par, g, stages, m, chunks), _optimizer_step(ctx, par, g, chunks)
        return pipe.step_time_s + dp[0] + opt[0], chunks, stages, pipe, dp, opt

    def memory_of(run):   # the memory plan of that split's ranks (None: the uniform default placement)
        placed = None if run[1] is None else [[i - 1 for i in s.layers] for s in run[2]]
        return (_memory_plan(model, hw, par, mb, activation_checkpointing, workspace_fraction, source, placed, run[3])
                if with_memory else (None, True, ""))

    balanced = _stage_split(ctx, par, mb, opts, tp_layer_fwd, ep, cp)
    runs = sorted((priced(c) for c in ([balanced, None] if balanced else [None])), key=lambda x: x[0])
    (step, chunks, stages, pipe, dp, opt), (memory, fits, verdict) = _fastest_fitting(runs, memory_of)
    crit = max(stages, key=lambda s: s.per_micro_batch_s)
    breakdown = _breakdown(m, crit, tp_src, ep, cp, pipe, pp_src, dp, opt,
                           glue_note(hw, opts.moe_glue, model))
    exposed, compute = _totals(breakdown)
    tokens_step = m * micro_batch_size * seq_len * par.dp
    flop = tokens_step * ctx.model_flop_per_token(seq_len)
    hw_flop = tokens_step * ctx.hardware_flop_per_token(seq_len, mb.flop_recompute)
    peak = float(hw.peak_flops_per_s.get("bf16", 0.0)) * par.gpus
    return TrainStepResult(
        model=model.name, hardware=hw.name, parallelism=par.model_dump(), gpus=par.gpus, seq_len_tokens=seq_len,
        micro_batch_size=micro_batch_size, num_micro_batches=m, tokens_per_step=tokens_step, step_time_s=step,
        tokens_per_s=tokens_step / step, tokens_per_s_per_gpu=tokens_step / step / par.gpus,
        model_flop_per_step=flop, mfu=flop / (step * peak) if peak else 0.0, compute_s=compute,
        exposed_comm_s=exposed, bubble_s=pipe.bubble_s, bubble_ratio=pipe.bubble_ratio, optimizer_s=opt[0],
        fits=fits, verdict=verdict, memory=memory, ep_imbalance=ep.imbalance, pipeline_source=pipe.source,
        breakdown=breakdown,
        stages=[{"stage": s.stage, "layers": s.layers, "forward_s": s.forward_s, "backward_s": s.backward_s,
                 "recompute_s": s.recompute_s, "exposed_comm_s": s.comm_s, "imbalance_s": s.imbalance_s,
                 "per_micro_batch_s": s.per_micro_batch_s} for s in stages],
        options=opts.model_dump(), pipeline=pipe,
        assumptions=ASSUMPTIONS + [glue_assumption(hw, opts.moe_glue, model)]
        + precision_assumption(opts.precision, hw, ctx.kernel_time,
                               layer_costs=ctx.layer_costs(par.tp, par.ep, par.cp, mb.tokens, seq_len, opts.moe_glue,
                                                           opts.precision))
        + [split_assumption(opts.stage_split, chunks)],
        hardware_flop_per_step=hw_flop, hfu=hw_flop / (step * peak) if peak else 0.0,
        stage_split="uniform" if chunks is None else "balanced")


def split_assumption(requested: str, chunks: list[list[int]] | None) -> dict:
    """The stage split the step used, as an assumption row."""
    src = ("k3sim.training.partition: contiguous layers, the slowest rank's forward + backward + recompute + "
           "exposed TP/EP/CP per micro-batch minimised (embedding and LM head counted); what Megatron-LM's "
           "--decoder-first/last-pipeline-num-layers and torchtitan's manual split set by hand")
    if chunks is not None:
        return {"assumption": "layers over pipeline stages balanced by cost (training.stage_split: balanced)",
                "source": src}
    why = ("requested" if requested == "uniform" else
           "the cost-balanced split is the uniform one, runs slower in the schedule or does not fit")
    return {"assumption": f"layers over pipeline stages by layer count (uniform: {why})",
            "source": "k3sim.memory.layout.chunk_layers (Megatron's default split)" +
                      ("" if requested == "uniform" else f"; balanced candidate: {src}")}


def glue_note(hw, mode: str, model) -> str:
    """How the layer costs priced the glue, for the source of every compute row (`GlueCalibration.note`)."""
    from k3sim.step.glue import glue_for

    return glue_for(hw, mode, model).note


def glue_assumption(hw, mode: str = "calibrated", model=None) -> dict:
    """The training glue the layer costs used (`k3sim.step.glue`), as an assumption row: which mode, why (for
    "auto": the model's published training stack), the factors or kernels, and where they were measured
    (a profile without its own calibration says "carried from h200")."""
    from k3sim.step.glue import glue_for, load_glue, resolve_mode

    used = resolve_mode(mode, model)
    g = glue_for(hw, used)
    why = ""
    if mode == "auto":
        stack = ("uses fused permute / unpermute kernels" if used == "fused"
                 else "is not known to fuse the permute")
        why = (f"training.moe_glue: auto -> {used}: {model.name}'s published training stack {stack} "
               "(model field training_stack_fused_permute, source in its YAML); ")
    what = ("unmeasured kernels (MoE permute/combine, short conv; the gated norm and the AttnRes read, which no "
            "fitted run built, stay a plain proxy): HBM-copy time")
    if used == "proxy":
        cal = load_glue(hw)
        return {"assumption": f"{why}{what} of their bytes (training.moe_glue: proxy, bytes only)",
                "source": f"modelling choice (not measured); the measured unfused glue is x {cal.fwd:.1f} forward, "
                          f"x {cal.bwd:.1f} backward ({cal.source}): reports/training"}
    if used == "fused":
        return {"assumption": f"{why}MoE permute / combine: {g.fused_note}; the other unmeasured glue (short "
                              f"conv, KV write, gate multiply) as calibrated, HBM-copy time x {g.fwd:.1f} forward, "
                              f"x {g.bwd:.1f} backward; the gated norm and the AttnRes read a plain proxy (no "
                              "fitted run built AttnRes: step.glue.UNFITTED_PROXIES)",
                "source": f"{g.source}; held-out check reports/training/README.md"}
    return {"assumption": f"{why}{what} of their bytes x {g.fwd:.1f} forward, x {g.bwd:.1f} backward (unfused "
                          "routing glue)",
            "source": f"{g.source}; held-out check reports/training/README.md"}


def memory_verdict(plan) -> str:
    """The memory line in GiB as every table prints sizes, the HBM's datasheet GB beside its GiB (the CLI
    contract's unit convention), components in words."""
    from k3sim.output import words

    GiB, GB = 2 ** 30, 1e9
    parts = ", ".join(f"{words(r.component)} {r.bytes / GiB:.1f}" for r in plan.breakdown)
    total, hbm = plan.per_gpu_bytes["total"], plan.hbm_bytes
    if plan.fits:
        return (f"fits: pipeline stage {plan.worst_stage} uses {total / GiB:.1f} GiB of {hbm / GiB:.1f} GiB = "
                f"{hbm / GB:.1f} GB per GPU ({parts} GiB)")
    return (f"does not fit: pipeline stage {plan.worst_stage} needs {total / GiB:.1f} GiB per GPU ({parts} GiB) > "
            f"{hbm / GiB:.1f} GiB = {hbm / GB:.1f} GB HBM of {plan.hardware}; raise pp, ep, dp (ZeRO shards optimizer "
            f"states) or cp")


ASSUMPTIONS = [
    {"assumption": "rank order tp-cp-ep-dp-pp; EP folded over the stage's tp*cp*dp ranks with expert-TP 1",
     "source": "Megatron-Core parallel_state default order"},
    {"assumption": "sequence parallelism: 1 all-gather + 1 reduce-scatter per sublayer (2 per layer), "
                   "forward, backward and recompute; not overlapped unless tp_overlap > 0",
     "source": "Korthikanti et al. MLSys'23; MISSION sec. 3"},
    {"assumption": "EP dispatch/combine in the latent width as DeepEP-class normal kernels (a token crosses the "
                   "network once per destination node, then NVLink; node-limited routing where the model has it; "
                   "FP8 dispatch under training.precision fp8, BF16 combine), the backward the same two reversed, "
                   "the recompute the forward's again; hidden only where the pipeline schedule pairs a forward and "
                   "a backward chunk (interleaved 1F1B + 1 warm-up, DualPipe), or by an explicit ep_overlap",
     "source": "k3sim.comm.ep (DeepEP V1 tables, H800); LatentMoE (MISSION sec. 4); k3sim.training.overlap "
               "(DeepSeek-V3 sec. 3.2; Kimi K2 sec. 2.4.2; Megatron-Core combined_1f1b)"},
    {"assumption": "backward of the routed-expert GEMMs = 2x forward (input + weight gradients) for the "
                   "imbalance term", "source": "GEMM FLOP count (dgrad + wgrad)"},
    {"assumption": "CP adds, beyond the local tokens' own attention (in the layer costs): MLA attention against "
                   "the other ranks' keys, the scheme's own compute (KCP pre-process and fold, latent "
                   "up-projection) and its exposed communication",
     "source": "k3sim.cp (KCP: fla PR #691; MLA all-gather KV: torchtitan kimi_k3)"},
    {"assumption": "PP sends overlap in steady state; 2 (p v - 1) hops exposed on fill and drain",
     "source": "modelling choice"},
    {"assumption": "ZeRO-1 grad reduce-scatter overlaps the last micro-batch's backward, param all-gather the "
                   "first micro-batch's forward", "source": "Megatron overlap_grad_reduce / overlap_param_gather"},
    {"assumption": "gradients reduced in fp32 (4 B), parameters gathered in bf16 (2 B)",
     "source": "k3sim.memory.plan GRAD_BYTES / WEIGHT_BYTES (Megatron distributed optimizer)"},
    {"assumption": "MFU = model FLOP per token (6 x active params + 3 H S (d_qk + d_v) per causal MLA layer + 3 x "
                   "KDA chunkwise work) x tokens / (step time x GPUs x bf16 peak); the bf16 peak under "
                   "training.precision fp8 too, so MFU and HFU compare across precisions and FP8's gain shows "
                   "as a higher MFU (convention); GQA / SWA attention and the GDN, Mamba2, Mamba and lightning "
                   "recurrences are not in that model count yet (k3sim.memory.flops counts MLA and KDA), so MFU "
                   "undercounts them where HFU counts their kernels",
     "source": "Megatron-LM num_floating_point_operations (megatron/training/training.py); PaLM appendix B; "
               "k3sim.memory.flops"},
    {"assumption": "HFU = hardware FLOP (GEMMs x 3, the attention and chunk kernels' own counts: FlashAttention "
                   "3.5 x, V padded to the QK dim, KDA / GDN / Mamba2 chunk padding; the recomputed forward under "
                   "activation checkpointing) / (step time x GPUs x bf16 peak)",
     "source": "k3sim.kernels.ops registry FLOP formulas; Megatron's recompute adds one forward"},
]
