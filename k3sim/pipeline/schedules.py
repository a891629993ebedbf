"""Pipeline schedules as static per-device op orders, and their dependency graph.

A schedule says, for each pipeline device, the order in which it runs its compute ops; the data
dependencies between ops are the same for every schedule. Both are needed by the engine: the order
fixes what a device does next, the dependencies decide when it can start. Keeping the orders as plain
lists (not a graph search at run time) is what makes the engine fast enough for the planner's sweeps.

Ops: F (forward), B (backward; for ZB-H1 only the input gradient), W (weight gradient, ZB-H1 only),
per (virtual stage s, micro-batch mb). Virtual stage s lives on device s % p as model chunk s // p
(Megatron's interleaved layout: device d holds chunks d, d + p, ...).

Schedules (p devices, m micro-batches, v chunks per device):
- gpipe: all forwards, then all backwards (Huang et al. 2019); bubble (p-1)/m.
- 1f1b: p-d-1 warm-up forwards on device d, then one forward / one backward (Narayanan et al.,
  SC'21, PipeDream-flush); bubble (p-1)/m.
- interleaved-1f1b: Megatron-LM's virtual pipeline (same paper, sec. 2.2): (p-d-1)*2 + (v-1)*p
  warm-up chunk forwards, chunk order by groups of p micro-batches; needs m to be a multiple of p;
  bubble (p-1)/(v m).
- zb-h1: 1F1B with the backward split into B and W (Qi et al., ICLR 2024, "Zero Bubble Pipeline
  Parallelism", ZB-H1): device d defers its W passes by d micro-batches, which lets the B chain run
  at B speed and fills the tail with W; bubble (p-1)(F+B-W) per device, (p-1)/(3m) for F = B = W.
  The construction is ours (the repo derives its order with a greedy + ILP search); with uniform
  costs it reproduces the paper's bubble exactly (tests/pipeline).
- dualpipe: DeepSeek-V3's bidirectional pipeline (arXiv 2412.19437 sec. 3.2.1, fig. 5; the order of
  deepseek-ai/DualPipe `dualpipe.py`, read 2026-12, rewritten here as static orders). p devices (even),
  p model stages; half the micro-batches enter at device 0 and run stages 0..p-1 on devices 0..p-1, the
  other half enter at device p-1 and run the same model stages on devices p-1..0, so every device holds
  two stages (d and p-1-d: two copies of the parameters over the pipeline). Virtual stage s < p is
  direction 0's stage s on device s; s = p + j is direction 1's stage j on device p-1-j. Needs m even
  and m >= 2p (the repo's assertion `num_chunks >= num_ranks * 2`); bubble (p/2 - 1)(F&B + B - 3W).
- dualpipev: the "cut-in-half" V-shape (Sea AI Lab; deepseek-ai/DualPipe `dualpipev.py`): one copy of
  the parameters, the model in 2p stages, stage s on device s for s < p and on device 2p-1-s after, every
  micro-batch entering at device 0 and leaving there; the same eight-step order with the device as its
  own rank. Needs m >= 2p; bubble (p - 1)(F&B + B - 3W) with F, B, W of one stage (the repo's table:
  (PP/2 - 1)(...) for PP = 2p stages).
  Both run each backward either whole (B and W as one op, the repo's plain `_backward_chunk`) or split
  (zero-bubble: its W deferred, FIFO), and in their steady state one forward chunk and one backward
  chunk of two micro-batches as one overlapped F&B op (`slots`: consecutive ops of a device's order that
  run as one engine op; its duration is `k3sim.pipeline.placement.paired_seconds`).
- interleaved-1f1b with `paired=True`: EP overlap in the interleaved schedule (Kimi K2 report, arXiv
  2507.20534 sec. 2.4.2 and fig. 7, "VPP + 1 warmup"; Megatron-Core `combined_1f1b.py`,
  `overlap_moe_expert_parallel_comm`): one more warm-up chunk forward per device, then every steady-state
  (forward, backward) of the order is one overlapped op. Megatron refuses it for PP > 1 without virtual
  stages, and so does this module (`paired` needs interleaved-1f1b).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from k3sim.errors import InputError

F, B, W = 0, 1, 2
KIND_NAMES = ("F", "B", "W")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipe", "dualpipev")
DUAL = ("dualpipe", "dualpipev")          # two chunks per device, paired F&B ops, split backward


@dataclass(frozen=True)
class Schedule:
    """Per-device op orders. `orders[d]` is a list of (kind, virtual_stage, micro_batch).

    `split_backward`: B and W are separate ops (ZB-H1); otherwise B is the whole backward and there
    are no W ops."""

    name: str
    p: int
    v: int
    m: int
    orders: tuple[tuple[tuple[int, int, int], ...], ...]
    split_backward: bool
    # Optional shape beyond Megatron's layout (None: the default), used by DualPipe and the paired
    # interleaved schedule: slots[d] = sizes of the consecutive groups of orders[d] that run as one
    # engine op (an overlapped F&B pair, or a whole backward B + W); placement[s] = device of virtual
    # stage s (default s % p); chains[mb] = (first, last) virtual stage micro-batch mb runs (default
    # (0, p v - 1)).
    slots: tuple[tuple[int, ...], ...] | None = None
    placement: tuple[int, ...] | None = None
    chains: tuple[tuple[int, int], ...] | None = None

    @property
    def num_stages(self) -> int:
        """Virtual stages (model chunks over all devices) = p * v."""
        return self.p * self.v

    @property
    def general(self) -> bool:
        """Needs the general program builder (slots, a placement or chains of its own)."""
        return self.slots is not None or self.placement is not None or self.chains is not None

    def device_of(self, stage: int) -> int:
        return self.placement[stage] if self.placement is not None else stage % self.p

    def chain(self, mb: int) -> tuple[int, int]:
        """First and last virtual stage of micro-batch `mb`."""
        return self.chains[mb] if self.chains is not None else (0, self.p * self.v - 1)

    def slot_sizes(self, d: int) -> tuple[int, ...]:
        return self.slots[d] if self.slots is not None else (1,) * len(self.orders[d])

    @property
    def parameter_copies(self) -> int:
        """Copies of each stage's parameters over the pipeline: 2 for DualPipe (device d holds stages d
        and p-1-d), 1 otherwise (DualPipe README table, "Parameter Per Device")."""
        return 2 if self.name == "dualpipe" else 1


def check_shape(name: str, p: int, m: int, v: int, *, source: str | None = None) -> None:
    """Refuse layouts the schedule cannot run, naming the option at fault."""
    if name not in SCHEDULES:
        raise InputError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}", source=source or "--schedule")
    if p < 1:
        raise InputError(f"need at least 1 stage, got {p}", source="--stages")
    if m < 1:
        raise InputError(f"need at least 1 micro-batch, got {m}", source="--microbatches")
    if v < 1:
        raise InputError(f"virtual stages must be >= 1, got {v}", source="--virtual")
    if v > 1 and name != "interleaved-1f1b":
        what = "two chunks per device by construction" if name in DUAL else "one chunk per stage"
        raise InputError(f"--virtual {v} needs --schedule interleaved-1f1b ({name} has {what})",
                         source="--virtual")
    if name == "interleaved-1f1b" and m % p:
        raise InputError(f"interleaved-1f1b needs the micro-batch count to be a multiple of the stages: "
                         f"m={m}, p={p}", source="--microbatches")
    if name in DUAL:
        check_dual(name, p, m, stages_source="--stages", micro_source="--microbatches")


def check_dual(name: str, p: int, m: int, *, stages_source: str | None = None, micro_source: str | None = None,
               source: str | None = None) -> None:
    """DualPipe's shape rules (deepseek-ai/DualPipe `step`: `num_ranks % 2 == 0`, `num_chunks % 2 == 0 and
    num_chunks >= num_ranks * 2`; DualPipeV: `num_chunks >= num_ranks * 2`), naming what set each number:
    `stages_source` / `micro_source` as the source (the pipeline command's options), or, given `source`
    (a scenario file), the fields training.pipeline_schedule and num_micro_batches."""
    def fail(reason: str, opt: str | None, fld: str) -> None:
        if source is not None or opt is None:
            raise InputError(reason, source=source, field=fld)
        raise InputError(reason, source=opt)

    if name == "dualpipe" and p % 2:
        fail(f"dualpipe needs an even number of pipeline ranks (its two directions meet in the middle), got "
             f"pp={p}: use an even number, or dualpipev", stages_source, "training.pipeline_schedule")
    if name == "dualpipe" and m % 2:
        fail(f"dualpipe feeds half the micro-batches from each end: give an even count, got {m}", micro_source,
             "num_micro_batches")
    if m < 2 * p:
        fail(f"{name} needs at least 2 x pp = {2 * p} micro-batches (deepseek-ai/DualPipe: num_chunks >= "
             f"num_ranks * 2), got {m}", micro_source, "num_micro_batches")


def _gpipe(p: int, m: int) -> list[list[tuple[int, int, int]]]:
    return [[(F, d, k) for k in range(m)] + [(B, d, k) for k in range(m)] for d in range(p)]


def _one_f_one_b(p: int, m: int) -> list[list[tuple[int, int, int]]]:
    orders = []
    for d in range(p):
        nw = min(p - d - 1, m)
        o = [(F, d, k) for k in range(nw)]
        for k in range(m - nw):
            o += [(F, d, k + nw), (B, d, k)]
        o += [(B, d, k) for k in range(m - nw, m)]
        orders.append(o)
    return orders


def _zb_h1(p: int, m: int) -> list[list[tuple[int, int, int]]]:
    orders = []
    for d in range(p):
        nw = min(p - d - 1, m)
        o = [(F, d, k) for k in range(nw)]
        deferred: list[int] = []

        def backward(k: int) -> None:
            o.append((B, d, k))
            deferred.append(k)
            if len(deferred) > d:               # device d keeps d weight-gradient passes pending
                o.append((W, d, deferred.pop(0)))

        for k in range(m - nw):
            o.append((F, d, k + nw))
            backward(k)
        for k in range(m - nw, m):
            backward(k)
        o += [(W, d, k) for k in deferred]
        orders.append(o)
    return orders


def _interleaved(p: int, m: int, v: int) -> list[list[tuple[int, int, int]]]:
    """Megatron-LM `forward_backward_pipelining_with_interleaving` order (m a multiple of p)."""
    total = m * v

    def fwd(d: int, k: int) -> tuple[int, int, int]:
        chunk = (k // p) % v
        return (F, chunk * p + d, (k // (p * v)) * p + k % p)

    def bwd(d: int, k: int) -> tuple[int, int, int]:
        chunk = v - 1 - (k // p) % v
        return (B, chunk * p + d, (k // (p * v)) * p + k % p)

    orders = []
    for d in range(p):
        nw = min((p - d - 1) * 2 + (v - 1) * p, total)
        o = [fwd(d, k) for k in range(nw)]
        for k in range(total - nw):
            o += [fwd(d, k + nw), bwd(d, k)]
        o += [bwd(d, k) for k in range(total - nw, total)]
        orders.append(o)
    return orders


def _interleaved_paired(p: int, m: int, v: int) -> tuple[list[list[tuple[int, int, int]]], list[list[int]]]:
    """Interleaved 1F1B with EP overlap (Megatron-Core `forward_backward_pipelining_with_interleaving` with
    `overlap_moe_expert_parallel_comm`: one more warm-up; Kimi K2 fig. 7 "VPP + 1 warmup"): the same chunk
    orders, one more warm-up forward per device, and each steady-state (forward, backward) as one slot."""
    total = m * v

    def op(kind: int, d: int, k: int) -> tuple[int, int, int]:
        chunk = (k // p) % v
        return (kind, (chunk if kind == F else v - 1 - chunk) * p + d, (k // (p * v)) * p + k % p)

    orders, slots = [], []
    for d in range(p):
        nw = min((p - d - 1) * 2 + (v - 1) * p + 1, total)
        o = [op(F, d, k) for k in range(nw)]
        sz = [1] * nw
        for k in range(total - nw):
            o += [op(F, d, k + nw), op(B, d, k)]
            sz.append(2)
        o += [op(B, d, k) for k in range(total - nw, total)]
        sz += [1] * nw
        orders.append(o)
        slots.append(sz)
    return orders, slots


class _DualOrder:
    """One device's order in DualPipe's eight steps, built op by op: `phase` 0 is the stage through which
    this device's first-half direction runs (DualPipe: the direction in which the device is in the first
    half of the pipeline; DualPipeV: the way down), phase 1 the other. Zero-bubble backwards defer their W
    to a FIFO queue (the repo's WeightGradStore), others run B and W as one slot."""

    def __init__(self, stages: tuple[int, int], bases: tuple[int, int]):
        self.stages, self.bases = stages, bases
        self.nf, self.nb = [0, 0], [0, 0]
        self.ops: list[tuple[int, int, int]] = []
        self.sizes: list[int] = []
        self.pending: deque = deque()

    def _next(self, kind: int, ph: int) -> tuple[int, int, int]:
        count = self.nf if kind == F else self.nb
        op = (kind, self.stages[ph], self.bases[ph] + count[ph])
        count[ph] += 1
        return op

    def forward(self, ph: int) -> None:
        self.ops.append(self._next(F, ph))
        self.sizes.append(1)

    def backward(self, ph: int, zero_bubble: bool = False) -> None:
        b = self._next(B, ph)
        if zero_bubble:
            self.ops.append(b)
            self.sizes.append(1)
            self.pending.append(b)
        else:
            self.ops += [b, (W, b[1], b[2])]
            self.sizes.append(2)

    def weight(self) -> None:
        _, st, mb = self.pending.popleft()
        self.ops.append((W, st, mb))
        self.sizes.append(1)

    def pair(self, ph_f: int, ph_b: int) -> None:
        """An overlapped forward (phase `ph_f`) and whole backward (phase `ph_b`) of two micro-batches."""
        f, b = self._next(F, ph_f), self._next(B, ph_b)
        self.ops += [f, b, (W, b[1], b[2])]
        self.sizes.append(3)


def _dual_device(order: _DualOrder, half: int, r: int, chunks: int) -> None:
    """Steps 1-8 of deepseek-ai/DualPipe's `step` for a device of rank `r` within its half of `half`
    ranks and `chunks` micro-batches per direction (DualPipeV: the whole pipeline, all micro-batches)."""
    last = r == half - 1                       # DualPipe's middle ranks, DualPipeV's last rank
    for _ in range((half - r - 1) * 2):        # 1: nF0
        order.forward(0)
    for _ in range(r + 1):                     # 2: nF0F1
        order.forward(0)
        order.forward(1)
    for _ in range(half - r - 1):              # 3: nB1W1F1 (zero bubble)
        order.backward(1, zero_bubble=True)
        order.weight()
        order.forward(1)
    for i in range(chunks - 2 * half + r + 1):  # 4: nF0B1F1B0 (main step)
        if i == 0 and last:                    # the repo leaves this pair unoverlapped (smaller bubble)
            order.forward(0)
            order.backward(1)
        else:
            order.pair(0, 1)
        order.pair(1, 0)
    for _ in range(half - r - 1):              # 5: nB1F1B0
        order.backward(1)
        order.pair(1, 0)
    zb = False
    for i in range(r + 1):                     # 6: nB1B0, the second half zero bubble
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        order.backward(1, zero_bubble=zb)
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        order.backward(0, zero_bubble=zb)
    for _ in range(half - r - 1):              # 7: nWB0 (zero bubble)
        order.weight()
        order.backward(0, zero_bubble=True)
    for _ in range(r + 1):                     # 8: nW
        order.weight()


def _dual(name: str, p: int, m: int) -> Schedule:
    """DualPipe (bidirectional) or DualPipeV (V-shape): see the module docstring."""
    S = 2 * p
    placement = tuple(s if s < p else S - 1 - s for s in range(S))
    orders, slots = [], []
    for d in range(p):
        if name == "dualpipe":
            half, r, chunks = p // 2, min(d, p - 1 - d), m // 2
            own, other = (d, 0), (S - 1 - d, chunks)      # (virtual stage, first micro-batch) per direction
            ph = (own, other) if d < p // 2 else (other, own)
        else:
            half, r, chunks = p, d, m
            ph = ((d, 0), (S - 1 - d, 0))
        order = _DualOrder((ph[0][0], ph[1][0]), (ph[0][1], ph[1][1]))
        _dual_device(order, half, r, chunks)
        orders.append(tuple(order.ops))
        slots.append(tuple(order.sizes))
    chains = (tuple((0, p - 1) if mb < m // 2 else (p, S - 1) for mb in range(m)) if name == "dualpipe"
              else None)
    return Schedule(name, p, 2, m, tuple(orders), split_backward=True, slots=tuple(slots),
                    placement=placement, chains=chains)


def build_schedule(name: str, p: int, m: int, v: int = 1, *, paired: bool = False) -> Schedule:
    """The op order per device of schedule `name` (see module docstring). `paired`: interleaved 1F1B with
    EP overlap (one more warm-up, steady-state F and B as one overlapped op); only interleaved-1f1b."""
    check_shape(name, p, m, v)
    if name in DUAL:
        return _dual(name, p, m)
    if paired:
        if name != "interleaved-1f1b":
            raise ValueError(f"paired steady state needs interleaved-1f1b, not {name} (Megatron-Core refuses "
                             "EP overlap with PP > 1 without virtual stages)")
        orders, slots = _interleaved_paired(p, m, v)
        return Schedule(name, p, v, m, tuple(tuple(o) for o in orders), split_backward=False,
                        slots=tuple(tuple(x) for x in slots))
    if name == "gpipe":
        orders = _gpipe(p, m)
    elif name == "1f1b":
        orders = _one_f_one_b(p, m)
    elif name == "zb-h1":
        orders = _zb_h1(p, m)
    else:
        orders = _interleaved(p, m, v)
    return Schedule(name, p, v, m, tuple(tuple(o) for o in orders), split_backward=name == "zb-h1")


def op_dependencies(kind: int, stage: int, mb: int, num_stages: int, split_backward: bool, *,
                    first: int = 0, last: int | None = None) -> list[tuple[int, int, int]]:
    """Text ops an op needs finished: F(s) after F(s-1); B(s) after F(s) and B(s+1); W(s) after B(s),
    within the micro-batch's chain of stages `first`..`last` (default 0..num_stages-1)."""
    last = num_stages - 1 if last is None else last
    if kind == F:
        return [(F, stage - 1, mb)] if stage > first else []
    if kind == B:
        deps = [(F, stage, mb)]
        if stage < last:
            deps.append((B, stage + 1, mb))
        return deps
    if not split_backward:
        raise ValueError("W op in a schedule without split backward")
    return [(B, stage, mb)]


def dependency_graph(schedule: Schedule):
    """networkx DiGraph of the text ops: data edges (kind 'data') and device-order edges ('order').

    Used to validate a schedule (every op once, acyclic, so it cannot deadlock), not by the engine."""
    import networkx as nx

    g = nx.DiGraph()
    S = schedule.num_stages
    for d, order in enumerate(schedule.orders):
        for i, op in enumerate(order):
            g.add_node(op, device=d)
            if i:
                g.add_edge(order[i - 1], op, kind="order")
    head = slot_heads(schedule)
    for op in list(g.nodes):
        lo, hi = schedule.chain(op[2])
        for dep in op_dependencies(*op, S, schedule.split_backward, first=lo, last=hi):
            # a slot starts when every input of every op in it is ready: the input edge goes to its head,
            # and an input produced inside the same slot is no edge at all
            if head.get(dep, dep) != head.get(op, op):
                g.add_edge(dep, head.get(op, op), kind="data")
    return g


def slot_heads(schedule: Schedule) -> dict[tuple[int, int, int], tuple[int, int, int]]:
    """Each op that runs inside a slot of two or more ops -> the slot's first op."""
    out: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    if schedule.slots is None:
        return out
    for order, sizes in zip(schedule.orders, schedule.slots):
        i = 0
        for n in sizes:
            for op in order[i + 1:i + n]:
                out[op] = order[i]
            i += n
    return out


def validate_schedule(schedule: Schedule) -> None:
    """Raise ValueError unless every (kind, stage, mb) op appears exactly once, on its stage's
    device, and data + order edges form a DAG (no deadlock)."""
    import networkx as nx

    kinds = (F, B, W) if schedule.split_backward else (F, B)
    want = {(k, s, mb) for k in kinds for mb in range(schedule.m)
            for s in range(schedule.chain(mb)[0], schedule.chain(mb)[1] + 1)}
    if schedule.slots is not None and any(sum(sz) != len(o) for sz, o in zip(schedule.slots, schedule.orders)):
        raise ValueError(f"{schedule.name}: slot sizes do not cover the device orders")
    seen = [op for order in schedule.orders for op in order]
    if len(seen) != len(set(seen)) or set(seen) != want:
        raise ValueError(f"{schedule.name}: ops missing or repeated")
    for d, order in enumerate(schedule.orders):
        if any(schedule.device_of(s) != d for _, s, _ in order):
            raise ValueError(f"{schedule.name}: an op runs on a device that does not hold its stage")
    g = dependency_graph(schedule)
    if not nx.is_directed_acyclic_graph(g):
        raise ValueError(f"{schedule.name}: the order contradicts a data dependency (deadlock)")
