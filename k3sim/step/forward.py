"""`forward_step`: one forward of a step's token work through every pipeline stage, per GPU.

Composition, not a new fit: every kernel's time comes from the calibrated predictor (`Timer`), summed
in launch order along the critical path of one stage (a serving step is one CUDA graph per stage: kernels
run back to back), with two overlaps the K3 design makes explicit (MISSION sec. 3, 4): the sharded
latent all-gather hides behind the shared experts (exposed = max(0, t_gather - t_shared)) and Block
AttnRes's decode reads run on a side stream. Stages hand the hidden state (and the AttnRes block
representatives produced since the last hand-off) to the next stage by send/recv.

Two-batch overlap (`layout.tbo`; docs/sources.md "Deployed serving": DeepSeek's inference
system, SGLang's TBO): the batch is split into two micro-batches, every layer's calls are timed at the
half batches (a memory-bound decode streams the weights twice: the price of the overlap, kept), and the
stage's layers are list-scheduled on two resources, the compute stream and the EP all-to-all, in the
order SGLang's stage executor runs them (`sgl-project/sglang`, python/sglang/srt/operations.py
`execute_overlapped_operations` and operations_strategy.py `_compute_moe_deepseek_blog_prefill/_decode`):
`TBO_VARIANTS`. The TP all-reduces and every other collective stay on the compute stream (they are
kernels of the stream in SGLang too); only the EP dispatch/combine leave it. Compute that runs while an
all-to-all holding SMs is in flight gets (num_sms - held) / num_sms of the GPU (`comm_sm_fraction`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from k3sim.configs.model import ModelConfig
from k3sim.kernels.ops import OPS
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call, StepComponent, Timer
from k3sim.step.layers import (embedding_calls, layer_calls, layer_signature, lm_head_calls,
                               routed_expert_shape)
from k3sim.step.layout import StepLayout
from k3sim.step.mixers import CORE, CORE_CATEGORY, PROXY_NOTES

# Where a component's time goes, for the limiter (what bounds the step): every mixer kind's core components
# ("KDA state", "GDN prefill", "GQA KV cache", ...: `step.mixers.CORE_CATEGORY`), the routed experts, the rest by op.
CATEGORY = {
    "routed_experts": "routed-expert weights", **CORE_CATEGORY,
    "tbo_comm_sms": "communication",  # compute slowed by the SMs an overlapped all-to-all holds
}
# Registry kinds that are communication: collectives (alpha-beta over wire bytes) and the EP all-to-all
# kernels (k3sim.comm.ep, kind "ep").
COMM_KINDS = ("collective", "ep")


def is_communication(op: str) -> bool:
    """The op's registry kind is a communication kind (an op the registry lacks is not)."""
    spec = OPS.get(op)
    return spec is not None and spec.kind in COMM_KINDS


def category(component: str, op: str) -> str:
    for prefix, cat in CATEGORY.items():
        if component.startswith(prefix):
            return cat
    if is_communication(op):
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
        note = PROXY_NOTES.get(c.component)
        if note:  # a kind without its own measured kernel: the op it borrows (step.mixers)
            r.detail += f"; {note}"
        if c.overlap_with:
            cover = sum(x.seconds for x in rows if x.component.startswith(c.overlap_with))
            if cover > 0:
                r.detail += f"; overlapped with {c.overlap_with} ({cover:.3g} s)"
                r.seconds = max(0.0, r.seconds - cover)
        if c.hidden:
            r.detail += "; off the critical path (side stream)"
    return rows


@dataclass(frozen=True)
class _Block:
    """Calls with their rows, and the communication seconds they take before any overlap (s)."""

    calls: list[Call]
    rows: list[StepComponent]
    comm_raw_s: float


def _evaluate(timer: Timer, calls: list[Call], stage: int) -> _Block:
    rows = _eval_calls(timer, calls, stage)
    raw = sum(timer.row(c, stage).seconds if c.overlap_with else r.seconds
              for c, r in zip(calls, rows) if is_communication(r.op))
    return _Block(calls, rows, raw)


def expert_kernel_candidates(model: ModelConfig, layout: StepLayout) -> list[str]:
    if layout.expert_kernel != "auto":
        return [layout.expert_kernel]
    if model.moe is None:
        return ["grouped_bf16"]
    fmt = model.moe.routed_weight_format
    if fmt == "mxfp4":
        return ["mxfp4_token", "grouped_fp8", "grouped_bf16"]
    if fmt == "fp8":
        return ["grouped_fp8", "deepgemm_fp8", "grouped_bf16"]
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


@dataclass
class _Ctx:
    """What every stage of one `forward_step` shares; `memo` holds layer blocks by (batch tag, signature)."""

    model: ModelConfig
    hw: Any
    layout: StepLayout
    batch: Batch
    timer: Timer
    kernel: str
    num_stages: int
    memo: dict[tuple, _Block] = field(default_factory=dict)

    def layer(self, i: int, batch: Batch, tag: str, stage: int) -> _Block:
        key = (tag, layer_signature(self.model, i))
        if key not in self.memo:
            self.memo[key] = _evaluate(self.timer, layer_calls(self.model, i, self.layout, batch, self.kernel), stage)
        return self.memo[key]

    def stage_end(self, stage: int, layers: list[int]) -> _Block:
        """The LM head on the last stage, the hand-off to the next stage elsewhere (full batch)."""
        if stage == self.num_stages - 1:
            calls = lm_head_calls(self.model, self.layout, self.batch)
        else:
            calls = [handoff_call(self.model, self.layout, self.batch, layers)]
        return _evaluate(self.timer, calls, stage)


def forward_step(model: ModelConfig, hw: Any, layout: StepLayout, batch: Batch,
                 kernel_time: Callable | None = None, *, timer: Timer | None = None) -> StepResult:
    """Time of one step of `batch` (per attention-DP rank) on `layout`: stage by stage, summed.

    extras: "comm_exposed_s" / "comm_hidden_s", the communication seconds (collectives and EP all-to-all)
    on / off the critical path, summed over the stages as `seconds` is (hidden + exposed = all the
    communication the step's calls take); with two-batch overlap "tbo" (variant, micro-batch tokens, per
    stage makespan and SM cost). An "auto" dispatch dtype is resolved for `hw` here (`StepLayout.for_hardware`)."""
    layout = layout.for_hardware(hw)
    timer = timer or Timer(hw, kernel_time, layout.convention)
    halves = split_batch(batch) if layout.tbo else None
    if halves and batch.prefill and layout.ep_kernel == "auto":
        # the micro-batches of an extend batch are extend batches (SGLang's children keep the parent's
        # forward mode): normal kernels for both, even for a half that drew no prefill token
        layout = dataclasses.replace(layout, ep_kernel="normal")
    kernel = choose_expert_kernel(model, layout, halves[0] if halves else batch, timer) if model.moe else "none"
    stages = layout.stage_layers(model.num_layers)
    ctx = _Ctx(model, hw, layout, batch, timer, kernel, len(stages))
    agg: dict[tuple[int, str], StepComponent] = {}
    stage_s, comm_raw, tbo = [], 0.0, []
    for s, layers in enumerate(stages):
        rows_s, total, raw, info = _tbo_stage(ctx, s, layers, halves) if halves else _serial_stage(ctx, s, layers)
        _aggregate(agg, rows_s, s)
        stage_s.append(total)
        comm_raw += raw
        if info:
            tbo.append(info)
    rows = list(agg.values())
    busiest = max(range(len(stages)), key=lambda s: stage_s[s])
    nbytes = sum(r.bytes for r in rows if r.stage == busiest and category(r.component, r.op) != "communication")
    flop = sum(r.flop for r in rows if r.stage == busiest)
    res = StepResult(sum(stage_s), stage_s, rows, "", nbytes, flop, kernel, layout, batch)
    res.limiter = limiter(res, hw)
    if model.moe is not None:
        from k3sim.step.layers import expert_load

        load = expert_load(model, layout, batch)
        res.extras["expert_load_max_over_mean"] = load.max_over_mean
        res.extras["routed_expert_shape"] = routed_expert_shape(model, layout, batch, load=load.max_over_mean)
    proxies = {r.component: PROXY_NOTES[r.component] for r in rows if r.component in PROXY_NOTES}
    if proxies:
        res.extras["proxy_kernels"] = proxies
    exposed = sum(r.seconds for r in rows if is_communication(r.op))
    res.extras["comm_exposed_s"] = exposed
    res.extras["comm_hidden_s"] = max(0.0, comm_raw - exposed)
    if tbo:
        res.extras["tbo"] = {"variant": tbo[0]["variant"], "micro_batch_tokens": [h.tokens for h in halves],
                             "stages": tbo}
    return res


def _aggregate(agg: dict[tuple[int, str], StepComponent], rows_s: list[StepComponent], s: int) -> None:
    """One row per (stage, component): bytes, FLOP and counts summed; a hidden row adds no seconds."""
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


def _serial_stage(ctx: _Ctx, s: int, layers: list[int]) -> tuple[list[StepComponent], float, float, None]:
    """A stage run as one batch: every call back to back on the stream (communication included)."""
    blocks = [_evaluate(ctx.timer, embedding_calls(ctx.model, ctx.batch), s)] if s == 0 else []
    blocks += [ctx.layer(i, ctx.batch, "full", s) for i in layers]
    blocks.append(ctx.stage_end(s, layers))
    rows = [r for b in blocks for r in b.rows]
    total = 0.0
    for r in rows:
        total += 0.0 if r.hidden else r.seconds
    return rows, total, sum(b.comm_raw_s for b in blocks), None


# ---- two-batch overlap ------------------------------------------------------------------------------

def split_batch(batch: Batch) -> tuple[Batch, Batch] | None:
    """The two micro-batches of two-batch overlap, or None when one would be empty (nothing to split).

    Decoding sequences split in halves (the first takes the odd one); prefill tokens split at half their
    sum (the second takes the odd token), a chunk across the cut becoming two chunks, the second one's
    cached prefix grown by the first one's tokens (it attends to them: SGLang splits an extend batch by
    tokens, `two_batch_overlap.py` `split_token_index`)."""
    nd = (batch.num_decode + 1) // 2
    cut, done = batch.prefill_tokens // 2, 0
    pre_a: list[tuple[int, int]] = []
    pre_b: list[tuple[int, int]] = []
    for chunk, prefix in batch.prefill:
        take = min(chunk, max(0, cut - done))
        if take:
            pre_a.append((take, prefix))
        if chunk - take:
            pre_b.append((chunk - take, prefix + take))
        done += chunk
    a = Batch(batch.decode_contexts[:nd], tuple(pre_a), batch.tokens_per_decode)
    b = Batch(batch.decode_contexts[nd:], tuple(pre_b), batch.tokens_per_decode)
    return (a, b) if a.tokens and b.tokens else None


@dataclass(frozen=True)
class TboVariant:
    """How one layer of a micro-batch is cut into stages for the two-stream interleave.

    stages: the parts of each stage of a layer ("prep": attention up to its core kernel, "core": the core
    attention kernel to the router, "shared": the shared experts, "experts": the calls between dispatch
    and combine, "output": after the combine; "dispatch"/"combine" issue an all-to-all, "wait_dispatch"/
    "wait_combine" hold the stream until it lands). carry: parts that run at the start of the next layer's
    first stage (no stage boundary at a layer's end). delta_stages: stages micro-batch A runs before B
    starts; then A and B alternate stage by stage (SGLang's `execute_overlapped_operations`)."""

    name: str
    delta_stages: int
    stages: tuple[tuple[str, ...], ...]
    carry: tuple[str, ...]


# sgl-project/sglang python/sglang/srt/batch_overlap/operations_strategy.py (read 2026-12):
# overlap = `_compute_moe_deepseek_blog_prefill` (delta 0: A's dispatch behind B's attention, A's experts
# with B's dispatch, A's combine behind B's experts); five_stage = `_compute_moe_deepseek_blog_decode`
# (delta 2, attention split in two: DeepSeek's five-stage decode pipeline, deployed-systems.md sec. 2).
TBO_VARIANTS = {
    "overlap": TboVariant("overlap", 0, (("prep", "core", "dispatch"), ("wait_dispatch", "experts", "combine")),
                          ("shared", "wait_combine", "output")),
    "five_stage": TboVariant("five_stage", 2, (("prep",), ("core",), ("dispatch", "shared"),
                                               ("wait_dispatch", "experts", "combine"), ("wait_combine",)),
                             ("output",)),
}


def tbo_variant(layout: StepLayout, batch: Batch) -> TboVariant:
    """The layout's TBO variant; "auto" picks as SGLang does by forward mode: five_stage for a
    decode-only batch, overlap (the prefill strategy) when the batch extends any sequence."""
    name = layout.tbo_variant
    if name == "auto":
        name = "overlap" if batch.prefill else "five_stage"
    if name not in TBO_VARIANTS:
        raise ValueError(f"tbo_variant must be one of auto, {', '.join(TBO_VARIANTS)}, got {name!r}")
    return TBO_VARIANTS[name]


@dataclass(frozen=True)
class Comm:
    """One all-to-all of a micro-batch on the communication resource: its seconds and the share of the
    SMs compute keeps while it is in flight."""

    seconds: float
    sm_fraction: float = 1.0


@dataclass(frozen=True)
class LayerParts:
    """One layer of one micro-batch as the schedule sees it: compute seconds per part, the two comms."""

    prep: float = 0.0
    core: float = 0.0
    shared: float = 0.0
    experts: float = 0.0
    output: float = 0.0
    dispatch: Comm | None = None
    combine: Comm | None = None


# Component names (prefix match) of the EP all-to-all calls (CONTRACTS: step.layers.EXPERT_SIDE), of the
# core kernels of every mixer kind (`step.mixers.CORE`: recurrent step, chunked prefill, attention; SGLang's
# `op_core`: the rest of the attention before it is `op_prepare`) and of the shared experts with their gate.
EP_DISPATCH, EP_COMBINE = "ep_dispatch", "ep_combine"
ATTENTION_CORE = CORE
SHARED_EXPERTS = ("shared_experts", "shared_expert_gate")


def layer_parts(calls: Sequence[Call], rows: Sequence[StepComponent],
                sm_fraction: Callable[[Call], float]) -> tuple[LayerParts, dict[str, int]]:
    """Cut one layer's timed calls into the schedule's parts; also where the dispatch/combine rows are.
    A layer without both all-to-alls is all compute (prep, then core from the core attention on);
    hidden rows (side stream) take no stream time."""
    live = [k for k, r in enumerate(rows) if not r.hidden]
    d = next((k for k in live if calls[k].component.startswith(EP_DISPATCH)), None)
    c = next((k for k in live if d is not None and k > d and calls[k].component.startswith(EP_COMBINE)), None)
    if c is None:
        d = None
    core = next((k for k in live if calls[k].component.startswith(ATTENTION_CORE)), 0)
    parts: dict[str, float] = defaultdict(float)
    for k in live:
        if k in (d, c):
            continue
        if d is not None and k > c:
            part = "output"
        elif d is not None and k > d:
            part = "experts"
        elif d is not None and calls[k].component.startswith(SHARED_EXPERTS):
            part = "shared"
        else:
            part = "prep" if k < core else "core"
        parts[part] += rows[k].seconds
    if d is None:
        return LayerParts(**parts), {}
    comms = {p: Comm(rows[k].seconds, sm_fraction(calls[k])) for p, k in (("dispatch", d), ("combine", c))}
    return LayerParts(**parts, **comms), {"dispatch": d, "combine": c}


def micro_batch_stages(layers: Sequence[LayerParts], variant: TboVariant) -> list[list[tuple[str, int]]]:
    """A micro-batch's stages over the stage's layers: (part, layer index) in stream order; each layer's
    carry opens the next layer's first stage and the last layer's carry is a stage of its own."""
    out: list[list[tuple[str, int]]] = []
    carry: list[tuple[str, int]] = []
    for j in range(len(layers)):
        for k, names in enumerate(variant.stages):
            out.append((carry if k == 0 else []) + [(n, j) for n in names])
        carry = [(n, j) for n in variant.carry]
    out.append(carry)
    return out


def stream_order(num_stages: int, delta: int) -> list[tuple[int, int]]:
    """(micro-batch, stage) in the order the stream runs them: A's first `delta` stages, then A and B
    alternating, then B's last `delta` (SGLang `execute_overlapped_operations`)."""
    delta = min(delta, num_stages)
    order = [(0, k) for k in range(delta)]
    for k in range(delta, num_stages):
        order += [(0, k), (1, k - delta)]
    return order + [(1, k) for k in range(num_stages - delta, num_stages)]


@dataclass
class TboSchedule:
    """The list schedule of one stage's layers: makespan, compute and communication seconds, the SM cost
    (compute stretched by overlapped all-to-alls) and each comm's exposed seconds by (micro-batch, layer,
    "dispatch"|"combine"); timeline rows (resource, micro-batch, layer, part, start s, end s)."""

    makespan_s: float = 0.0
    compute_s: float = 0.0
    sm_cost_s: float = 0.0
    comm_s: float = 0.0
    exposed_s: dict[tuple[int, int, str], float] = field(default_factory=dict)
    timeline: list[tuple[str, int, int, str, float, float]] = field(default_factory=list)

    @property
    def hidden_s(self) -> float:
        return self.comm_s - sum(self.exposed_s.values())


def tbo_schedule(layers_a: Sequence[LayerParts], layers_b: Sequence[LayerParts],
                 variant: TboVariant) -> TboSchedule:
    """List-schedule two micro-batches on two resources. The stream runs the stages in `stream_order`;
    a compute part starts when the stream is free; an all-to-all is issued where the stream reaches it
    and starts when the communication resource is free (FIFO); a wait holds the stream until its
    all-to-all has landed. Compute runs at the SM share of the all-to-all in flight, if any."""
    mbs = (layers_a, layers_b)
    stages = [micro_batch_stages(layers, variant) for layers in mbs]
    out = TboSchedule()
    t, comm_free, ptr = 0.0, 0.0, 0
    comms: list[tuple[float, float, float]] = []  # (start, end, sm_fraction), in start order
    landed: dict[tuple[int, int, str], float] = {}
    keys: list[tuple[int, int, str]] = []
    idle: list[tuple[float, float]] = []
    for mb, k in stream_order(len(stages[0]), variant.delta_stages):
        for part, j in stages[mb][k]:
            lp = mbs[mb][j]
            if part.startswith("wait_"):
                end = landed.get((mb, j, part[5:]), t)
                if end > t:
                    idle.append((t, end))
                    t = end
            elif part in ("dispatch", "combine"):
                c = getattr(lp, part)
                if c is None:
                    continue
                start = max(t, comm_free)
                comm_free = start + c.seconds
                comms.append((start, comm_free, c.sm_fraction))
                keys.append((mb, j, part))
                landed[(mb, j, part)] = comm_free
                out.comm_s += c.seconds
                out.timeline.append(("comm", mb, j, part, start, comm_free))
            else:
                work = getattr(lp, part)
                end, ptr = _run_compute(t, work, comms, ptr)
                out.compute_s += work
                out.sm_cost_s += max(0.0, (end - t) - work)  # > 0 only inside an all-to-all holding SMs
                if work:
                    out.timeline.append(("compute", mb, j, part, t, end))
                t = end
    out.makespan_s = max(t, comm_free)
    out.exposed_s = dict(zip(keys, _overlap_lengths([(a, b) for a, b, _ in comms], idle)))
    return out


def _run_compute(t: float, work: float, comms: list[tuple[float, float, float]], ptr: int) -> tuple[float, int]:
    """End of `work` seconds (at all SMs) started at t, at rate sm_fraction inside each comm interval;
    `ptr` is the first comm that may still be in flight (t only grows)."""
    while ptr < len(comms) and comms[ptr][1] <= t:
        ptr += 1
    k = ptr
    while work > 0.0:
        if k >= len(comms):
            return t + work, ptr
        a, b, f = comms[k]
        if t < a:
            run = min(work, a - t)
            t, work = t + run, work - run
            continue
        if f <= 0.0:
            raise ValueError("an all-to-all that holds every SM leaves no compute to overlap it with")
        if work <= (b - t) * f:
            return t + work / f, ptr
        work -= (b - t) * f
        t, k = b, k + 1
    return t, ptr


def _overlap_lengths(intervals: list[tuple[float, float]], idle: list[tuple[float, float]]) -> list[float]:
    """For each interval, its overlap with the union of `idle` (both sorted, each non-overlapping)."""
    out, j = [], 0
    for a, b in intervals:
        while j < len(idle) and idle[j][1] <= a:
            j += 1
        tot, k = 0.0, j
        while k < len(idle) and idle[k][0] < b:
            tot += max(0.0, min(b, idle[k][1]) - max(a, idle[k][0]))
            k += 1
        out.append(tot)
    return out


def comm_sm_fraction(call: Call, hw: Any) -> float:
    """Share of the SMs compute keeps while this all-to-all is in flight, (num_sms - held) / num_sms:
    DeepEP's normal kernels hold a fixed number of SMs (deployed-systems.md sec. 1; SGLang's prefill TBO
    gives DeepGEMM num_sms minus DeepEP's), the low-latency kernels with their receive hook none
    (`k3sim.comm.ep.comm_sms`). A call without a `kernel` parameter is NCCL's all_to_all."""
    from k3sim.comm.ep import KERNEL_CODES, comm_sms

    names = {code: name for name, code in KERNEL_CODES.items()}
    kernel = names[call.params["kernel"]] if "kernel" in call.params else "nccl"
    n = int(hw.num_sms)
    return max(0, n - comm_sms(kernel, hw)) / n


def _leading_dense(model: ModelConfig, layers: list[int]) -> int:
    """Leading layers of the stage with a dense FFN: they run on the whole batch, before the overlap
    (SGLang's deepseek_v2.py runs layers below first_k_dense_replace outside `model_forward_maybe_tbo`)."""
    kinds = model.ffn_kinds
    n = 0
    while n < len(layers) and kinds[layers[n]] == "dense":
        n += 1
    return n


def _tbo_stage(ctx: _Ctx, s: int, layers: list[int],
               halves: tuple[Batch, Batch]) -> tuple[list[StepComponent], float, float, dict | None]:
    """A stage under two-batch overlap: embedding and leading dense layers on the whole batch, the rest
    list-scheduled as two micro-batches, then the LM head or hand-off on the whole batch. Rows: both
    halves' calls, the all-to-alls at their exposed seconds, plus the SM cost (they sum to the stage)."""
    lead = _leading_dense(ctx.model, layers)
    if lead == len(layers):
        return _serial_stage(ctx, s, layers)
    pre = [_evaluate(ctx.timer, embedding_calls(ctx.model, ctx.batch), s)] if s == 0 else []
    pre += [ctx.layer(i, ctx.batch, "full", s) for i in layers[:lead]]
    post = [ctx.stage_end(s, layers)]
    blocks = [[ctx.layer(i, h, f"half{m}", s) for i in layers[lead:]] for m, h in enumerate(halves)]
    frac = lambda call: comm_sm_fraction(call, ctx.hw)  # noqa: E731
    cuts = [[layer_parts(b.calls, b.rows, frac) for b in bl] for bl in blocks]
    variant = tbo_variant(ctx.layout, ctx.batch)
    sched = tbo_schedule([p for p, _ in cuts[0]], [p for p, _ in cuts[1]], variant)
    rows = [r for b in pre for r in b.rows]
    for m in (0, 1):
        for j, (b, (_, where)) in enumerate(zip(blocks[m], cuts[m])):
            rows += _overlapped_rows(b.rows, where, sched, m, j)
    rows.append(StepComponent("tbo_comm_sms", "tbo_sm_share", 0.0, 0.0, sched.sm_cost_s, "tbo schedule", s, 1.0,
                              False, "compute stretched while an all-to-all holding SMs was in flight"))
    rows += [r for b in post for r in b.rows]
    serial = lambda bs: sum(0.0 if r.hidden else r.seconds for b in bs for r in b.rows)  # noqa: E731
    total = serial(pre) + sched.makespan_s + serial(post)
    raw = sum(b.comm_raw_s for b in pre + post + blocks[0] + blocks[1])
    info = {"variant": variant.name, "stage": s, "makespan_s": sched.makespan_s, "sm_cost_s": sched.sm_cost_s,
            "ep_comm_s": sched.comm_s, "ep_comm_hidden_s": sched.hidden_s}
    return rows, total, raw, info


def _overlapped_rows(rows: list[StepComponent], where: dict[str, int], sched: TboSchedule,
                     mb: int, layer: int) -> list[StepComponent]:
    """Copies of a micro-batch layer's rows with its all-to-alls at their exposed seconds."""
    out = list(rows)
    for part, k in where.items():
        r = rows[k]
        exposed = sched.exposed_s[(mb, layer, part)]
        out[k] = dataclasses.replace(r, seconds=exposed, detail=r.detail + (
            f"; two-batch overlap: {r.seconds - exposed:.3g} s hidden behind the other micro-batch"))
    return out


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
