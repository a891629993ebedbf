"""Run a pipeline layout (text only and with the encoder policy) and summarise it.

bubble_ratio = (step time - compute time of the busiest device) / that compute time: Megatron's
"bubble time over ideal time" (Narayanan et al. SC'21), which for uniform stages is (p-1)/m for 1F1B.
encoder_hidden_share = 1 - (step with encoder - text-only step) / (all encoder compute, device-seconds,
forward and backward, including decoupled's recompute): the issue's "fraction of encoder compute that does
not lengthen the step". Serial gives 0; spreading the encoder over p devices alone (decoupled) gives up
to 1 - 1/p; overlap with bubbles gives more. Clamped to [0, 1]. encoder_placed_in_bubbles counts encodes the bubble
policy put into idle gaps (torchtitan's count-based hidden_share).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3sim.pipeline.engine import Timeline, simulate
from k3sim.pipeline.placement import EncoderWork, Placed, place, text_program
from k3sim.pipeline.schedules import Schedule


@dataclass
class StageStats:
    device: int
    busy_s: float
    idle_s: float
    encoder_busy_s: float
    peak_in_flight: float            # micro-batches' worth of this device's activations (chunk count / v)
    peak_activation_bytes: float | None
    planner_in_flight: float         # k3sim.memory.plan.in_flight_micro_batches for this rank


@dataclass
class PipelineResult:
    schedule: str
    stages: int
    virtual: int
    microbatches: int
    encoder_policy: str
    step_time_s: float
    text_step_time_s: float
    bubble_ratio: float
    text_bubble_ratio: float
    encoder_compute_s: float | None
    encoder_overhead_s: float | None
    encoder_hidden_share: float | None
    encoder_placed_in_bubbles: dict | None
    stage: list[StageStats]
    costs_source: str
    extra: dict = field(default_factory=dict)
    timeline: Timeline | None = field(default=None, repr=False)
    text_timeline: Timeline | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        from dataclasses import asdict

        d = {k: v for k, v in asdict(self).items() if k not in ("timeline", "text_timeline")}
        d["idle_per_stage_s"] = [s.idle_s for s in self.stage]
        d["peak_in_flight_per_stage"] = [s.peak_in_flight for s in self.stage]
        d["activation_bytes_per_stage"] = [s.peak_activation_bytes for s in self.stage]
        return d


def in_flight(placed: Placed, activation_bytes: tuple[float, ...] | None) -> list[tuple[float, float | None]]:
    """Peak (chunk-activations / v, bytes) per device, walking its op order: a forward adds the
    micro-batch's activations on that chunk, its last backward op (W if split, else B) frees them."""
    prog, sch = placed.program, placed.schedule
    free_kind = "W" if sch.split_backward else "B"
    out = []
    for order in prog.orders:
        n = peak = 0
        b = peak_b = 0.0
        for op in order:
            kind, s, _, _ = prog.labels[op]
            if kind in ("F", "F&B"):       # an F&B slot's backward part is its own (zero-second) B / W op
                n += 1
                if activation_bytes is not None:
                    b += activation_bytes[s]
            elif kind == free_kind:
                n -= 1
                if activation_bytes is not None:
                    b -= activation_bytes[s]
            peak = max(peak, n)
            peak_b = max(peak_b, b)
        out.append((peak / sch.v, peak_b if activation_bytes is not None else None))
    return out


def planner_in_flight(p: int, v: int, m: int) -> list[float]:
    """The memory planner's count per rank (one source of truth for the training memory plan)."""
    from k3sim.configs.parallel import Parallelism
    from k3sim.memory.plan import in_flight_micro_batches

    par = Parallelism(pp=p, virtual_stages=v)
    return [in_flight_micro_batches(par, r, m) for r in range(p)]


def _bubble(tl: Timeline) -> float:
    busy = max(tl.busy_s())
    return (tl.step_time_s - busy) / busy if busy > 0 else 0.0


def run_pipeline(schedule: Schedule, costs, encoder: EncoderWork | None = None, policy: str = "none",
                 *, upfront: int | None = None, keep_timeline: bool = True) -> PipelineResult:
    """Simulate the text-only pipeline and (if `encoder` and a policy) the pipeline with the encoder."""
    text = text_program(schedule, costs)
    ttl = simulate(text.program)
    if encoder is not None and policy != "none":
        placed = place(schedule, costs, encoder, policy, upfront=upfront)
        tl = placed.timeline or simulate(placed.program)
    else:
        placed, tl, policy = text, ttl, "none"
    prog = placed.program
    busy = tl.busy_s()
    enc_busy = [sum(prog.cost[op] for op in order if prog.labels[op][0] in ("EF", "EB")) for order in prog.orders]
    flights = in_flight(placed, costs.activation_bytes)
    plan = planner_in_flight(schedule.p, schedule.v, schedule.m)
    stats = [StageStats(d, busy[d], tl.step_time_s - busy[d], enc_busy[d], flights[d][0], flights[d][1], plan[d])
             for d in range(schedule.p)]
    enc_compute = overhead = hidden = placed_counts = None
    if policy != "none":
        enc_compute = sum(encoder.forward_s) + sum(encoder.backward_s)
        overhead = tl.step_time_s - ttl.step_time_s
        # all encoder compute (device-seconds): what the step would grow by if it ran alone on one device
        exposed = sum(enc_busy)
        hidden = min(1.0, max(0.0, 1.0 - overhead / exposed)) if exposed > 0 else 1.0
        if policy == "bubble":
            placed_counts = {"upfront": placed.upfront, "forward_in_bubbles": placed.placed_forward,
                             "backward_in_bubbles": placed.placed_backward,
                             "synchronous": len(placed.synchronous), "overflow": placed.overflow,
                             "microbatches": schedule.m}
    return PipelineResult(
        schedule=schedule.name, stages=schedule.p, virtual=schedule.v, microbatches=schedule.m,
        encoder_policy=policy, step_time_s=tl.step_time_s, text_step_time_s=ttl.step_time_s,
        bubble_ratio=_bubble(tl), text_bubble_ratio=_bubble(ttl), encoder_compute_s=enc_compute,
        encoder_overhead_s=overhead, encoder_hidden_share=hidden, encoder_placed_in_bubbles=placed_counts,
        stage=stats, costs_source=costs.source,
        timeline=tl if keep_timeline else None, text_timeline=ttl if keep_timeline else None)
