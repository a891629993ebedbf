"""`forward_step`: one forward of a step's token work through every pipeline stage, per GPU.

Composition, not a new fit: every kernel's time comes from the calibrated predictor (`Timer`), summed
in launch order along the critical path of one stage (a serving step is one CUDA graph per stage: kernels
run back to back), with two overlaps the K3 design makes explicit (MISSION sec. 3, 4): the sharded
latent all-gather hides behind the shared experts (exposed = max(0, t_gather - t_shared)) and Block
AttnRes's decode reads run on a side stream. Stages hand the hidden state (and the AttnRes block
representatives produced since the last hand-off) to the next stage by send/recv.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from k3sim.configs.model import ModelConfig
from k3sim.kernels.ops import COLLECTIVE_OPS
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call, StepComponent, Timer
from k3sim.step.layers import (embedding_calls, layer_calls, layer_signature, lm_head_calls,
                               routed_expert_shape)
from k3sim.step.layout import StepLayout

# Where a component's time goes, for the limiter (what bounds the step).
CATEGORY = {
    "routed_experts": "routed-expert weights", "kda_recurrent": "KDA state", "kda_chunk_prefill": "KDA prefill",
    "mla_decode_attention": "MLA KV cache", "mla_prefill_attention": "MLA prefill attention",
}


def category(component: str, op: str) -> str:
    for prefix, cat in CATEGORY.items():
        if component.startswith(prefix):
            return cat
    if op in COLLECTIVE_OPS:
        return "communication"
    if op.startswith("gemm"):
        return "dense weights (GEMMs)"
    return "small kernels"


@dataclass
class StepResult:
    seconds: float  # one token's path through all stages, s
    stage_seconds: list[float]
    rows: list[StepComponent]  # aggregated over layers: one row per (stage, component)
    limiter: str
    bytes_per_gpu: float  # HBM bytes per GPU per step (the busiest stage)
    flop_per_gpu: float
    expert_kernel: str
    layout: StepLayout
    batch: Batch
    extras: dict[str, Any] = field(default_factory=dict)

    def by_component(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for r in self.rows:
            out[r.component] += r.seconds
        return dict(out)


def _eval_calls(timer: Timer, calls: list[Call], stage: int) -> list[StepComponent]:
    rows = [timer.row(c, stage) for c in calls]
    # overlap: a call hidden behind named work of the same layer
    for c, r in zip(calls, rows):
        if c.overlap_with:
            cover = sum(x.seconds for x in rows if x.component.startswith(c.overlap_with))
            if cover > 0:
                r.detail += f"; overlapped with {c.overlap_with} ({cover:.3g} s)"
                r.seconds = max(0.0, r.seconds - cover)
        if c.hidden:
            r.detail += "; off the critical path (side stream)"
    return rows


def expert_kernel_candidates(model: ModelConfig, layout: StepLayout) -> list[str]:
    if layout.expert_kernel != "auto":
        return [layout.expert_kernel]
    if model.moe is None:
        return ["grouped_bf16"]
    fmt = model.moe.routed_weight_format
    if fmt == "mxfp4":
        return ["mxfp4_token", "grouped_fp8", "grouped_bf16"]
    if fmt == "fp8":
        return ["grouped_fp8", "grouped_bf16"]
    return ["grouped_bf16"]


def expert_kernel_known(model: ModelConfig, layout: StepLayout, batch: Batch, kernel: str, timer: Timer) -> bool:
    """The kernel's expert GEMM ops are in the registry (its glue kernels may still be proxies)."""
    from k3sim.step.layers import expert_calls

    return all(timer.known(c.op) for c in expert_calls(model, layout, batch, kernel)
               if c.op.startswith(("moe_grouped", "moe_mxfp4", "moe_ffn")))


def choose_expert_kernel(model: ModelConfig, layout: StepLayout, batch: Batch, timer: Timer) -> str:
    """The cheapest routed-expert kernel the profile has (registered ops only), for this batch."""
    from k3sim.step.layers import expert_calls

    cands = [k for k in expert_kernel_candidates(model, layout) if expert_kernel_known(model, layout, batch, k, timer)]
    if not cands:
        cands = ["grouped_bf16"]
    if len(cands) == 1 or model.moe is None:
        return cands[0]
    cost = {k: sum(timer.row(c, 0).seconds for c in expert_calls(model, layout, batch, k)) for k in cands}
    return min(cost, key=cost.get)


def forward_step(model: ModelConfig, hw: Any, layout: StepLayout, batch: Batch,
                 kernel_time: Callable | None = None, *, timer: Timer | None = None) -> StepResult:
    """Time of one step of `batch` (per attention-DP rank) on `layout`: stage by stage, summed."""
    timer = timer or Timer(hw, kernel_time, layout.convention)
    kernel = choose_expert_kernel(model, layout, batch, timer) if model.moe else "none"
    stages = layout.stage_layers(model.num_layers)
    memo: dict[tuple, list[StepComponent]] = {}
    agg: dict[tuple[int, str], StepComponent] = {}
    stage_s = []
    for s, layers in enumerate(stages):
        total = 0.0
        rows_s: list[StepComponent] = []
        if s == 0:
            rows_s += _eval_calls(timer, embedding_calls(model, batch), s)
        for i in layers:
            sig = layer_signature(model, i)
            if sig not in memo:
                memo[sig] = _eval_calls(timer, layer_calls(model, i, layout, batch, kernel), s)
            rows_s += memo[sig]
        if s == len(stages) - 1:
            rows_s += _eval_calls(timer, lm_head_calls(model, layout, batch), s)
        else:
            rows_s += _eval_calls(timer, [handoff_call(model, layout, batch, layers)], s)
        for r in rows_s:
            key = (s, r.component)
            if key in agg:
                a = agg[key]
                a.bytes += r.bytes
                a.flop += r.flop
                a.seconds += 0.0 if r.hidden else r.seconds
                a.count += r.count
            else:
                agg[key] = StepComponent(r.component, r.op, r.bytes, r.flop, 0.0 if r.hidden else r.seconds,
                                         r.source, s, r.count, r.hidden, r.detail)
            total += 0.0 if r.hidden else r.seconds
        stage_s.append(total)
    rows = list(agg.values())
    busiest = max(range(len(stages)), key=lambda s: stage_s[s])
    nbytes = sum(r.bytes for r in rows if r.stage == busiest and category(r.component, r.op) != "communication")
    flop = sum(r.flop for r in rows if r.stage == busiest)
    res = StepResult(sum(stage_s), stage_s, rows, "", nbytes, flop, kernel, layout, batch)
    res.limiter = limiter(res, hw)
    if model.moe is not None:
        res.extras["routed_expert_shape"] = routed_expert_shape(model, layout, batch)
    return res


def handoff_call(model: ModelConfig, layout: StepLayout, batch: Batch, layers: list[int]) -> Call:
    """Stage hand-off: the hidden state of every token, plus the AttnRes block representatives this stage
    finished (cache-based P2P sends only newly produced blocks, MISSION sec. 3)."""
    d, M = model.hidden_size, batch.tokens
    blocks = 0
    if model.attn_res_block_size and layers:
        b = model.attn_res_block_size
        blocks = (layers[-1] + 1) // b - layers[0] // b
    nbytes = M * d * BF16 * (1 + blocks) / layout.tp  # sequence-split over the TP ranks of the stage
    params = {"bytes": max(1, int(nbytes)), "gpus": 2}
    if layout.stage_gpus >= layout.gpus_per_node:  # a stage fills its node(s): the hand-off crosses the NICs
        params["gpus_per_node"] = 1
    return Call("pp_handoff", "send_recv", params)


def limiter(res: StepResult, hw: Any) -> str:
    """What bounds the step: the category with the largest share of the busiest stage's time, and whether
    the stage's bytes or FLOP dominate at the datasheet roofline."""
    from k3sim.configs.profiles import peak_flops

    busiest = max(range(len(res.stage_seconds)), key=lambda s: res.stage_seconds[s])
    share: dict[str, float] = defaultdict(float)
    for r in res.rows:
        if r.stage == busiest:
            share[category(r.component, r.op)] += r.seconds
    total = sum(share.values()) or 1.0
    top = max(share, key=share.get)
    t_mem = res.bytes_per_gpu / float(hw.hbm_bandwidth_bytes_per_s)
    t_flop = res.flop_per_gpu / peak_flops(hw, "bf16")
    bound = "memory-bound" if t_mem >= t_flop else "compute-bound"
    return f"{top} ({share[top] / total:.0%} of the busiest stage; step {bound} at the roofline)"
