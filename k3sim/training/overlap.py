"""EP all-to-all overlap computed from the pipeline schedule: which all-to-all a paired chunk hides, and how much.

The rule (`training.ep_overlap` None, the default; a float there stays an override of the share hidden):
- A forward chunk of one micro-batch and a backward chunk of another that the schedule runs together as one
  overlapped F&B op hide each one's EP dispatch / combine under the other's compute, as far as that compute
  reaches: the pair takes `k3sim.pipeline.placement.paired_seconds` (DeepSeek-V3, arXiv 2412.19437 sec. 3.2.1,
  fig. 4), and what it saves against the two chunks run one after the other is the all-to-all it hid, net of
  the SMs the all-to-all kernel holds (DeepEP's normal kernels: 20, `k3sim.comm.ep.comm_sms`).
- Which chunks pair is the schedule's (`k3sim.pipeline.schedules`):
  - interleaved 1F1B: Kimi K2's "EP communication overlap with interleaved 1F1B: by increasing the number of
    warm-up micro-batches, we can overlap EP all-to-all communication with computation" (arXiv 2507.20534 sec.
    2.4.2, fig. 7 "VPP + 1 warmup"), which is Megatron-Core's `overlap_moe_expert_parallel_comm`
    (`combined_1f1b.py`: one more warm-up chunk, every steady-state forward merged with the backward beside
    it; warm-up forwards and cool-down backwards run alone, their all-to-all exposed);
  - no pipeline (pp = 1): Megatron's `combined_1f1b_schedule_for_no_pipelining`: the first forward alone,
    then forward i+1 with backward i, the last backward alone;
  - DualPipe / DualPipeV: their own F&B pairs (deepseek-ai/DualPipe `_forward_backward_chunk`);
  - 1F1B with pp > 1 and ZB-H1: none. Megatron-Core refuses the merged F&B with PP > 1 and no virtual stages
    (NeMo Megatron-Bridge: "if PP > 1, set virtual_pipeline_model_parallel_size"); ZB-H1 has no published
    EP overlap. Their all-to-alls stay exposed.
- What is hidden is counted per pipeline rank over the whole step and spread over its micro-batches, so the
  step's rows keep adding up: the rank's exposed EP seconds per micro-batch drop by it, and the engine (or
  the closed form) times the schedule with the pairs' own durations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PAIRED_SOURCES = {
    "interleaved-1f1b": "interleaved 1F1B + 1 warm-up, steady-state F&B merged (Kimi K2 arXiv 2507.20534 sec. 2.4.2; "
                        "Megatron-Core combined_1f1b, overlap_moe_expert_parallel_comm)",
    "no-pipeline": "forward i+1 merged with backward i (Megatron-Core combined_1f1b_schedule_for_no_pipelining)",
    "dualpipe": "DualPipe F&B pairs (DeepSeek-V3 arXiv 2412.19437 sec. 3.2.1; deepseek-ai/DualPipe)",
    "dualpipev": "DualPipeV F&B pairs (deepseek-ai/DualPipe dualpipev.py, Sea AI Lab cut-in-half)",
}
UNPAIRED_SOURCES = {
    "1f1b": "1F1B with pp > 1 pairs no chunks (Megatron-Core needs virtual stages for EP overlap under PP): "
            "EP all-to-all exposed",
    "zb-h1": "ZB-H1 pairs no chunks (no published EP overlap): EP all-to-all exposed",
}


def pairing(name: str, p: int) -> tuple[bool, str]:
    """(whether schedule `name` on `p` ranks runs paired F&B chunks, the rule's source)."""
    if p == 1 and name in ("1f1b", "interleaved-1f1b", "zb-h1"):
        return True, PAIRED_SOURCES["no-pipeline"]
    if name in PAIRED_SOURCES:
        return True, PAIRED_SOURCES[name]
    return False, UNPAIRED_SOURCES.get(name, f"{name}: EP all-to-all exposed")


def slot_hidden(schedule: Any, costs: Any) -> list[float]:
    """Seconds each device's paired slots save over the step: for every slot with a forward and a backward,
    the two run one after the other minus the overlapped pair (`paired_seconds`), i.e. the all-to-all hidden
    net of the SMs it holds. Read from the static order: no timing needed."""
    from k3sim.pipeline.placement import _slot_seconds

    split = schedule.split_backward
    out = []
    for d, order in enumerate(schedule.orders):
        hidden, i = 0.0, 0
        for n in schedule.slot_sizes(d):
            members = order[i:i + n]
            i += n
            if n > 1 and any(k == 0 for k, _, _ in members) and any(k != 0 for k, _, _ in members):
                pair, _ = _slot_seconds(members, costs, split)
                alone = sum(_slot_seconds([op], costs, split)[0] for op in members)
                hidden += alone - pair
        out.append(hidden)
    return out


def no_pipeline_seconds(f: float, b: float, f_comm: float, b_comm: float, m: int, sm_share: float) -> tuple[float, float]:
    """(step seconds, seconds hidden) of m micro-batches on one pipeline rank under Megatron's combined 1F1B for
    no pipelining: F + B + (m - 1) x the F&B pair (`paired_seconds`)."""
    from k3sim.pipeline.placement import paired_seconds

    if m <= 1:
        return f + b, 0.0
    pair = paired_seconds(f - f_comm, f_comm, b - b_comm, b_comm, sm_share)
    return f + b + (m - 1) * pair, (m - 1) * (f + b - pair)


def ep_sm_share(hw: Any, kernel: str = "normal") -> float:
    """Share of the SMs compute keeps while the EP all-to-all runs beside it: (num_sms - held) / num_sms, the
    serving step's two-batch-overlap charge (`k3sim.step.forward.comm_sm_fraction`); 1 for a profile without
    an SM count."""
    from k3sim.comm.ep import comm_sms

    n = int(getattr(hw, "num_sms", 0) or 0)
    return max(1, n - comm_sms(kernel, hw)) / n if n else 1.0


def moe_layers(model: Any, layers_1based: list[int]) -> int:
    """MoE layers among a stage's layers (1-based, as `StageCost.layers`)."""
    kinds = model.ffn_kinds
    return sum(1 for i in layers_1based if kinds[i - 1] == "moe")


def stage_ep_comm(model: Any, stages: list, layer_fwd_s: float, recompute: int) -> tuple[list[float], list[float]]:
    """Per stage: the EP all-to-all seconds of one micro-batch's forward (dispatch + combine of each MoE layer)
    and of its backward (the same two in reverse, and again in the recompute under full checkpointing), the
    parts a paired chunk can hide; the MoonEP weight prefetch is not among them (it already overlaps its
    layer). Capped at the stage's exposed EP seconds."""
    fwd, bwd = [], []
    for st in stages:
        n = moe_layers(model, st.layers)
        f = n * layer_fwd_s
        b = n * layer_fwd_s * (1 + recompute)
        total = st.comm_s.get("ep", 0.0)
        f = min(f, total)
        fwd.append(f)
        bwd.append(min(b, total - f))
    return fwd, bwd


def stage_weight_s(stages: list, layer_costs: list, pp: int, fold_fix_fwd_s: float, model: Any) -> list[float]:
    """Per stage: the weight-gradient seconds of one micro-batch (the W a split-backward schedule defers): each
    layer's `backward_weight_s`, the embedding's on the first rank and the LM head's on the last, and the
    weight-gradient half of the EP fold correction (the stage model adds 2 x it to the backward)."""
    by = {c.layer: c for c in layer_costs}
    out = []
    for r, st in enumerate(stages):
        w = sum(by[i - 1].backward_weight_s for i in st.layers if (i - 1) in by)
        for c in layer_costs:
            if (c.kind == "embedding" and r == 0) or (c.kind == "lm_head" and r == pp - 1):
                w += c.backward_weight_s
        w += fold_fix_fwd_s * moe_layers(model, st.layers)
        out.append(min(w, st.backward_s))
    return out


def mirror_stages(stages: list) -> None:
    """DualPipe: rank r runs stage r for half the micro-batches and its mirror stage p-1-r for the other half,
    so its cost per micro-batch is the mean of the two (in place; the rank keeps its own layers)."""
    p = len(stages)
    means = []
    for r in range(p):
        a, b = stages[r], stages[p - 1 - r]
        means.append({"forward_s": (a.forward_s + b.forward_s) / 2, "backward_s": (a.backward_s + b.backward_s) / 2,
                      "recompute_s": (a.recompute_s + b.recompute_s) / 2,
                      "imbalance_s": (a.imbalance_s + b.imbalance_s) / 2,
                      "comm_fwd": (a.comm_fwd + b.comm_fwd) / 2, "comm_bwd": (a.comm_bwd + b.comm_bwd) / 2,
                      "comm_s": {k: (a.comm_s.get(k, 0.0) + b.comm_s.get(k, 0.0)) / 2
                                 for k in set(a.comm_s) | set(b.comm_s)}})
    for st, vals in zip(stages, means):
        for k, v in vals.items():
            setattr(st, k, v)


def apply_hidden(stages: list, hidden_per_mb: list[float], ep_fwd: list[float], ep_bwd: list[float]) -> None:
    """Take what the schedule hides off each rank's exposed EP seconds per micro-batch (in place), forward and
    backward in proportion to their all-to-all seconds."""
    for st, h, f, b in zip(stages, hidden_per_mb, ep_fwd, ep_bwd):
        if h <= 0:
            continue
        hf = h * f / (f + b) if f + b > 0 else h
        st.comm_s["ep"] = st.comm_s.get("ep", 0.0) - h
        st.comm_fwd -= hf
        st.comm_bwd -= h - hf


def schedule_pipeline(stages: list, model: Any, hw: Any, par: Any, m: int, send_s: float, ep: Any, opts: Any,
                      recompute: int, layer_costs: list, source: str | None = None):
    """The training step's pipeline: the schedule `opts.pipeline_schedule` over the stages' per-micro-batch
    costs, with the EP all-to-all the schedule's paired chunks may hide (`opts.ep_overlap` None and EP > 1;
    an explicit share already took its part off in `_ep_comm`). Updates the stages in place to what is left
    exposed (and, under DualPipe, to each rank's mean of its two stages), so the step's rows add up to the
    pipeline's time. Returns `k3sim.training.schedule.PipelineTime`."""
    from k3sim.training.schedule import SPLIT, check_schedule, pipeline_time, resolve_schedule

    name = resolve_schedule(opts.pipeline_schedule, par.virtual_stages)
    check_schedule(name, par.pp, par.virtual_stages, m, source=source)
    computed = opts.ep_overlap is None and par.ep > 1 and model.moe is not None
    ep_f, ep_b = stage_ep_comm(model, stages, ep.layer_fwd_s, recompute) if computed else (None, None)
    weight = stage_weight_s(stages, layer_costs, par.pp, ep.fold_fix_fwd_s, model) if name in SPLIT else None
    pipe = pipeline_time([s.fwd_total for s in stages], [s.bwd_total for s in stages],
                         virtual_stages=par.virtual_stages, micro_batches=m, send_s=send_s,
                         use_engine=opts.use_pipeline_engine, schedule=name, weight=weight,
                         comm_fwd=ep_f, comm_bwd=ep_b, sm_share=ep_sm_share(hw) if computed else 1.0)
    if name == "dualpipe":
        mirror_stages(stages)
        if ep_f is not None:
            p = len(stages)
            ep_f = [(ep_f[r] + ep_f[p - 1 - r]) / 2 for r in range(p)]
            ep_b = [(ep_b[r] + ep_b[p - 1 - r]) / 2 for r in range(p)]
    if ep_f is not None:
        apply_hidden(stages, pipe.ep_hidden_s, ep_f, ep_b)
    return pipe


def overlap_note(opts: Any, par: Any) -> str:
    """What hides the EP all-to-all of this layout, for its row's source: the explicit share, or the schedule's
    pairing rule (`pairing`)."""
    from k3sim.training.schedule import resolve_schedule

    if opts.ep_overlap is not None:
        return f"training.ep_overlap {opts.ep_overlap:g} of it hidden (explicit)"
    return f"hidden by the schedule: {pairing(resolve_schedule(opts.pipeline_schedule, par.virtual_stages), par.pp)[1]}"


# ---- the all-to-all itself ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class EpAllToAll:
    """One MoE layer's forward dispatch and combine on one rank (seconds), with the source of each."""

    dispatch_s: float
    combine_s: float
    source: str

    @property
    def seconds(self) -> float:
        return self.dispatch_s + self.combine_s


def ep_params(model: Any, par: Any, hw: Any, tokens: float, phase: str, precision: str, opts: Any) -> dict[str, int]:
    """The integer params of op "ep_dispatch" / "ep_combine" (`k3sim.comm.ep`, its docstring) for training: T the
    tokens one rank sends (its sequence-parallel shard of the micro-batch), D the latent width (LatentMoE) or
    hidden, top-k of E routed experts with R = MoonEP slots x ep redundant slots, the EP group of `ep`
    consecutive ranks on nodes of the profile's scale-up domain, node-limited routing from the model
    (`moe.max_nodes_per_token`; 0 = unlimited, or when the group spans no more nodes than the limit), the normal
    (high-throughput) kernels DeepEP gives training, FP8 dispatch under training.precision fp8 (DeepSeek-V3
    sec. 3.3.2: dispatch in FP8, combine in BF16), the routing's Zipf exponent x 1000 and seed."""
    from k3sim.comm.ep import KERNEL_CODES

    moe = model.moe
    G = int(hw.scaleup_domain_gpus)
    nodes = par.ep // G if par.ep > G else 1
    limit = int(getattr(moe, "max_nodes_per_token", None) or 0)
    return {"T": max(1, math.ceil(tokens)), "D": moe.latent_width or model.hidden_size,
            "topk": moe.num_active_experts, "E": moe.num_routed_experts, "R": opts.redundant_experts * par.ep,
            "ep": par.ep, "G": G, "nodes_max": limit if 0 < limit < nodes else 0, "kernel": KERNEL_CODES["normal"],
            "dtype_bytes": 1 if phase == "dispatch" and precision == "fp8" else 2,
            "zipf_milli": int(round(opts.routing_skew * 1000)), "seed": opts.seed}


def ep_all_to_all(kernel_time: Any, hw: Any, model: Any, par: Any, tokens: float, opts: Any,
                  memo: dict | None = None) -> EpAllToAll:
    """Dispatch + combine of one MoE layer's forward through the one kernel clock (ops of kind "ep": the
    DeepEP-class model, its busiest link under the routing distribution, so no imbalance stretch on top),
    memoised in `memo` per layout (a sweep prices thousands of layouts with few distinct EP shapes)."""
    key = (par.ep, tokens, opts.precision, opts.redundant_experts, opts.routing_skew, opts.seed)
    if memo is not None and key in memo:
        return memo[key]
    out = {}
    for phase in ("dispatch", "combine"):
        p = ep_params(model, par, hw, tokens, phase, opts.precision, opts)
        out[phase] = (kernel_time(f"ep_{phase}", p, hardware=hw), p)
    (kd, pd), (kc, _) = out["dispatch"], out["combine"]
    limit = f"node-limited to {pd['nodes_max']} nodes" if pd["nodes_max"] else "no node limit"
    src = (f"ep_dispatch {float(kd.seconds) * 1e6:.0f} us ({'fp8' if pd['dtype_bytes'] == 1 else 'bf16'}) + ep_combine "
           f"{float(kc.seconds) * 1e6:.0f} us (bf16), DeepEP-class normal kernels over ep={par.ep} ({limit}), "
           f"T={pd['T']} tokens/rank: {kd.source}")
    res = EpAllToAll(float(kd.seconds), float(kc.seconds), src)
    if memo is not None:
        memo[key] = res
    return res
