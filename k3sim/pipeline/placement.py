"""Turn a schedule + stage costs (+ encoder work and a placement policy) into an engine program.

Encoder policies (the vision tower's work per micro-batch: forward EF, backward EB):
- none: text only.
- serial: all encoder forwards on device 0 before its first text forward, all encoder backwards after
  its last text op (the tower is a stage ahead of text stage 0 on device 0, as in torchtitan's
  kimi_k3 PR #4381).
- decoupled: Kimi K2.5's Decoupled Encoder Process as we read it (recalled, unverified; see
  domain-facts sec. 4): phase 1 encodes all micro-batches balanced over the p devices (micro-batch j on
  device j % p) and no text op starts before every encode has reached device 0; phase 3, after each
  device's text work, re-runs the encoder forward (no activations were kept) and its backward.
- bubble: Kimi K3 (report sec. 5.2.3; torchtitan `dep_bubble_plan.py`): on device 0 the first
  `upfront` micro-batches (default p) are encoded up front; the others go into device 0's idle gaps of
  the text-only timeline, each in a gap that precedes its consumer (text stage-0 forward of that
  micro-batch), earliest pending micro-batch first, as long as the gap's remaining budget covers its
  cost; what fits nowhere runs just before its consumer. Backwards likewise go into gaps after their
  producer (text stage-0 backward), the rest after the last text op. The engine then runs the
  resulting program, so the step time is simulated, not assumed from the plan.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from k3sim.errors import InputError
from k3sim.pipeline.engine import Program, Timeline, simulate
from k3sim.pipeline.schedules import B, KIND_NAMES, F, Schedule, op_dependencies
from k3sim.pipeline.stagecosts import StageCosts

POLICIES = ("none", "serial", "decoupled", "bubble")


@dataclass(frozen=True)
class EncoderWork:
    """Seconds of encoder work per micro-batch on one device, and the transfer of its output to (and
    of its gradient from) device 0 when it runs elsewhere (decoupled only)."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    send_s: float = 0.0

    @classmethod
    def uniform(cls, m: int, forward_s: float, backward_factor: float = 2.0) -> "EncoderWork":
        """`backward_factor` x forward: a modelling choice (backward = 2x the forward GEMM FLOPs)."""
        if forward_s < 0:
            raise InputError(f"encoder cost must be >= 0, got {forward_s}", source="--encoder-cost")
        return cls((forward_s,) * m, (backward_factor * forward_s,) * m)


@dataclass
class Placed:
    """A program plus where its ops are, for metrics."""

    program: Program
    schedule: Schedule
    policy: str
    text_ids: "_Ids"
    enc_forward_ids: list[int] = field(default_factory=list)
    enc_backward_ids: list[int] = field(default_factory=list)
    upfront: int = 0
    placed_forward: int = 0
    placed_backward: int = 0
    synchronous: list[int] = field(default_factory=list)
    overflow: str = "none"              # bubble: where encodes that fit no bubble went (inline | upfront)
    timeline: Timeline | None = None    # set when placement already simulated this program


class _Builder:
    def __init__(self, p: int):
        self.p = p
        self.cost: list[float] = []
        self.deps: list[tuple[tuple[int, bool], ...]] = []
        self.out_link: list[int] = []
        self.out_seconds: list[float] = []
        self.labels: list[tuple[str, int, int, int]] = []
        self.links: dict[tuple[int, int, str], int] = {}

    def op(self, cost: float, label: tuple[str, int, int, int]) -> int:
        self.cost.append(cost)
        self.deps.append(())
        self.out_link.append(-1)
        self.out_seconds.append(0.0)
        self.labels.append(label)
        return len(self.cost) - 1

    def link(self, src: int, dst: int, tag: str) -> int:
        key = (src, dst, tag)
        if key not in self.links:
            self.links[key] = len(self.links)
        return self.links[key]

    def add_dep(self, op: int, dep: int, remote: bool) -> None:
        self.deps[op] = (*self.deps[op], (dep, remote))

    def program(self, orders: list[list[int]]) -> Program:
        names = [f"{tag} {s}->{d}" for (s, d, tag) in sorted(self.links, key=self.links.get)]
        return Program(self.p, orders, self.cost, self.deps, self.out_link, self.out_seconds, self.labels, names)


def paired_seconds(f_compute: float, f_comm: float, b_compute: float, b_comm: float, sm_share: float = 1.0) -> float:
    """Seconds of one overlapped F&B op: a forward chunk of one micro-batch and a backward chunk of another,
    each one's EP all-to-all (dispatch, combine) hidden under the other's compute.

        T = max(Fc + Bc + (1 - s)(Fa + Ba),  Fa + Ba,  Fc + Fa,  Bc + Ba)

    DeepSeek-V3 (arXiv 2412.19437 sec. 3.2.1, fig. 4; the profile-data arrangement as MindSpeed's fb-overlap
    notes spell it per layer: attention(F) under combine(B), MLP(B) under dispatch(F), MLP(F) under
    dispatch(B), attention(B) under combine(F)): the two chunks' compute (c) runs on the compute stream and
    their all-to-alls (a) on the communication SMs, so the pair takes at least all the compute, at least all
    the communication, and at least either chunk alone (its own all-to-all waits on its own compute and vice
    versa); these bounds are what the per-layer interleave reaches when its slots balance (the report's "both
    all-to-all and PP communication can be fully hidden"). Compute that runs while an all-to-all is in flight
    keeps the share s of the SMs (DeepEP's normal kernels hold 20: `k3sim.comm.ep.comm_sms`, as the serving
    step's two-batch overlap charges it), i.e. it is stretched by (1 - s) of the communication time. Without
    communication T = Fc + Bc, the two chunks back to back."""
    comm = f_comm + b_comm
    return max(f_compute + b_compute + (1.0 - sm_share) * comm, comm, f_compute + f_comm, b_compute + b_comm)


def _slot_seconds(members, costs: StageCosts, split: bool) -> tuple[float, str]:
    """(seconds, label kind) of one slot: an op alone, a whole backward (B + W back to back), or an
    overlapped forward + backward pair (`paired_seconds`)."""
    cf, cb = costs.comm_forward_s, costs.comm_backward_s
    fc = fa = bc = ba = 0.0
    has_f = has_b = False
    for k, st, _ in members:
        if k == F:
            has_f = True
            a = cf[st] if cf is not None else 0.0
            fa += a
            fc += costs.forward_s[st] - a
        elif k == B:
            has_b = True
            a = cb[st] if cb is not None else 0.0
            ba += a
            bc += costs.backward_input_s[st] - a + (0.0 if split else costs.backward_weight_s[st])
        else:
            has_b = True
            bc += costs.backward_weight_s[st]
    if has_f and has_b:
        return paired_seconds(fc, fa, bc, ba, costs.comm_sm_share), "F&B"
    return fc + fa + bc + ba, KIND_NAMES[members[0][0]]


def _general_text(schedule: Schedule, costs: StageCosts, bld: _Builder) -> tuple[list[list[int]], "_Ids"]:
    """Text ops of a schedule with slots, its own placement or per-micro-batch chains (DualPipe, DualPipeV,
    the paired interleaved 1F1B). A slot becomes its ops in order, the first carrying the slot's seconds
    and every input any of them needs from outside the slot, the rest zero seconds: so every op of a slot
    finishes (and sends its output) when the slot does, as the repo's `_forward_backward_chunk` sends both
    outputs after the overlapped compute."""
    S, p, m = schedule.num_stages, schedule.p, schedule.m
    split = schedule.split_backward
    dev = [schedule.device_of(s) for s in range(S)]
    chunk = [sorted(t for t in range(S) if dev[t] == dev[s]).index(s) for s in range(S)]
    flat = [-1] * (3 * S * m)
    head: dict[int, int] = {}
    orders = []
    for d, order in enumerate(schedule.orders):
        ids, i = [], 0
        for n in schedule.slot_sizes(d):
            members = order[i:i + n]
            i += n
            sec, kind = _slot_seconds(members, costs, split)
            first = -1
            for j, (k, st, mb) in enumerate(members):
                op = bld.op(sec if j == 0 else 0.0, (kind if j == 0 else KIND_NAMES[k], st, chunk[st], mb))
                first = op if j == 0 else first
                head[op] = first
                flat[(k * S + st) * m + mb] = op
                ids.append(op)
        orders.append(ids)
    sf, sb = costs.send_forward_s, costs.send_backward_s
    for (k, st, mb), op in _Ids(flat, S, m).items():
        lo, hi = schedule.chain(mb)
        for dk, ds, dmb in op_dependencies(k, st, mb, S, split, first=lo, last=hi):
            dep = flat[(dk * S + ds) * m + dmb]
            if head[dep] != head[op]:
                bld.add_dep(head[op], dep, dev[ds] != dev[st])
        nxt = st + 1 if k == F and st < hi else st - 1 if k == B and st > lo else -1
        if nxt >= 0 and dev[nxt] != dev[st]:
            bld.out_link[op] = bld.link(dev[st], dev[nxt], "act" if k == F else "grad")
            bld.out_seconds[op] = sf[st] if k == F else sb[st]
    return orders, _Ids(flat, S, m)


def _text(schedule: Schedule, costs: StageCosts, bld: _Builder) -> tuple[list[list[int]], "_Ids"]:
    """Text ops of `schedule` into `bld` (the hot part of building a program: kept to flat lists)."""
    S, p, m = schedule.num_stages, schedule.p, schedule.m
    if costs.num_stages != S:
        raise ValueError(f"costs for {costs.num_stages} virtual stages, schedule has {S}")
    if schedule.general:
        return _general_text(schedule, costs, bld)
    split = schedule.split_backward
    fwd = costs.forward_s
    bwd = costs.backward_input_s if split else tuple(a + b for a, b in zip(costs.backward_input_s,
                                                                          costs.backward_weight_s))
    wgt = costs.backward_weight_s
    flat = [-1] * (3 * S * m)                      # (kind * S + stage) * m + mb -> op id
    per_kind = (fwd, bwd, wgt)
    cost, labels = bld.cost, bld.labels
    orders = []
    for order in schedule.orders:
        base = len(cost)
        orders.append(list(range(base, base + len(order))))
        cost.extend([per_kind[k][st] for k, st, _ in order])
        labels.extend([(KIND_NAMES[k], st, st // p, mb) for k, st, mb in order])
        for i, (k, st, mb) in enumerate(order, base):
            flat[(k * S + st) * m + mb] = i
    n = len(cost)
    deps: list[tuple[tuple[int, bool], ...]] = [()] * n
    out_link = [-1] * n
    out_seconds = [0.0] * n
    remote_next = [(st + 1) % p != st % p for st in range(S)]
    fl = [bld.link(st % p, (st + 1) % p, "act") if st < S - 1 and remote_next[st] else -1 for st in range(S)]
    bl = [bld.link(st % p, (st - 1) % p, "grad") if st > 0 and remote_next[st - 1] else -1 for st in range(S)]
    sf, sb = costs.send_forward_s, costs.send_backward_s
    for st in range(S):
        fs = flat[st * m:(st + 1) * m]
        bs = flat[(S + st) * m:(S + st + 1) * m]
        if st > 0:
            prev, rem = flat[(st - 1) * m:st * m], remote_next[st - 1]
            for f, pf in zip(fs, prev):
                deps[f] = ((pf, rem),)
        if st < S - 1:
            nxt, rem = flat[(S + st + 1) * m:(S + st + 2) * m], remote_next[st]
            for f, b, nb in zip(fs, bs, nxt):
                deps[b] = ((f, False), (nb, rem))
            if fl[st] >= 0:
                link, sec = fl[st], sf[st]
                for f in fs:
                    out_link[f] = link
                    out_seconds[f] = sec
        else:
            for f, b in zip(fs, bs):
                deps[b] = ((f, False),)
        if st > 0 and bl[st] >= 0:
            link, sec = bl[st], sb[st]
            for b in bs:
                out_link[b] = link
                out_seconds[b] = sec
        if split:
            for w, b in zip(flat[(2 * S + st) * m:(2 * S + st + 1) * m], bs):
                deps[w] = ((b, False),)
    bld.deps, bld.out_link, bld.out_seconds = deps, out_link, out_seconds
    return orders, _Ids(flat, S, m)


class _Ids:
    """(kind, stage, mb) -> op id over the flat index, with the dict-like access placement uses."""

    def __init__(self, flat: list[int], S: int, m: int):
        self.flat, self.S, self.m = flat, S, m

    def __getitem__(self, key: tuple[int, int, int]) -> int:
        kind, st, mb = key
        i = self.flat[(kind * self.S + st) * self.m + mb]
        if i < 0:
            raise KeyError(key)
        return i

    def items(self):
        S, m = self.S, self.m
        for idx, i in enumerate(self.flat):
            if i >= 0:
                yield (idx // (S * m), (idx // m) % S, idx % m), i


def text_program(schedule: Schedule, costs: StageCosts) -> Placed:
    bld = _Builder(schedule.p)
    orders, ids = _text(schedule, costs, bld)
    return Placed(bld.program(orders), schedule, "none", ids)


def _gaps(timeline: Timeline, order: list[int]) -> list[tuple[int, float, float]]:
    """Idle gaps of one device: (index in order after which it opens, start, length), in time order."""
    out = []
    for i in range(1, len(order)):
        a, b = timeline.finish[order[i - 1]], timeline.start[order[i]]
        if b > a:
            out.append((i - 1, a, b - a))
    return out


def place(schedule: Schedule, costs: StageCosts, encoder: EncoderWork | None, policy: str,
          *, upfront: int | None = None) -> Placed:
    """Build the program of `policy` (see module docstring)."""
    if policy not in POLICIES:
        raise InputError(f"unknown encoder policy {policy!r}; one of {', '.join(POLICIES)}",
                         source="--encoder-policy")
    if policy == "none" or encoder is None:
        return text_program(schedule, costs)
    if schedule.chains is not None:
        raise InputError(f"encoder policy {policy!r} places the encoder ahead of device 0, where {schedule.name} "
                         "feeds only half the micro-batches: use --encoder-policy none, or dualpipev",
                         source="--encoder-policy")
    m, p = schedule.m, schedule.p
    if len(encoder.forward_s) != m or len(encoder.backward_s) != m:
        raise ValueError(f"encoder work for {len(encoder.forward_s)} micro-batches, schedule has {m}")
    bld = _Builder(p)
    orders, ids = _text(schedule, costs, bld)
    ef = [bld.op(encoder.forward_s[j], ("EF", -1, -1, j)) for j in range(m)]
    eb_cost = [encoder.backward_s[j] + (encoder.forward_s[j] if policy == "decoupled" else 0.0) for j in range(m)]
    eb = [bld.op(eb_cost[j], ("EB", -1, -1, j)) for j in range(m)]
    placed = Placed(None, schedule, policy, ids, ef, eb)  # type: ignore[arg-type]
    if policy == "serial":
        for j in range(m):
            bld.add_dep(ids[(F, 0, j)], ef[j], False)
            bld.add_dep(eb[j], ids[(B, 0, j)], False)
        orders[0] = ef + orders[0] + eb
    elif policy == "decoupled":
        _link_encoder(bld, ids, ef, eb, [j % p for j in range(m)], encoder.send_s)
        first = ids[(F, 0, 0)]
        for j in range(m):                             # phase barrier: text starts after every encode
            bld.add_dep(first, ef[j], j % p != 0)
        for d in range(p):
            mine = list(range(d, m, p))
            orders[d] = [ef[j] for j in mine] + orders[d] + [eb[j] for j in mine]
    else:
        return _bubble_best(schedule, costs, encoder, p if upfront is None else upfront)
    placed.program = bld.program(orders)
    return placed


def _link_encoder(bld: _Builder, ids: dict, ef: list[int], eb: list[int], dev: list[int],
                  send_s: float) -> None:
    """Encoder output j feeds text stage 0's forward of j; its gradient comes back from stage 0's
    backward of j; both travel over a link when the encode ran off device 0."""
    for j, d in enumerate(dev):
        remote = d != 0
        bld.add_dep(ids[(F, 0, j)], ef[j], remote)
        bld.add_dep(eb[j], ids[(B, 0, j)], remote)
        if remote:
            bld.out_link[ef[j]] = bld.link(d, 0, "enc")
            bld.out_seconds[ef[j]] = send_s
            bld.out_link[ids[(B, 0, j)]] = bld.link(0, d, "enc-grad")
            bld.out_seconds[ids[(B, 0, j)]] = send_s


def _bubble_best(schedule: Schedule, costs: StageCosts, encoder: EncoderWork, upfront: int) -> Placed:
    """K3 placement (see `_bubble`), with two ways to treat encodes that fit in no bubble: run them on
    device 0 just before their consumer (torchtitan's "synchronous"), or add them to the up-front
    encodes, balanced over the devices; both plans are simulated and the faster is kept (the plan is
    offline and identical on every rank, as in torchtitan)."""
    p, m = schedule.p, schedule.m
    if upfront < 0:
        raise InputError(f"upfront encodes must be >= 0, got {upfront}", source="--encoder-upfront")
    u = min(upfront, m)
    first = {j: j % p for j in range(u)}
    inline = _bubble(schedule, costs, encoder, first)
    if not inline.synchronous:
        return _not_worse_than_serial(schedule, costs, encoder, inline)
    load = [0.0] * p
    assign = dict(first)
    for j, d in first.items():
        load[d] += encoder.forward_s[j]
    for j in sorted(inline.synchronous, key=lambda j: -encoder.forward_s[j]):   # longest first
        d = min(range(p), key=load.__getitem__)
        assign[j] = d
        load[d] += encoder.forward_s[j]
    ahead = _bubble(schedule, costs, encoder, assign)
    inline.timeline = simulate(inline.program)
    ahead.timeline = simulate(ahead.program)
    best = ahead if ahead.timeline.step_time_s < inline.timeline.step_time_s else inline
    best.overflow = "upfront" if best is ahead else "inline"
    return _not_worse_than_serial(schedule, costs, encoder, best)


def _not_worse_than_serial(schedule: Schedule, costs: StageCosts, encoder: EncoderWork, plan: Placed) -> Placed:
    """The greedy gap filling can lose to the serial positions (hypothesis found one: ZB-H1 with one
    encoder backward whose gradient arrives late); the plan is offline, so the planner keeps serial's
    positions then, and says so (`overflow = "serial kept"`)."""
    if plan.timeline is None:
        plan.timeline = simulate(plan.program)
    serial = place(schedule, costs, encoder, "serial")
    serial_tl = simulate(serial.program)
    if serial_tl.step_time_s < plan.timeline.step_time_s - 1e-12:
        serial.timeline, serial.policy, serial.overflow = serial_tl, "bubble", "serial kept"
        serial.upfront = serial.placed_forward = serial.placed_backward = 0
        serial.synchronous = list(range(schedule.m))
        return serial
    return plan


def _bubble(schedule: Schedule, costs: StageCosts, encoder: EncoderWork, up: dict[int, int]) -> Placed:
    """K3 placement over every device's gaps (each PP rank holds a vision replica, as in DEP).

    1. The encodes in `up` (micro-batch -> device) run up front.
    2. Simulate text + those; walk all devices' idle gaps in time order and put each pending encode
       (earliest micro-batch first) where it finishes, and its output arrives at device 0, before its
       consumer starts; encodes that fit nowhere run on device 0 just before the consumer.
    3. Each encoder backward runs on the device that holds its forward's activations, in a gap that
       opens after its gradient arrives, else after that device's last text op.
    """
    p, m = schedule.p, schedule.m
    send = encoder.send_s
    bld = _Builder(p)
    orders, ids = _text(schedule, costs, bld)
    ef = [bld.op(encoder.forward_s[j], ("EF", -1, -1, j)) for j in range(m)]
    eb_cost = list(encoder.backward_s)
    eb = [bld.op(eb_cost[j], ("EB", -1, -1, j)) for j in range(m)]
    placed = Placed(None, schedule, "bubble", ids, ef, eb)  # type: ignore[arg-type]
    # step 1-2: timeline of text + upfront encodes
    tl, porders, pids, head = _bubble_probe(schedule, costs, encoder, up)
    consumer = [tl.start[pids[(F, 0, j)]] for j in range(m)]
    producer = [tl.finish[pids[(B, 0, j)]] for j in range(m)]
    # consumers (stage-0 forwards) and producers (stage-0 backwards) run in micro-batch order on
    # device 0, so both time lists grow with j: eligibility is a suffix / prefix found by bisection
    pend = [j for j in range(m) if j not in up]
    min_f = min((encoder.forward_s[j] for j in pend), default=0.0)
    min_b = min(eb_cost, default=0.0)
    shortest = min(min_f, min_b)
    gaps = sorted((g_start, d, idx, g_len) for d in range(p)
                  for idx, g_start, g_len in _gaps(tl, porders[d]) if g_len >= shortest)
    used = [0.0] * len(gaps)
    dev = [up.get(j, -1) for j in range(m)]
    after: dict[tuple[int, int], list[int]] = {}
    _bubble_forwards(placed, encoder, up, gaps, used, after, pend, consumer, dev, p, min_f)
    sync = set(pend)
    for j in sync:
        dev[j] = 0
    pend_b: list[list[int]] = [[] for _ in range(p)]
    for j in range(m):
        pend_b[dev[j]].append(j)
    _bubble_backwards(placed, eb_cost, send, gaps, used, after, pend_b, producer, min_b)
    _bubble_orders(orders, ids, ef, eb, head, after, sync, pend_b, p)
    _link_encoder(bld, ids, ef, eb, dev, send)
    placed.upfront = len(up)
    placed.synchronous = sorted(sync)
    placed.program = bld.program(orders)
    return placed


def _bubble_probe(schedule: Schedule, costs: StageCosts, encoder: EncoderWork, up: dict[int, int]):
    """Simulate the text schedule plus the up-front encodes alone (a throw-away builder), so the gaps and
    the consumer / producer times the greedy placement reads are those the final program starts from.
    Returns the timeline, the probe's per-device orders and op ids, and each device's up-front encodes."""
    p = schedule.p
    send = encoder.send_s
    probe = _Builder(p)
    porders, pids = _text(schedule, costs, probe)
    ups = sorted(up)
    pef = {j: probe.op(encoder.forward_s[j], ("EF", -1, -1, j)) for j in ups}
    peb = {j: probe.op(0.0, ("EB", -1, -1, j)) for j in ups}
    for j in ups:
        d = up[j]
        probe.add_dep(pids[(F, 0, j)], pef[j], d != 0)
        if d != 0:
            probe.out_link[pef[j]] = probe.link(d, 0, "enc")
            probe.out_seconds[pef[j]] = send
    head = [[j for j in ups if up[j] == d] for d in range(p)]
    for d in range(p):
        porders[d] = [pef[j] for j in head[d]] + porders[d]
    tl = simulate(probe.program(porders))
    del peb
    return tl, porders, pids, head


def _bubble_forwards(placed: Placed, encoder: EncoderWork, up: dict[int, int], gaps, used, after, pend,
                     consumer, dev, p: int, min_f: float) -> None:
    """Step 2: put pending encodes into gaps, in time order, where they finish (plus the send to device 0)
    before their consumer starts; placed encodes leave `pend`, what is left there runs synchronously."""
    send = encoder.send_s
    m = len(consumer)
    eb_cost = list(encoder.backward_s)
    ef = placed.enc_forward_ids
    # a device that encodes micro-batch j also runs its backward (it holds the activations), so no
    # device takes more than a balanced share of the encoder work (plus one encode): otherwise one
    # early, long gap collects many forwards whose backwards then pile up on that device
    work = [encoder.forward_s[j] + eb_cost[j] for j in range(m)]
    cap = sum(work) / p + max(work, default=0.0)
    owned = [0.0] * p
    for j, d in up.items():
        owned[d] += work[j]
    for gi, (g_start, d, idx, g_len) in enumerate(gaps):
        if not pend or g_len - used[gi] < min_f:
            continue
        lag = send if d else 0.0
        i = bisect.bisect_left(pend, g_start, key=lambda j: consumer[j])
        while i < len(pend) and g_len - used[gi] >= min_f:
            j = pend[i]
            c = encoder.forward_s[j]
            if (used[gi] + c <= g_len and g_start + used[gi] + c + lag <= consumer[j]
                    and owned[d] + work[j] <= cap):
                owned[d] += work[j]
                after.setdefault((d, idx), []).append(ef[j])
                used[gi] += c
                dev[j] = d
                pend.pop(i)
                placed.placed_forward += 1
            else:
                i += 1


def _bubble_backwards(placed: Placed, eb_cost, send: float, gaps, used, after, pend_b, producer,
                      min_b: float) -> None:
    """Step 3: put each encoder backward into a gap of the device that holds its activations, opening
    after its gradient arrives; backwards placed leave `pend_b`, the rest run after the last text op."""
    eb = placed.enc_backward_ids
    for gi, (g_start, d, idx, g_len) in enumerate(gaps):
        mine = pend_b[d]
        lag = send if d else 0.0
        i = 0
        while i < len(mine) and g_len - used[gi] >= min_b:
            j = mine[i]
            if producer[j] + lag > g_start + used[gi]:
                break                                   # later micro-batches are produced later still
            c = eb_cost[j]
            if used[gi] + c <= g_len:
                after.setdefault((d, idx), []).append(eb[j])
                used[gi] += c
                mine.pop(i)
                placed.placed_backward += 1
            else:
                i += 1


def _bubble_orders(orders, ids, ef, eb, head, after, sync, pend_b, p: int) -> None:
    """Assemble each device's final order: its up-front encodes first, every gap placement right after
    the op that opens the gap (the probe's op index, offset by the up-front encodes it started with),
    synchronous encodes just before their consumer on device 0, unplaced backwards last."""
    before0 = {ids[(F, 0, j)]: ef[j] for j in sync}
    for d in range(p):
        new = [ef[j] for j in head[d]]
        k = len(new)                   # the probe's orders start with these k upfront encodes
        for i in range(k):
            new.extend(after.get((d, i), ()))
        for i, op in enumerate(orders[d]):
            if d == 0 and op in before0:
                new.append(before0[op])
            new.append(op)
            new.extend(after.get((d, i + k), ()))
        new.extend(eb[j] for j in pend_b[d])
        orders[d] = new
