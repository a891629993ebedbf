"""A fleet of replicas behind a router, colocated or split into prefill and decode pools (P/D disaggregation).

Routers (arrivals go to the colocated replicas, or to the prefill pool):
- round-robin: in turn;
- least-loaded: fewest requests in the replica (waiting + running + held + incoming), lowest index on ties;
- prefix-aware: the replica whose prefix cache holds the longest prefix of the request, among the replicas at
  most `load_cap` requests above the least loaded (SGLang's cache-aware router: cache affinity unless the load
  imbalance passes `balance_abs_threshold`; Mooncake's Conductor weighs cache hits against load the same way).
  Blocks every request routed so far begins with (the fleet-wide common prefix: block 0 of a system prompt all
  requests share, as in Mooncake's conversation trace) count for no replica: every replica soon holds them, so
  an affinity to them would only pile the traffic onto whichever replica served the first request (up to the
  load cap) for no hit that the others would miss. Ties go to the least loaded.

P/D: a request finishes its prompt on a prefill replica (first token there), then the least-loaded decode
replica reserves pages for its context and whole output, and its MLA KV plus one KDA state and conv state move
over the network (`TransferModel`); the prefill replica keeps the pages until the bytes have left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k3sim.configs.serving import ROUTERS
from k3sim.serving.entities import RecordBook, Request
from k3sim.workloads.request import prefix_keys


@dataclass(frozen=True)
class TransferRow:
    component: str
    bytes: int
    source: str


def pd_transfer_rows(model, context_tokens: int) -> list[TransferRow]:
    """Bytes that move from a prefill to a decode replica for one request of `context_tokens` (whole model, one
    copy): the MLA layers' KV grows with the context; the KDA state and conv state are one fixed-size copy."""
    from k3sim.memory.sizes import (
        conv_state_bytes_per_request,
        kda_state_bytes_per_request,
        mla_kv_bytes_per_token,
        mla_kv_bytes_per_token_per_layer,
    )

    per_layer = mla_kv_bytes_per_token_per_layer(model)
    return [
        TransferRow("mla_kv", mla_kv_bytes_per_token(model) * context_tokens,
                    f"{model.num_mla_layers} MLA layers x {context_tokens} tokens x {per_layer} B "
                    "(memory.sizes.mla_kv_bytes_per_token)"),
        TransferRow("kda_state", kda_state_bytes_per_request(model),
                    f"{model.num_kda_layers} KDA layers' recurrent state (memory.sizes.kda_state_bytes_per_request)"),
        TransferRow("conv_state", conv_state_bytes_per_request(model),
                    "short-conv window of every KDA layer (memory.sizes.conv_state_bytes_per_request)"),
    ]


def pd_transfer_bytes(model, context_tokens: int) -> int:
    return sum(r.bytes for r in pd_transfer_rows(model, context_tokens))


class TransferModel:
    """Time of one P/D KV transfer: the bytes are striped over `links` GPU pairs (each prefill GPU sends to its
    decode counterpart, as Mooncake's transfer engine uses every NIC). Each pair is one `send_recv` of the one
    collective model (`k3sim.comm`, through `kernel_time`): inside one scale-up domain the calibrated NVLink
    send/recv; across nodes (`gpus_per_node` 1) the NIC link at the calibrated latency and achieved fraction."""

    def __init__(self, model, hw, links: int, same_domain: bool, kernel_time=None):
        if kernel_time is None:
            from k3sim.predict import predict_kernel_time as kernel_time
        self.model = model
        self.hw = hw
        self.links = max(1, links)
        self.same_domain = same_domain
        self.kernel_time = kernel_time
        from k3sim.memory.sizes import (
            conv_state_bytes_per_request,
            kda_state_bytes_per_request,
            mla_kv_bytes_per_token,
        )

        self.fixed_bytes = kda_state_bytes_per_request(model) + conv_state_bytes_per_request(model)
        self.bytes_per_token = mla_kv_bytes_per_token(model)
        self.total_bytes = 0
        self.transfers = 0

    def seconds(self, context_tokens: int) -> float:
        b = self.fixed_bytes + self.bytes_per_token * context_tokens
        self.total_bytes += b
        self.transfers += 1
        params = {"bytes": max(1, math.ceil(b / self.links)), "gpus": 2}
        if not self.same_domain:
            params["gpus_per_node"] = 1  # the two GPUs of a pair sit on different nodes: the NIC link
        return self.kernel_time("send_recv", params, hardware=self.hw).seconds


class Fleet:
    """Replicas, the router, arrivals, P/D hand-off, and the fleet-wide counters (Little's law, hit rate)."""

    def __init__(self, env, *, router: str = "least-loaded", load_cap: int = 32, transfer: TransferModel | None = None,
                 sample_interval_s: float = 1.0, hash_block_tokens: int = 512, progress=None):
        if router not in ROUTERS:
            from k3sim.errors import InputError

            raise InputError(f"unknown router '{router}' (choose {', '.join(ROUTERS)})", source="--router")
        self.env = env
        self.router = router
        self.load_cap = load_cap
        self.transfer = transfer
        self.front: list = []  # colocated replicas, or the prefill pool
        self.decode: list = []  # the decode pool (P/D)
        self.records = RecordBook()
        self.hash_block_tokens = hash_block_tokens
        self.next_arrival_s = math.inf
        self.arrivals_done = False
        self.arrived = 0
        self.in_system = 0
        self.area = 0.0  # integral of requests in system over time (request-seconds)
        self.last_t = 0.0
        self.rejected = 0
        self.rejected_sojourn_s = 0.0
        self.preemptions = 0
        self.input_tokens = 0
        self.hit_tokens = 0
        self.lower_hit_tokens = [0, 0]  # of which beyond a GPU-only lookup: host, SSD (offload tiers)
        self._rr = 0
        self._key = 0
        self.sample_interval_s = sample_interval_s
        self._next_sample = 0.0
        self.samples: list[tuple] = []  # (t, running, waiting, pinned bytes, cached bytes)
        self.progress = progress
        self.common: list | None = None  # prefix-aware: the hash keys every request routed so far begins with
        self.first_arrival_s = math.nan
        self.last_arrival_s = math.nan

    @property
    def replicas(self) -> list:
        """Every engine: each replica, or each rank of an attention-DP replica (`dp.DPReplica.ranks`)."""
        out = []
        for r in self.front + self.decode:
            out.extend(getattr(r, "ranks", (r,)))
        return out

    def _engine(self, req: Request):
        """The engine (replica, or its attention-DP rank) that prefilled `req`."""
        rep = self.front[req.replica]
        ranks = getattr(rep, "ranks", None)
        return rep if ranks is None else ranks[req.rank]

    def fresh_key(self) -> int:
        self._key -= 1  # negative: trace ids and blake2b keys are non-negative, so it matches nothing
        return self._key

    def count_hit(self, input_tokens: int, hit_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.hit_tokens += hit_tokens

    def count_lower_hit(self, host_tokens: int, ssd_tokens: int) -> None:
        self.lower_hit_tokens[0] += host_tokens
        self.lower_hit_tokens[1] += ssd_tokens

    # --------------------------------------------------------------- Little's law accounting
    def _tick(self) -> None:
        now = self.env.now
        self.area += self.in_system * (now - self.last_t)
        self.last_t = now

    # --------------------------------------------------------------- arrivals and routing
    def arrivals(self, requests):
        env = self.env
        B_h = self.hash_block_tokens
        rid = 0
        it = iter(requests)
        nxt = next(it, None)
        while nxt is not None:
            tr = nxt
            if tr.arrival_s > env.now:
                self.next_arrival_s = tr.arrival_s
                yield env.timeout(tr.arrival_s - env.now)
            req = Request(rid, env.now, tr.input_tokens, tr.output_tokens, prefix_keys(tr, B_h))
            if not rid:
                self.first_arrival_s = env.now
            self.last_arrival_s = env.now
            rid += 1
            self._tick()
            self.in_system += 1
            self.arrived += 1
            target = self.route(req)
            target.routed += 1
            target.submit(req)
            nxt = next(it, None)
            self.next_arrival_s = nxt.arrival_s if nxt is not None else math.inf
            if self.progress is not None:
                self.progress(1)
        self.arrivals_done = True

    def route(self, req: Request):
        reps = self.front
        if len(reps) == 1:
            return reps[0]
        if self.router == "round-robin":
            rep = reps[self._rr % len(reps)]
            self._rr += 1
            return rep
        loads = [r.load() for r in reps]
        low = min(loads)
        if self.router == "least-loaded":
            return reps[loads.index(low)]
        shared = self._common_blocks(req.keys)
        best, best_key = reps[0], None
        for rep, load in zip(reps, loads):
            if load > low + self.load_cap:
                continue
            key = (max(0, self._cached_prefix(rep, req.keys) - shared), -load, -rep.idx)
            if best_key is None or key > best_key:
                best, best_key = rep, key
        return best

    def _common_blocks(self, keys: list[int]) -> int:
        """Leading hash blocks every request routed so far (this one included) shares: the prefix-aware
        router's blocks that count for no replica."""
        common = self.common
        if common is None:
            self.common = list(keys)
            return len(keys)
        n = 0
        for a, b in zip(common, keys):
            if a != b:
                break
            n += 1
        if n < len(common):
            del common[n:]
        return n

    def router_summary(self) -> dict:
        """The router as the run's JSON reports it: its name, the prefix-aware load cap and the common prefix
        it ignored (hash blocks), and the requests each front engine was given (an engine: a replica, one of a
        replica's pp micro-batch engines, or an attention-DP replica with its own balancer)."""
        out = {"name": self.router, "requests_per_engine": [r.routed for r in self.front]}
        if self.router == "prefix-aware":
            out.update(load_cap=self.load_cap, ignored_common_blocks=len(self.common or ()),
                       hash_block_tokens=self.hash_block_tokens)
        return out

    @staticmethod
    def _cached_prefix(rep, keys: list[int]) -> int:
        """Hash blocks of `keys` whose MLA KV the replica's cache indexes (a read-only probe, no stats); an
        attention-DP replica answers for its ranks' caches."""
        if hasattr(rep, "ranks"):
            return rep.cached_blocks(keys)
        from k3sim.serving.dp import cached_blocks

        return cached_blocks(rep, keys)

    def horizon(self, rep) -> float:
        """The next outside event that could change what `rep` schedules."""
        if rep.role == "decode":
            # a landing KV transfer, a prefill step that may hand one off, or an arrival that starts one
            t = min(rep.next_landing_s, self.next_arrival_s)
            for p in self.front:
                if p.running and p.step_end_s > self.env.now:
                    t = min(t, p.step_end_s)
            return t
        return self.next_arrival_s

    # --------------------------------------------------------------- departures
    def complete(self, req: Request, now: float) -> None:
        self._tick()
        self.in_system -= 1
        self.records.add(req, now)

    def reject(self, req: Request) -> None:
        """Larger than the replica's whole pool: it leaves unserved (counted, not in the latency table)."""
        self._tick()
        self.in_system -= 1
        self.rejected += 1
        self.rejected_sojourn_s += self.env.now - req.arrival_s

    def reject_transfer(self, req: Request) -> None:
        prep = self._engine(req)
        prep.held.discard(req)
        prep.cache.release(req.rs)
        req.rs = None
        self.reject(req)

    # --------------------------------------------------------------- P/D hand-off
    def prefill_finished(self, req: Request, prep) -> None:
        if req.generated >= req.O:  # one output token: nothing to decode, the prefill replica answers
            prep.held.discard(req)
            prep.cache.release(req.rs)
            req.rs = None
            self.complete(req, self.env.now)
            return
        loads = [d.load() for d in self.decode]
        drep = self.decode[loads.index(min(loads))]
        req.decode_replica = drep.idx
        drep.accept_transfer(req)

    def start_transfer(self, req: Request, drep) -> None:
        t = self.transfer.seconds(req.context)
        req.transfer_s = t
        req.transfer_start_s = self.env.now
        drep.landing_times.append(self.env.now + t)
        drep.next_landing_s = min(drep.landing_times)
        self.env.process(self._move(req, drep, t))

    def _move(self, req: Request, drep, t: float):
        end = self.env.now + t
        yield self.env.timeout(t)
        drep.landing_times.remove(end)
        drep.next_landing_s = min(drep.landing_times, default=math.inf)
        prep = self._engine(req)
        prep.held.discard(req)
        prep.cache.release(req.rs)
        prep.wake()
        drep.land(req)
        self.after_step(drep)

    # --------------------------------------------------------------- time series
    def after_step(self, rep) -> None:
        now = self.env.now
        if now < self._next_sample:
            return
        self._next_sample = now + self.sample_interval_s
        running = waiting = pinned = cached = 0
        for r in self.replicas:
            running += len(r.running)
            waiting += len(r.waiting) + len(r.incoming)
            pinned += r.used_bytes()
            p = r.cache.pool
            cached += (len(p.lru) + p.parked) * r.cache.cfg.page_bytes
        self.samples.append((now, running, waiting, pinned, cached, self.in_system))
