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
  up-projection);
- PP: the schedule (k3sim.training.schedule: the pipeline engine, or Megatron's closed form) over the
  per-stage micro-batch costs gives the bubble; stage-to-stage sends are overlapped in steady state and
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
from k3sim.training.placement import groups, pp_hop_links
from k3sim.comm.routing import ep_imbalance
from k3sim.training.schedule import pipeline_time

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

    def layer_costs(self, tp: int, ep: int, cp: int, tokens: int, seq_len: int, glue: str = "calibrated") -> list:
        key = (tp, ep, cp, tokens, seq_len, glue)
        if key not in self._layers:
            from k3sim.step.glue import glue_for

            self._layers[key] = list(self.layer_costs_fn(self.model, self.hw, tp=tp, ep=ep, cp=cp, tokens=tokens,
                                                         seq_len=seq_len, kernel_time=self.kernel_time,
                                                         glue=glue_for(self.hw, glue)))
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

    def expert_compute(self, tp: int, ep: int, tokens: int, fold: int = 1) -> tuple[float, str]:
        """Forward seconds of the routed-expert GEMMs of one MoE layer on one rank for a micro-batch of
        `tokens` per TP group (the step package's calls, timed by its Timer): the part EP load imbalance
        stretches. `fold`: how many TP groups' tokens meet in one EP group (the step layout's attention DP)."""
        key = (tp, ep, tokens, fold)
        if key not in self._experts:
            from k3sim.step.batch import Batch
            from k3sim.step.calls import Timer
            from k3sim.step.layers import expert_calls
            from k3sim.step.layout import StepLayout

            lay = StepLayout(tp=tp, ep=ep, attention_dp=fold)
            timer = Timer(self.hw, self.kernel_time)
            rows = [timer.row(c, 0) for c in expert_calls(self.model, lay, Batch(prefill=((tokens, 0),)),
                                                          "grouped_bf16")]
            main = max(rows, key=lambda r: r.seconds) if rows else None
            self._experts[key] = (sum(r.seconds for r in rows), f"{main.op} {main.source}" if main else "none")
        return self._experts[key]

    def model_flop_per_token(self, seq_len: int) -> float:
        """Training model FLOP per token (MFU's numerator): `k3sim.memory.flops.training_flop_per_token`, the one
        count the prefix cache also uses (6 x active parameters + 3 H S (d_qk + d_v) per causal MLA layer +
        KDA's chunkwise work x 3; Megatron-LM `num_floating_point_operations`)."""
        if seq_len not in self._flop:
            from k3sim.memory.flops import training_flop_per_token

            self._flop[seq_len] = training_flop_per_token(self.model, seq_len)
        return self._flop[seq_len]

    def hardware_flop_per_token(self, seq_len: int, recompute: bool) -> float:
        """FLOP the GPUs execute per token (HFU's numerator): the GEMMs' model count (a GEMM executes what it
        is counted with) x 3, the attention kernels' own registry counts (`sdpa_causal_fwd_bwd`: FlashAttention's
        3.5 x forward, V padded to the QK dim; `chunk_kda_fwd_bwd`: padded chunks), and under full activation
        checkpointing the forward of all of it once more. Not counted: CP schemes' own extra work (KCP fold,
        latent up-projection), redundant experts, elementwise kernels."""
        key = (seq_len, bool(recompute))
        if key not in self._hw_flop:
            self._hw_flop[key] = _hardware_flop_per_token(self.model, seq_len, bool(recompute))
        return self._hw_flop[key]

    def stage_sums(self, par: Parallelism, tokens: int, seq_len: int,
                   glue: str = "calibrated") -> list[tuple[list[int], dict]]:
        """Per pipeline rank: its layers and the sums a step needs (compute of its layers, the embedding
        on the first rank and the LM head on the last; layer counts by kind), memoised per layout shape."""
        key = (par.tp, par.ep, par.cp, par.pp, par.virtual_stages, tokens, seq_len, glue)
        hit = self._stages.get(key)
        if hit is None:
            from k3sim.memory.layout import rank_layers

            costs = self.layer_costs(par.tp, par.ep, par.cp, tokens, seq_len, glue)
            by_layer = {c.layer: c for c in costs if c.kind in ("kda", "mla")}
            extra = {c.kind: c for c in costs if c.kind in ("embedding", "lm_head")}
            kinds, ffn = self.model.layer_kinds, self.model.ffn_kinds
            hit = []
            for r, layers in enumerate(rank_layers(self.model, par)):
                agg = {"forward_s": 0.0, "backward_s": 0.0, "layer_forward_s": 0.0, "moe": 0, "kda": 0, "mla": 0,
                       "moe_layer_compute_s": []}
                for i in layers:
                    c = by_layer[i]
                    agg["forward_s"] += c.forward_s
                    agg["layer_forward_s"] += c.forward_s
                    agg["backward_s"] += c.backward_input_s + c.backward_weight_s
                    agg[kinds[i]] += 1
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

    def rank_params(self, par: Parallelism) -> list[tuple[int, int]]:
        """(non-expert, routed-expert) parameters held by each pipeline rank before TP/EP sharding."""
        key = (par.pp, par.virtual_stages)
        if key not in self._rank_params:
            from k3sim.memory.layout import rank_layers
            from k3sim.memory.params import ROUTED
            from k3sim.memory.plan import _rank_params

            out = []
            for r, layers in enumerate(rank_layers(self.model, par)):
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

    @classmethod
    def of(cls, par: Parallelism, seq_len: int, size: int, count: int, checkpointing: bool) -> "_MicroBatch":
        tokens = size * seq_len
        tokens_rank = tokens // par.cp
        return cls(seq_len, size, count, 1 if checkpointing else 0, tokens, tokens_rank, tokens_rank / par.tp)


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
    """EP per MoE layer forward: dispatch + combine of the latent tokens, stretched by the routing imbalance,
    which also stretches the routed-expert GEMMs; MoonEP's redundant experts add their weights' prefetch.
    Apart from the stages because it depends on the layout only, not on which layers a stage holds."""
    moe, coll = model.moe, ctx.coll
    ep = _EpCost()
    # Training folds EP over the stage's ranks: an EP group wider than TP gathers the tokens of ep/tp TP
    # groups (data-parallel or CP ranks), so each rank's experts see tokens x k / tp pairs. The step
    # package's layer costs assume the tokens of one TP group (k / ep pairs each): add the difference.
    fold = max(1, par.ep // par.tp)
    if moe is not None and fold > 1:
        e_true, _ = ctx.expert_compute(par.tp, par.ep, mb.tokens_rank, fold)
        e_step, _ = ctx.expert_compute(par.tp, par.ep, mb.tokens_rank, 1)
        ep.fold_fix_fwd_s = e_true - e_step
    if moe is None or par.ep <= 1:
        return ep
    width = moe.latent_width or model.hidden_size
    a2a_bytes = mb.sp_tokens * moe.num_active_experts * width * BF16
    t_a2a, src_a2a, link_ep = coll.time("all_to_all", a2a_bytes, g["ep"])
    im = ep_imbalance(moe.num_routed_experts, par.ep, moe.num_active_experts,
                      int(round(mb.sp_tokens * par.ep)), skew=opts.routing_skew,
                      redundant_per_rank=opts.redundant_experts, seed=opts.seed)
    imb = ep.imbalance = im.max_over_mean
    ep.layer_fwd_s = 2 * t_a2a * imb * (1 - (opts.ep_overlap or 0.0))
    ep.expert_fwd_s, src_exp = ctx.expert_compute(par.tp, par.ep, mb.tokens_rank, fold)
    ep.imbalance_source = f"{im.describe()}; routed-expert GEMMs: {src_exp}"
    ep.source = f"2 all_to_all {src_a2a} over ep={par.ep} ({link_ep}) x max/mean {imb:.3f} ({im.describe()})"
    if opts.redundant_experts:
        from k3sim.memory.params import routed_expert_params

        # bf16 weights of the redundant experts, fetched from their home ranks once per micro-batch
        wbytes = opts.redundant_experts * routed_expert_params(model) * BF16
        ep.prefetch_s, src_pf, _ = coll.time("all_to_all", wbytes, g["ep"])
        ep.source += f"; MoonEP prefetch {wbytes:.3g} B/layer ({src_pf}), overlapped with the layer"
    return ep


def _stage_compute(ctx: TrainingContext, par: Parallelism, mb: _MicroBatch, glue: str, tp_layer_fwd: float,
                   ep: _EpCost, cp: dict) -> list[StageCost]:
    """Per pipeline rank, one micro-batch: the compute of its layers (with the EP fold correction and the
    recompute) and the exposed TP, EP and CP seconds of those layers, forward and backward apart, because the
    pipeline schedule takes each stage's forward and backward separately."""
    recompute, fold_fix_f = mb.recompute, ep.fold_fix_fwd_s
    stages = []
    for r, (layers, agg) in enumerate(ctx.stage_sums(par, mb.tokens, mb.seq_len, glue)):
        F, B, Rf = agg["forward_s"], agg["backward_s"], agg["layer_forward_s"]
        n, n_moe = len(layers), agg["moe"]
        F += fold_fix_f * n_moe
        B += 2 * fold_fix_f * n_moe            # input grad (transposed GEMM) + weight grad, each ~ the forward
        comm_f = {k: 0.0 for k in COMM_KINDS}
        comm_b = {k: 0.0 for k in COMM_KINDS}
        comm_f["tp"] = n * tp_layer_fwd
        comm_b["tp"] = n * tp_layer_fwd * (1 + recompute)
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
            comm_f["cp"] += agg[kind] * f_cp
            comm_b["cp"] += agg[kind] * (b_cp + recompute * f_cp)
        R = recompute * (Rf + fold_fix_f * n_moe)
        st = StageCost(r, [i + 1 for i in layers], F, B, R,
                       {k: comm_f[k] + comm_b[k] for k in COMM_KINDS}, imb_extra)
        st.comm_fwd = sum(comm_f.values())
        st.comm_bwd = sum(comm_b.values())
        stages.append(st)
    return stages


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


def _dp_exposure(ctx: TrainingContext, par: Parallelism, g: dict, stages: list[StageCost], m: int) -> tuple[float, str]:
    """Exposed DP seconds and their source, on the stage where they are largest: the gradient reduction
    (all-reduce without ZeRO, reduce-scatter with it) and the parameter all-gather, each beyond the
    micro-batch backward / forward it overlaps (Megatron overlap_grad_reduce / overlap_param_gather); ZeRO-3
    gathers the weights again for every micro-batch's forward and backward."""
    from k3sim.memory.plan import GRAD_BYTES, WEIGHT_BYTES

    coll, zero = ctx.coll, par.zero_stage
    gd, ge = g["dp"], g["edp"]
    dp_exposed, dp_src = 0.0, "none"
    for st, (dense, routed) in zip(stages, ctx.rank_params(par)):
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


def _optimizer_step(ctx: TrainingContext, par: Parallelism, g: dict) -> tuple[float, str]:
    """Seconds of the optimizer update on the slowest pipeline rank and their source: it streams the rank's
    shard of weights, grads and Adam states through HBM once (ZeRO >= 1 shards them over DP)."""
    from k3sim.memory.plan import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES

    zero = par.zero_stage
    gd, ge = g["dp"], g["edp"]
    opt_s, opt_src = 0.0, "none"
    for dense, routed in ctx.rank_params(par):
        dense_rank = dense / par.tp
        routed_rank = routed / par.ep
        shard = (dense_rank / (gd.gpus if zero >= 1 else 1) + routed_rank / (ge.gpus if zero >= 1 else 1))
        t_opt, src_o = ctx.coll.kernel("hbm_copy", bytes=max(1, shard * (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES)))
        if t_opt >= opt_s:
            opt_s, opt_src = t_opt, f"hbm_copy of the optimizer shard's weights, grads, Adam states ({src_o})"
    return opt_s, opt_src


def _breakdown(m: int, crit: StageCost, tp_src: str, ep: _EpCost, cp: dict, pipe, pp_src: str,
               dp: tuple[float, str], opt: tuple[float, str]) -> list[Row]:
    """The step's rows, the per-stage ones from the critical (slowest) pipeline rank times the micro-batches,
    in the order a reader adds them up: compute, EP imbalance, exposed TP / EP / CP, bubble, PP sends, DP,
    optimizer. Zero rows are dropped except the bubble and the optimizer, which a reader looks for."""
    (dp_exposed, dp_src), (opt_s, opt_src) = dp, opt
    breakdown = [
        Row("compute: forward", m * crit.forward_s, "k3sim.step.training_layer_costs (calibrated kernels)"),
        Row("compute: backward", m * crit.backward_s, "k3sim.step.training_layer_costs (calibrated kernels)"),
        Row("compute: recompute (activation checkpointing)", m * crit.recompute_s, "forward again before backward"),
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
                 workspace_fraction: float, source: str | None) -> tuple[Any, bool, str]:
    """(plan, fits, verdict) from `k3sim.memory.plan.train_plan`: memory is never re-derived here."""
    from k3sim.memory.plan import train_plan

    memory = train_plan(model, hw, par, mb.seq_len, micro_batch_size=mb.size,
                        activation_checkpointing=activation_checkpointing, num_micro_batches=mb.count,
                        workspace_fraction=workspace_fraction, source=source, allow_overflow=True)
    return memory, memory.fits, memory_verdict(memory)


def _hardware_flop_per_token(model, seq_len: int, recompute: bool) -> float:
    """See `TrainingContext.hardware_flop_per_token`: whole model, all ranks, per token of `seq_len` sequences."""
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
    return FWD_BWD_FACTOR * gemm + fwd_bwd + (gemm + fwd if recompute else 0.0)


def train_step(model, hw, par: Parallelism, *, seq_len: int, micro_batch_size: int = 1,
               num_micro_batches: int | None = None, activation_checkpointing: bool = True,
               workspace_fraction: float = 0.10, options: TrainOptions | None = None,
               kernel_time: Callable | None = None, layer_costs: Callable | None = None,
               context: TrainingContext | None = None, source: str | None = None,
               with_memory: bool = True) -> TrainStepResult:
    """Step time, breakdown, tokens/s, MFU and the memory plan of one training layout, built from the parts the
    module docstring lists, in its order: per-layer TP, EP and CP; the stages; the PP schedule over them with
    its sends; DP and the optimizer; the breakdown of the slowest stage."""
    opts = options or TrainOptions()   # a pydantic schema: its ranges were checked when it was built
    m = _check_step(model, hw, par, seq_len, num_micro_batches, opts, source)
    ctx = context or TrainingContext(model, hw, kernel_time, layer_costs)
    g = groups(par)
    mb = _MicroBatch.of(par, seq_len, micro_batch_size, m, activation_checkpointing)
    tp_layer_fwd, tp_src = _tp_comm(ctx.coll, g, par, mb, model.hidden_size, opts)
    ep = _ep_comm(ctx, model, par, g, mb, opts)
    cp = ctx.cp_overhead(par.tp, par.cp, seq_len, opts, source) if par.cp > 1 else {}  # per sequence
    stages = _stage_compute(ctx, par, mb, opts.moe_glue, tp_layer_fwd, ep, cp)
    t_hop, pp_src = _pp_sends(model, hw, par, ctx.coll, mb)
    pipe = pipeline_time([s.fwd_total for s in stages], [s.bwd_total for s in stages],
                         virtual_stages=par.virtual_stages, micro_batches=m, send_s=t_hop,
                         use_engine=opts.use_pipeline_engine)
    crit = max(stages, key=lambda s: s.per_micro_batch_s)
    dp, opt = _dp_exposure(ctx, par, g, stages, m), _optimizer_step(ctx, par, g)
    step = pipe.step_time_s + dp[0] + opt[0]
    breakdown = _breakdown(m, crit, tp_src, ep, cp, pipe, pp_src, dp, opt)
    exposed, compute = _totals(breakdown)
    tokens_step = m * micro_batch_size * seq_len * par.dp
    flop = tokens_step * ctx.model_flop_per_token(seq_len)
    hw_flop = tokens_step * ctx.hardware_flop_per_token(seq_len, bool(mb.recompute))
    peak = float(hw.peak_flops_per_s.get("bf16", 0.0)) * par.gpus
    memory, fits, verdict = (_memory_plan(model, hw, par, mb, activation_checkpointing, workspace_fraction, source)
                             if with_memory else (None, True, ""))
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
        assumptions=ASSUMPTIONS + [glue_assumption(hw, opts.moe_glue)],
        hardware_flop_per_step=hw_flop, hfu=hw_flop / (step * peak) if peak else 0.0)


def glue_assumption(hw, mode: str = "calibrated") -> dict:
    """The training glue the layer costs used (`k3sim.step.glue`), as an assumption row."""
    from k3sim.step.glue import glue_for, load_glue

    g = glue_for(hw, mode)
    what = "unmeasured kernels (MoE permute/combine, short conv; the gated norm stays a plain proxy): HBM-copy time"
    if mode == "proxy":
        cal = load_glue(hw)
        return {"assumption": f"{what} of their bytes (training.moe_glue: proxy, a fused-permute stack)",
                "source": f"modelling choice (not measured); the measured unfused glue is x {cal.fwd:.1f} forward, "
                          f"x {cal.bwd:.1f} backward ({cal.source}): reports/training"}
    return {"assumption": f"{what} of their bytes x {g.fwd:.1f} forward, x {g.bwd:.1f} backward (unfused routing glue)",
            "source": f"{g.source}; held-out check reports/training/README.md"}

def memory_verdict(plan) -> str:
    GB = 1e9
    parts = ", ".join(f"{r.component} {r.bytes / GB:.1f}" for r in plan.breakdown)
    total = plan.per_gpu_bytes["total"]
    if plan.fits:
        return (f"fits: pipeline stage {plan.worst_stage} uses {total / GB:.1f} GB of {plan.hbm_bytes / GB:.1f} GB "
                f"per GPU ({parts} GB)")
    return (f"does not fit: pipeline stage {plan.worst_stage} needs {total / GB:.1f} GB per GPU ({parts} GB) > "
            f"{plan.hbm_bytes / GB:.1f} GB HBM of {plan.hardware}; raise pp, ep, dp (ZeRO shards optimizer states) "
            f"or cp")


ASSUMPTIONS = [
    {"assumption": "rank order tp-cp-ep-dp-pp; EP folded over the stage's tp*cp*dp ranks with expert-TP 1",
     "source": "Megatron-Core parallel_state default order"},
    {"assumption": "sequence parallelism: 1 all-gather + 1 reduce-scatter per sublayer (2 per layer), "
                   "forward, backward and recompute; not overlapped unless tp_overlap > 0",
     "source": "Korthikanti et al. MLSys'23; MISSION sec. 3"},
    {"assumption": "EP dispatch/combine in the latent width, bf16, per token x top-k (no dedup of same-rank picks)",
     "source": "modelling choice; LatentMoE (MISSION sec. 4)"},
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
                   "KDA chunkwise work) x tokens / (step time x GPUs x bf16 peak)",
     "source": "Megatron-LM num_floating_point_operations (megatron/training/training.py); PaLM appendix B; "
               "k3sim.memory.flops"},
    {"assumption": "HFU = hardware FLOP (GEMMs x 3, the attention kernels' own counts: FlashAttention 3.5 x, V "
                   "padded to the QK dim, KDA chunk padding; the recomputed forward under activation "
                   "checkpointing) / (step time x GPUs x bf16 peak)",
     "source": "k3sim.kernels.ops registry FLOP formulas; Megatron's recompute adds one forward"},
]
