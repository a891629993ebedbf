"""Request state inside the engine, and the compact per-request record a finished request leaves behind.

Vidur's split (microsoft/vidur `entities/`): a `Request` lives only while it is in the system; once it
completes, one row of plain numbers goes into `RecordBook` (typed arrays, a few dozen bytes a request) and the
object is dropped, so a million-request trace runs in memory bounded by what is in flight.
"""

from __future__ import annotations

from array import array

NAN = float("nan")


class Request:
    """One request while it is in the system.

    `L` is the prompt, `O` the output tokens (at least 1: the last prefill forward yields the first token).
    `target` is what must be prefilled before decoding resumes: the prompt, or prompt + generated tokens after a
    preemption by recompute. `rs` is the prefix cache's view (block table, private KDA state, progress)."""

    __slots__ = ("rid", "arrival_s", "L", "O", "keys", "rs", "target", "generated", "scheduled_s",
                 "first_token_s", "hit_tokens", "preemptions", "replica", "decode_replica", "prefill_done_s",
                 "transfer_s", "admitted", "seq", "done", "rs_decode", "rank", "carry", "route_tokens",
                 "transfer_start_s")

    def __init__(self, rid: int, arrival_s: float, L: int, O: int, keys: list[int]):
        self.rid = rid
        self.arrival_s = arrival_s
        self.L = L
        self.O = max(O, 1)
        self.keys = keys
        self.rs = None
        self.target = L
        self.generated = 0
        self.scheduled_s = NAN  # first time any of its tokens ran
        self.first_token_s = NAN
        self.hit_tokens = -1  # prefix-cache hit at first admission (-1: not admitted yet)
        self.preemptions = 0
        self.replica = -1
        self.decode_replica = -1
        self.prefill_done_s = NAN
        self.transfer_s = 0.0
        self.transfer_start_s = NAN  # P/D: when a decode replica reserved its pages and the KV started moving
        self.admitted = False
        self.seq = 0  # admission order on its replica (preemption victim: the latest)
        self.done = False  # set for one step's bookkeeping
        self.rs_decode = None  # P/D: the decode replica's pages while the KV is in flight
        self.rank = 0  # attention-DP rank of its (prefill) replica that serves it
        self.carry = 0.0  # MTP: the fraction of a token banked toward the next one (expected acceptance)
        self.route_tokens = 0  # attention DP: prefill tokens it still adds to its rank's balancer backlog

    @property
    def context(self) -> int:
        """Tokens whose KV the next decode step attends to (prompt + generated so far)."""
        return self.L + self.generated


RECORD_COLUMNS = ("request", "arrival_s", "scheduled_s", "first_token_s", "completion_s", "input_tokens",
                  "output_tokens", "hit_tokens", "preemptions", "replica", "rank", "decode_replica", "transfer_s",
                  "transfer_start_s")


class RecordBook:
    """Column arrays of finished requests (typed `array`s: no per-request Python object survives)."""

    def __init__(self) -> None:
        self.request = array("q")
        self.arrival_s = array("d")
        self.scheduled_s = array("d")
        self.first_token_s = array("d")
        self.completion_s = array("d")
        self.input_tokens = array("q")
        self.output_tokens = array("q")
        self.hit_tokens = array("q")
        self.preemptions = array("l")
        self.replica = array("l")
        self.rank = array("l")  # attention-DP rank of `replica` that prefilled it (0 without attention DP)
        self.decode_replica = array("l")
        self.transfer_s = array("d")
        self.transfer_start_s = array("d")  # P/D: the KV transfer's start (NaN: colocated, or no decode)

    def add(self, r: Request, completion_s: float) -> None:
        self.request.append(r.rid)
        self.arrival_s.append(r.arrival_s)
        self.scheduled_s.append(r.scheduled_s)
        self.first_token_s.append(r.first_token_s)
        self.completion_s.append(completion_s)
        self.input_tokens.append(r.L)
        self.output_tokens.append(r.O)
        self.hit_tokens.append(max(r.hit_tokens, 0))
        self.preemptions.append(r.preemptions)
        self.replica.append(r.replica)
        self.rank.append(r.rank)
        self.decode_replica.append(r.decode_replica)
        self.transfer_s.append(r.transfer_s)
        self.transfer_start_s.append(r.transfer_start_s)

    def __len__(self) -> int:
        return len(self.request)

    def columns(self) -> dict:
        """numpy arrays by column name."""
        import numpy as np

        return {c: np.frombuffer(getattr(self, c), dtype=getattr(self, c).typecode) if len(self) else
                np.zeros(0, dtype=getattr(self, c).typecode) for c in RECORD_COLUMNS}

    def frame(self):
        """pandas DataFrame, one row per finished request, with derived latencies (s)."""
        import pandas as pd

        df = pd.DataFrame(self.columns())
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        df["e2e_s"] = df["completion_s"] - df["arrival_s"]
        df["queue_s"] = df["scheduled_s"] - df["arrival_s"]
        out = df["output_tokens"]
        df["tpot_s"] = ((df["completion_s"] - df["first_token_s"]) / (out - 1)).where(out > 1)
        return df
