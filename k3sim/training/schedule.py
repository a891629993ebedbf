"""Pipeline step time and bubble for per-stage micro-batch costs: one function the training model calls.

`pipeline_time` runs the named schedule ("auto": 1F1B, interleaved 1F1B when virtual_stages > 1; "zb-h1";
"dualpipe"; "dualpipev") on the discrete-event engine (`k3sim.pipeline`) when it is present and asked for, or
its closed form otherwise:
- 1F1B / interleaved: Narayanan et al. (SC'21, Megatron-LM): m x (F + B) of the slowest stage plus a bubble of
  (p - 1)/v x (F + B). Non-uniform stages are bounded by the slowest stage (a modelling choice: the closed form
  assumes equal stages; the engine does not).
- ZB-H1: Qi et al. (ICLR 2024) (p - 1)(F + B - W), B the input gradient alone.
- DualPipe: (p/2 - 1)(F&B + B - 3W), DualPipeV (p - 1)(F&B + B - 3W) per chunk (deepseek-ai/DualPipe README
  table, B the whole backward); the engine reproduces them exactly when a chunk's forward equals its input
  gradient, as in the repo's figure (tests/pipeline), and differs by a little otherwise.
With `comm_fwd` / `comm_bwd` (the EP all-to-all seconds inside each rank's forward / backward), the schedule's
paired forward-and-backward chunks hide them as far as the other chunk's compute reaches
(`k3sim.training.overlap`: which schedules pair, after whom); `ep_hidden_s` says how much per rank.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache

from k3sim.errors import InputError

SCHEDULE_FIELD = "training.pipeline_schedule"
SPLIT = ("zb-h1", "dualpipe", "dualpipev")      # backward split into input gradient B and weight gradient W
DUAL = ("dualpipe", "dualpipev")


@dataclass
class PipelineTime:
    step_time_s: float              # compute + bubble + exposed stage-to-stage sends (no DP/optimizer)
    bubble_s: float                 # idle of the slowest stage with free sends: T(no sends) - m x (F + B - hidden)
    bubble_ratio: float             # bubble / ideal compute (Megatron's convention)
    p2p_s: float                    # what the sends add to the step
    source: str
    timeline: object | None = None  # the engine's Timeline, for the report's Gantt chart
    schedule: str = "1f1b"          # the schedule that ran ("auto" resolved)
    ep_hidden_s: list[float] = field(default_factory=list)   # per rank: EP all-to-all hidden per micro-batch
    parameter_copies: int = 1       # copies of each stage's weights over the pipeline (DualPipe: 2)
    in_flight: list[float] | None = None  # micro-batches in flight per rank (memory plan units); None: 1F1B's
    overlap_source: str = ""        # which chunks hid the EP all-to-all, after whom


def closed_form(fwd: list[float], bwd: list[float], v: int, m: int, send_s: float = 0.0) -> PipelineTime:
    """Megatron: m (F + B) of the slowest stage + (p - 1)/v (F + B); sends exposed on the fill and drain
    chains only, 2 (p v - 1) hops (modelling choice: steady-state sends overlap compute)."""
    p = len(fwd)
    per_mb = max(f + b for f, b in zip(fwd, bwd))
    ideal = m * per_mb
    bubble = (p - 1) / v * per_mb
    p2p = 2 * (p * v - 1) * send_s if p > 1 else 0.0
    return PipelineTime(ideal + bubble + p2p, bubble, bubble / ideal if ideal else 0.0, p2p,
                        f"closed form (p-1)/(v m) (Narayanan et al. SC'21), p={p}, v={v}, m={m}",
                        schedule="interleaved-1f1b" if v > 1 else "1f1b")


def engine_available() -> bool:
    try:
        return importlib.util.find_spec("k3sim.pipeline.engine") is not None
    except ModuleNotFoundError:
        return False


def resolve_schedule(name: str, v: int) -> str:
    """"auto" -> 1F1B, or interleaved 1F1B when the ranks hold more than one chunk."""
    if name == "auto":
        return "interleaved-1f1b" if v > 1 else "1f1b"
    return name


def check_schedule(name: str, pp: int, v: int, m: int, *, source: str | None = None) -> None:
    """Refuse a schedule the layout cannot run, naming the field: chunks per rank (parallelism.virtual_stages)
    against the schedule, DualPipe's even pp and micro-batch count (`k3sim.pipeline.schedules.check_dual`)."""
    from k3sim.pipeline.schedules import SCHEDULES, check_dual

    name = resolve_schedule(name, v)
    if name not in SCHEDULES or name == "gpipe":
        raise InputError(f"unknown training schedule {name!r}; one of auto, 1f1b, interleaved-1f1b, zb-h1, dualpipe, "
                         "dualpipev", source=source, field=SCHEDULE_FIELD)
    if pp == 1:
        if name == "dualpipe":
            check_dual(name, pp, m, source=source)
        return
    if name in ("1f1b", "zb-h1", "dualpipe") and v > 1:
        what = "one stage of each direction per rank" if name == "dualpipe" else "one chunk per rank"
        raise InputError(f"{name} runs {what}, but parallelism.virtual_stages is {v}: set virtual_stages 1, or use "
                         "interleaved-1f1b or dualpipev", source=source, field=SCHEDULE_FIELD)
    if name == "interleaved-1f1b" and v == 1:
        raise InputError("interleaved-1f1b needs parallelism.virtual_stages > 1 (it is 1): raise it, or use 1f1b",
                         source=source, field=SCHEDULE_FIELD)
    if name == "dualpipev" and v != 2:
        raise InputError(f"dualpipev runs two chunks per rank (the V: stages r and 2 pp - 1 - r), but "
                         f"parallelism.virtual_stages is {v}: set it to 2", source=source, field=SCHEDULE_FIELD)
    if name in DUAL:
        check_dual(name, pp, m, source=source)


def pipeline_time(fwd: list[float], bwd: list[float], *, virtual_stages: int = 1, micro_batches: int = 1,
                  send_s: float = 0.0, use_engine: bool | None = None, schedule: str = "auto",
                  weight: list[float] | None = None, comm_fwd: list[float] | None = None,
                  comm_bwd: list[float] | None = None, sm_share: float = 1.0) -> PipelineTime:
    """Step time of the pipeline for forward/backward seconds of one micro-batch on each rank (all its
    virtual chunks together; each chunk costs 1/v of it) and one stage-to-stage send of `send_s`.

    `schedule`: see the module docstring (DualPipe: rank r's entry is model stage r, which it runs for the
    micro-batches entering at rank 0, and rank p-1-r runs for those entering at the other end). `weight`: the
    weight-gradient part of each rank's backward, the W a split-backward schedule defers (None: 0).
    `comm_fwd` / `comm_bwd`: the EP all-to-all inside each rank's forward / backward that paired chunks may
    hide (None: no computed overlap); `sm_share`: the SMs compute keeps beside an all-to-all.
    `use_engine` None: the discrete-event engine when present and p > 1."""
    p, v, m = len(fwd), virtual_stages, micro_batches
    name = resolve_schedule(schedule, v)
    check_schedule(name, p, v, m)
    w = list(weight) if weight is not None else [0.0] * p
    cf = list(comm_fwd) if comm_fwd is not None else [0.0] * p
    cb = list(comm_bwd) if comm_bwd is not None else [0.0] * p
    if p == 1:
        return _no_pipeline(name, fwd[0], bwd[0], cf[0], cb[0], m, sm_share, comm_fwd is not None)
    if use_engine is None:
        use_engine = engine_available()
    parts = (fwd, bwd, w, cf, cb, sm_share)
    if use_engine and engine_available():
        return _engine_time(name, parts, v, m, send_s, comm_fwd is not None)
    return _closed_time(name, parts, v, m, send_s, comm_fwd is not None)


def _no_pipeline(name: str, f: float, b: float, fa: float, ba: float, m: int, share: float,
                 computed: bool) -> PipelineTime:
    from k3sim.training.overlap import no_pipeline_seconds, pairing

    if computed:
        t, hidden = no_pipeline_seconds(f, b, fa, ba, m, share)
        why = pairing(name, 1)[1]
    else:
        t, hidden, why = m * (f + b), 0.0, ""
    return PipelineTime(t, 0.0, 0.0, 0.0, "no pipeline (pp=1)", schedule=name, ep_hidden_s=[hidden / m],
                        overlap_source=why)


def _rank_per_mb(name: str, fwd: list[float], bwd: list[float]) -> list[float]:
    """Each rank's compute per micro-batch: F + B, the mean of its two stages under DualPipe."""
    c = [f + b for f, b in zip(fwd, bwd)]
    p = len(c)
    return [(c[r] + c[p - 1 - r]) / 2 for r in range(p)] if name == "dualpipe" else c


def stage_costs(sched, parts: tuple, send_s: float):
    """`k3sim.pipeline.StageCosts` per virtual stage of `sched` from per-rank seconds: a chunk of rank r costs
    1/v of its entry (interleaved, DualPipeV: its two chunks); DualPipe's direction-1 stage p + j is model
    stage j, a whole stage per chunk."""
    from k3sim.pipeline.stagecosts import StageCosts

    fwd, bwd, w, cf, cb, share = parts
    p, S = sched.p, sched.num_stages
    if sched.name == "dualpipe":
        rank, k = [s % p for s in range(S)], 1
    else:
        rank, k = [sched.device_of(s) for s in range(S)], sched.v
    pick = lambda xs: tuple(xs[rank[s]] / k for s in range(S))  # noqa: E731
    bi = [b - x for b, x in zip(bwd, w)]
    return StageCosts(pick(fwd), pick(bi), pick(w), (send_s,) * S, (send_s,) * S, source="k3sim.training",
                      comm_forward_s=pick(cf), comm_backward_s=pick(cb), comm_sm_share=share)


def build(name: str, p: int, m: int, v: int, computed: bool):
    """The schedule object: DualPipe's own chunks, the paired interleaved order when the EP overlap is computed."""
    from k3sim.pipeline import build_schedule

    if name in DUAL:
        return build_schedule(name, p, m)
    return build_schedule(name, p, m, v, paired=computed and name == "interleaved-1f1b")


def in_flight(sched) -> list[float]:
    """Micro-batches in flight per rank at peak, in the memory plan's units (the rank's own layers for one
    micro-batch; an interleaved or DualPipeV chunk is 1/v of it, a DualPipe chunk a whole stage), walking each
    rank's order: a forward holds its activations until its last backward op (W when split)."""
    free = 2 if sched.split_backward else 1
    unit = 1 if sched.name == "dualpipe" else sched.v
    out = []
    for order in sched.orders:
        n = peak = 0
        for kind, _, _ in order:
            n += 1 if kind == 0 else -1 if kind == free else 0
            peak = max(peak, n)
        out.append(peak / unit)
    return out


def _result(name: str, sched, step: float, free: float, p2p: float, ideal: float, hidden: list[float], m: int,
            source: str, computed: bool, timeline=None) -> PipelineTime:
    from k3sim.training.overlap import pairing

    bubble = max(0.0, free - ideal)
    why = pairing(name, sched.p)[1] if computed else ""
    return PipelineTime(step, bubble, bubble / ideal if ideal else 0.0, p2p, source, timeline, schedule=name,
                        ep_hidden_s=[h / m for h in hidden], parameter_copies=sched.parameter_copies,
                        in_flight=None if name in ("1f1b", "interleaved-1f1b") and not sched.general
                        else in_flight(sched), overlap_source=why)


def _engine_time(name: str, parts: tuple, v: int, m: int, send_s: float, computed: bool) -> PipelineTime:
    from k3sim.pipeline import simulate, text_program
    from k3sim.training.overlap import slot_hidden

    fwd, bwd = parts[0], parts[1]
    p = len(fwd)
    sched = build(name, p, m, v, computed)
    costs = stage_costs(sched, parts, 0.0)
    hidden = slot_hidden(sched, costs)
    ideal = m * max(c - h / m for c, h in zip(_rank_per_mb(name, fwd, bwd), hidden))
    free = simulate(text_program(sched, costs).program)
    full = simulate(text_program(sched, stage_costs(sched, parts, send_s)).program) if send_s > 0 else free
    tag = " paired" if sched.slots is not None and name == "interleaved-1f1b" else ""
    src = f"k3sim.pipeline discrete-event engine ({name}{tag}, p={p}, v={sched.v}, m={m})"
    return _result(name, sched, full.step_time_s, free.step_time_s, full.step_time_s - free.step_time_s, ideal,
                   hidden, m, src, computed, full)


def pair_counts(name: str, p: int, m: int, v: int, computed: bool) -> list[int]:
    """F&B pairs per rank of the schedule, from its shape (`k3sim.pipeline.schedules`): interleaved + 1 warm-up,
    m v - (2 (p - r - 1) + (v - 1) p + 1) steady chunks; DualPipe / DualPipeV, steps 4 and 5 of the repo's
    order, 2 c - 3 h + i + 1 less one on the middle (last) rank, for rank i in its half of h ranks and c
    micro-batches per direction."""
    if name in DUAL:
        half, chunks = (p // 2, m // 2) if name == "dualpipe" else (p, m)
        out = []
        for d in range(p):
            i = min(d, p - 1 - d) if name == "dualpipe" else d
            out.append(2 * chunks - 3 * half + i + 1 - (1 if i == half - 1 else 0))
        return out
    if computed and name == "interleaved-1f1b":
        return [m * v - min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) for r in range(p)]
    return [0] * p


def _closed_time(name: str, parts: tuple, v: int, m: int, send_s: float, computed: bool) -> PipelineTime:
    """Closed forms (module docstring) with the pairs' savings counted from the schedule's shape: exact against
    the engine under uniform costs (tests/training)."""
    from k3sim.pipeline.placement import paired_seconds

    fwd, bwd, w, cf, cb, share = parts
    p = len(fwd)
    per = _rank_per_mb(name, fwd, bwd)
    k = 1 if name == "dualpipe" else v            # chunks a micro-batch runs on a rank
    mean = (lambda xs, r: (xs[r] + xs[p - 1 - r]) / 2) if name == "dualpipe" else (lambda xs, r: xs[r])  # noqa: E731
    chunk = [(mean(fwd, r) / k, mean(bwd, r) / k, mean(w, r) / k, mean(cf, r) / k, mean(cb, r) / k)
             for r in range(p)]
    save = [F + B - paired_seconds(F - fa, fa, B - ba, ba, share) for F, B, _, fa, ba in chunk]
    hidden = [n * s for n, s in zip(pair_counts(name, p, m, v, computed), save)]
    crit = max(range(p), key=lambda r: per[r] - hidden[r] / m)
    ideal = m * (per[crit] - hidden[crit] / m)
    F, B, W, fa, ba = chunk[crit]
    if name in DUAL:
        # the table's bubble is the idle of the rank with the most F&B pairs (the least busy): the step is that
        # rank's busy time plus it, the bubble row the busiest rank's idle (the engine's, under uniform costs)
        fb = paired_seconds(F - fa, fa, B - ba, ba, share)
        table = (p / 2 - 1 if name == "dualpipe" else p - 1) * max(0.0, fb + B - 3 * W)
        bubble = min(m * c - h for c, h in zip(per, hidden)) + table - ideal
        src = f"closed form ({'p/2' if name == 'dualpipe' else 'p'} - 1)(F&B + B - 3W) (deepseek-ai/DualPipe)"
        hops = 2 * (p - 1) if name == "dualpipe" else 2 * (2 * p - 2)
    elif name == "zb-h1":
        bubble = (p - 1) * max(0.0, F + (B - W) - W)
        src, hops = "closed form (p-1)(F + B - W) (Qi et al. ICLR 2024, ZB-H1)", 2 * (p - 1)
    else:
        bubble = (p - 1) / v * per[crit] - (max(hidden) - hidden[crit])
        src, hops = "closed form (p-1)/(v m) (Narayanan et al. SC'21)", 2 * (p * v - 1)
    bubble = max(0.0, bubble)
    p2p = hops * send_s
    step = ideal + bubble + p2p
    from k3sim.training.overlap import pairing

    why = pairing(name, p)[1] if computed else ""
    return PipelineTime(step, bubble, bubble / ideal if ideal else 0.0, p2p, f"{src}, {name}, p={p}, v={v}, m={m}",
                        schedule=name, ep_hidden_s=[h / m for h in hidden], parameter_copies=2 if name == "dualpipe"
                        else 1, in_flight=None if name in ("1f1b", "interleaved-1f1b") and not computed else
                        list(_closed_in_flight(name, p, m, v, computed)), overlap_source=why)


@lru_cache(maxsize=1024)
def _closed_in_flight(name: str, p: int, m: int, v: int, computed: bool) -> list[float]:
    """`in_flight` of the schedule's static order (no timing), memoised per shape for sweeps; the paired
    interleaved order from its shape: its 2 (p - r - 1) + (v - 1) p + 1 warm-up chunks and the one its first
    F&B adds, at most m v."""
    if name == "interleaved-1f1b":
        return [min(2 * (p - r - 1) + (v - 1) * p + 2, m * v) / v for r in range(p)]
    return in_flight(build(name, p, m, v, computed))
