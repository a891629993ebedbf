"""Streaming reader/writer for Mooncake FAST'25 JSONL traces.

Format (kvcache-ai/Mooncake FAST25-release/traces): one JSON object per line with `timestamp` (ms, relative),
`input_length`, `output_length` (tokens) and `hash_ids` (chained ids of 512-token blocks,
len == ceil(input_length / 512)). Lines are streamed once through `k3sim.reader.iter_lines`, so a
million-request file never sits in memory, a trace from a pipe (`<(...)`, a FIFO) is validated while it is
consumed (there is no second pass), and a line or a file past its cap (below) is refused with its number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from k3sim import reader
from k3sim.configs.bounds import BOUNDS
from k3sim.errors import InputError, shorten
from k3sim.workloads.request import TraceRequest

MOONCAKE_BLOCK_TOKENS = 512
# One request's input or output length: the documented range of k3sim.configs.bounds (a replay steps through
# every output token, so 1e15 would run for days).
MAX_REQUEST_TOKENS = int(BOUNDS["request_tokens"].hi)

# Bytes of one hash id written in JSON with its separator: a 64-bit id has at most 20 digits, then ", ".
_ID_BYTES = len(str(2 ** 64)) + len(", ")
# Bytes of a line besides its hash ids: the four keys, their punctuation and the three numbers (generous).
_FIELDS_BYTES = 1024


def max_line_bytes(block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """Longest trace line read (bytes): twice the longest valid line written compactly (a request of
    `MAX_REQUEST_TOKENS` input tokens carries ceil(that / block_tokens) hash ids of up to 20 digits), the
    factor two for looser whitespace. 1.4 MB at 512-token blocks; the shipped traces' longest line is 2.7 kB.
    A longer line (`/dev/zero` through a pipe, a file with no newlines) is refused with its number before it
    grows in memory."""
    return 2 * (-(-MAX_REQUEST_TOKENS // block_tokens) * _ID_BYTES + _FIELDS_BYTES)


# Largest trace read (bytes). A modelling choice: ~1,400x the shipped 3 MB conversation trace (12,031
# requests), ~17 million requests at its 250 bytes a line: a replay of that runs for hours. A pipe that never
# ends (`yes`) is stopped here instead of running forever.
MAX_TRACE_BYTES = 4 * 2 ** 30
# Most lines read (blank and skipped ones count): the same ~1,400x, at the shipped trace's ~256 bytes a line.
# Bounds the work of a pipe of tiny lines (`yes`, `yes ''`), which the byte cap alone lets run for many minutes.
MAX_TRACE_LINES = MAX_TRACE_BYTES // 256
# Malformed lines skipped before the first valid request after which a file is no trace at all (`yes` through a
# pipe would otherwise be parsed line by line up to MAX_TRACE_LINES, ~90 s). A modelling choice: a real trace
# with a damaged head has a few bad lines, not ten thousand.
MAX_LEADING_MALFORMED = 10_000


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
    require_requests: bool = False,
) -> Iterator[TraceRequest]:
    """Yield requests in file order, reading the file (or pipe) exactly once. A malformed line (bad JSON,
    negative length, hash_ids inconsistent with input_length, time going backwards) raises `InputError` naming
    its line when `strict`, else is skipped and counted in `stats`. A line or a file over its cap
    (`max_line_bytes`, `MAX_TRACE_BYTES`) always raises. `require_requests`: a trace that ends without one
    valid request raises at its end (the single pass's replacement for a counting pass)."""
    stats = stats if stats is not None else TraceStats()
    # lines decoded one by one: a line that is not UTF-8 is malformed, not a crash
    lines = reader.iter_lines(path, source=str(path), what="Mooncake JSONL trace",
                              max_line_bytes=max_line_bytes(block_tokens), max_bytes=MAX_TRACE_BYTES)
    last_ts = 0.0
    if limit is not None and limit <= 0:
        return
    try:
        for lineno, raw in lines:
            if lineno > MAX_TRACE_LINES:
                raise InputError(f"line {lineno:,}: more than {MAX_TRACE_LINES:,} lines, the most a trace may "
                                 "have (a bound on the work); replay a part of it", source=str(path))
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
                if stats.requests == 0 and stats.skipped >= MAX_LEADING_MALFORMED:
                    raise no_requests_error(path, stats, f"in its first {stats.skipped:,} non-blank lines")
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
            if limit is not None and stats.requests >= limit:
                return  # no further line is read: a pipe's writer is not waited for
    finally:
        lines.close()  # the file is closed however the iteration ends (a consumer may stop early)
    if require_requests and stats.requests == 0:
        raise no_requests_error(path, stats)


def no_requests_error(path: str | Path, stats: TraceStats, where: str = "in the trace") -> InputError:
    """The error of a trace that held no valid request (empty, or every line malformed and skipped)."""
    first = f"; first: line {stats.problems[0][0]}: {stats.problems[0][1]}" if stats.problems else ""
    return InputError(f"no valid request {where} ({stats.skipped:,} malformed lines skipped{first}); give "
                      "a Mooncake JSONL trace with at least one request", source=str(path))


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
