"""Streaming reader/writer for Mooncake FAST'25 JSONL traces.

Format (kvcache-ai/Mooncake FAST25-release/traces): one JSON object per line with `timestamp` (ms, relative),
`input_length`, `output_length` (tokens) and `hash_ids` (chained ids of 512-token blocks,
len == ceil(input_length / 512)). Lines are read one at a time so a million-request file never sits in memory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from k3sim.configs.bounds import BOUNDS
from k3sim.errors import InputError, shorten
from k3sim.workloads.request import TraceRequest

MOONCAKE_BLOCK_TOKENS = 512
# One request's input or output length: the documented range of k3sim.configs.bounds (a replay steps through
# every output token, so 1e15 would run for days).
MAX_REQUEST_TOKENS = int(BOUNDS["request_tokens"].hi)


def _short(value: object, limit: int = 40) -> str:
    """An echoed field value cut short, so a problem line stays readable."""
    return shorten(repr(value), limit)


@dataclass
class TraceStats:
    """What the reader saw: filled in while iterating."""

    lines: int = 0
    requests: int = 0
    skipped: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason), first 20 kept

    def note(self, line: int, reason: str) -> None:
        self.skipped += 1
        if len(self.problems) < 20:
            self.problems.append((line, reason))


def _check(rec: object, block_tokens: int, last_ts: float) -> str | None:
    """The reason a parsed record is malformed, or None."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in rec:
            return f"missing field '{key}'"
    ts, n_in, n_out, ids = rec["timestamp"], rec["input_length"], rec["output_length"], rec["hash_ids"]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
        return f"timestamp {_short(ts)} is not a non-negative number"
    if ts / 1e3 < last_ts:
        return f"timestamp {ts} ms is earlier than the previous request's"
    for key, v in (("input_length", n_in), ("output_length", n_out)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return f"{key} {_short(v)} is not a non-negative integer"
        if v > MAX_REQUEST_TOKENS:
            return f"{key} {v:,} exceeds {MAX_REQUEST_TOKENS:,} tokens ({BOUNDS['request_tokens'].why})"
    if n_in == 0:
        return "input_length is 0"
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return "hash_ids is not a list of integers"
    want = -(-n_in // block_tokens)
    if len(ids) != want:
        return f"{len(ids)} hash_ids for input_length {n_in} (expected ceil({n_in}/{block_tokens}) = {want})"
    return None


def read_mooncake(
    path: str | Path,
    *,
    strict: bool = False,
    stats: TraceStats | None = None,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    limit: int | None = None,
) -> Iterator[TraceRequest]:
    """Yield requests in file order. A malformed line (bad JSON, negative length, hash_ids inconsistent with
    input_length, time going backwards) raises `InputError` naming its line when `strict`, else is skipped and
    counted in `stats`."""
    stats = stats if stats is not None else TraceStats()
    p = Path(path)
    try:
        fh = open(p, "rb")  # lines decoded one by one: a line that is not UTF-8 is malformed, not a crash
    except OSError as err:
        raise InputError(f"cannot read trace: {err.strerror}", source=str(path)) from None
    last_ts = 0.0
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            if limit is not None and stats.requests >= limit:
                return
            stats.lines += 1
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
                reason = _check(rec, block_tokens, last_ts)
            except UnicodeDecodeError:
                reason = "not UTF-8 text"
            except json.JSONDecodeError as err:
                reason = f"bad JSON ({err.msg})"
            except ValueError:  # json.loads' other ValueError: an integer past Python's digit limit
                reason = "bad JSON (an integer with too many digits)"
            except RecursionError:
                reason = "bad JSON (nested too deeply)"
            if reason is not None:
                if strict:
                    raise InputError(f"line {lineno}: {reason}", source=str(path))
                stats.note(lineno, reason)
                continue
            last_ts = rec["timestamp"] / 1e3
            stats.requests += 1
            yield TraceRequest(
                arrival_s=last_ts,
                input_tokens=rec["input_length"],
                output_tokens=rec["output_length"],
                block_ids=rec["hash_ids"],
                block_tokens=block_tokens,
                line=lineno,
            )


def write_mooncake(requests: Iterable[TraceRequest], path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """Write requests as Mooncake JSONL (atomically); token-level requests get chained ids of `block_tokens`
    blocks, with the partial last block hashed too, as Mooncake does. Returns the number written."""
    from k3sim.workloads.request import _chain_token_blocks

    from k3sim.files import atomic_path

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    remap: dict[int, int] = {}
    n = 0
    with atomic_path(p) as tmp:
        with open(tmp, "w") as out:
            for r in requests:
                if r.tokens is not None:
                    toks = list(r.tokens)
                    pad = (-len(toks)) % block_tokens
                    # a partial last block gets its own id: pad with a marker no real token uses
                    keys = _chain_token_blocks(toks + [-1] * pad, block_tokens)
                    ids = [remap.setdefault(k, len(remap)) for k in keys]
                else:
                    ids = list(r.block_ids or ())
                rec = {"timestamp": int(round(r.arrival_s * 1e3)), "input_length": r.input_tokens,
                       "output_length": r.output_tokens, "hash_ids": ids}
                out.write(json.dumps(rec) + "\n")
                n += 1
    return n
