import json
from pathlib import Path

import pytest

from k3sim.errors import InputError
from k3sim.workloads import TraceRequest, TraceStats, prefix_keys, read_mooncake, write_mooncake

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_reads_slice_streaming_in_order():
    stats = TraceStats()
    it = read_mooncake(TRACES / "conversation_head300.jsonl", stats=stats)
    first = next(it)
    assert stats.requests == 1  # streamed: nothing beyond the first line read yet
    assert (first.arrival_s, first.input_tokens, first.output_tokens) == (0.0, 6758, 500)
    rest = list(it)
    assert stats.requests == 300 and stats.skipped == 0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip([first, *rest], rest))


BAD_LINES = [
    ("{not json", "bad JSON"),
    ('{"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": []}', "input_length"),
    ('{"timestamp": 5, "input_length": 1000, "output_length": 1, "hash_ids": [1]}', "expected ceil"),
    ('{"timestamp": 5, "input_length": 10, "output_length": -1, "hash_ids": [1]}', "output_length"),
    ('[1, 2]', "not a JSON object"),
]


@pytest.mark.parametrize("line,reason", BAD_LINES)
def test_malformed_line_reported_with_line_number(tmp_path, line, reason):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}'
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join([good, good, line, good]) + "\n")
    stats = TraceStats()
    reqs = list(read_mooncake(p, stats=stats))
    assert len(reqs) == 3 and stats.skipped == 1
    assert stats.problems[0][0] == 3 and reason in stats.problems[0][1]
    with pytest.raises(InputError, match=rf"line 3: .*{reason}"):
        list(read_mooncake(p, strict=True))


def test_time_going_backwards_and_missing_file(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 9, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n'
                 '{"timestamp": 3, "input_length": 1, "output_length": 1, "hash_ids": [2]}\n')
    with pytest.raises(InputError, match="line 2"):
        list(read_mooncake(p, strict=True))
    with pytest.raises(InputError, match="file not found"):
        list(read_mooncake(tmp_path / "missing.jsonl"))


def test_prefix_keys_coarsen_mooncake_ids_and_refuse_finer():
    r = TraceRequest(0.0, 2600, 1, block_ids=[10, 11, 12, 13, 14, 15])
    assert prefix_keys(r, 512) == [10, 11, 12, 13, 14]  # the partial last block is never a key
    assert prefix_keys(r, 1024) == [11, 13]
    assert prefix_keys(r, 2048) == [13]
    with pytest.raises(InputError, match="multiple"):
        prefix_keys(r, 256)


def test_write_then_read_round_trip(tmp_path):
    reqs = [TraceRequest(0.5, 1030, 7, tokens=list(range(1030))), TraceRequest(1.0, 600, 2, tokens=list(range(600)))]
    p = tmp_path / "out.jsonl"
    assert write_mooncake(reqs, p) == 2
    back = list(read_mooncake(p, strict=True))
    assert [b.input_tokens for b in back] == [1030, 600]
    assert back[0].block_ids[0] == back[1].block_ids[0]  # same first 512 tokens -> same id
    assert back[0].block_ids[1] != back[1].block_ids[1]
    assert json.loads(p.read_text().splitlines()[0])["timestamp"] == 500


def test_foreign_bytes_are_malformed_lines_not_crashes(tmp_path):
    """Non-UTF-8 bytes, an integer past Python's digit limit and nesting deeper than the recursion limit each
    used to end the replay in a traceback (UnicodeDecodeError, ValueError, RecursionError)."""
    good = b'{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n'
    p = tmp_path / "t.jsonl"
    p.write_bytes(good + b"\xff\xfe\x00 binary\n" + b'{"timestamp": ' + b"1" * 5000 + b"}\n"
                  + b"[" * 100000 + b"\n" + good)
    stats = TraceStats()
    assert len(list(read_mooncake(p, stats=stats))) == 2
    assert stats.problems == [(2, "not UTF-8 text"), (3, "bad JSON (an integer with too many digits)"),
                              (4, "bad JSON (nested too deeply)")]
    with pytest.raises(InputError, match="line 2: not UTF-8 text"):
        list(read_mooncake(p, strict=True))


# ---- issue 19: one pass through k3sim.reader, caps on lines and work -------------------------------------------

GOOD = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n'


@pytest.mark.parametrize("body,needle", [
    ("x" * 64 + "\n", "line 1: longer than 32 bytes"),
    (GOOD[:30] + "\n" + "y" * 40, "line 2: longer than 32 bytes"),  # the last line, without a newline
])
def test_a_line_over_the_cap_is_refused_with_its_number(tmp_path, monkeypatch, body, needle):
    import k3sim.workloads.mooncake as mc

    monkeypatch.setattr(mc, "max_line_bytes", lambda block_tokens: 32)
    p = tmp_path / "t.jsonl"
    p.write_text(body)
    with pytest.raises(InputError, match=needle):
        list(read_mooncake(p))


def test_the_line_cap_fits_the_longest_valid_request():
    """A request of the most input tokens allowed, with 64-bit hash ids, fits in one line."""
    import json as js

    from k3sim.workloads.mooncake import MAX_REQUEST_TOKENS, max_line_bytes

    ids = [2 ** 64 - 1] * -(-MAX_REQUEST_TOKENS // 512)
    line = js.dumps({"timestamp": 1e15, "input_length": MAX_REQUEST_TOKENS, "output_length": MAX_REQUEST_TOKENS,
                     "hash_ids": ids})
    assert len(line) < max_line_bytes(512) < 4 * len(line)


@pytest.mark.parametrize("lines,cap", [(5, 4), (50, 10)])
def test_more_lines_than_the_cap_is_refused(tmp_path, monkeypatch, lines, cap):
    import k3sim.workloads.mooncake as mc

    monkeypatch.setattr(mc, "MAX_TRACE_LINES", cap)
    p = tmp_path / "t.jsonl"
    p.write_text("\n" * lines)  # blank lines count: `yes ''` through a pipe is bounded work too
    with pytest.raises(InputError, match=f"line {cap + 1:,}: more than {cap:,} lines"):
        list(read_mooncake(p))


def test_a_file_of_nothing_but_malformed_lines_stops_early(tmp_path, monkeypatch):
    import k3sim.workloads.mooncake as mc

    monkeypatch.setattr(mc, "MAX_LEADING_MALFORMED", 5)
    p = tmp_path / "t.jsonl"
    p.write_text("y\n" * 100)
    stats = TraceStats()
    with pytest.raises(InputError, match="no valid request in its first 5 non-blank lines"):
        list(read_mooncake(p, stats=stats))
    assert stats.lines == 5
    p.write_text("y\n" * 4 + GOOD + "y\n" * 100)  # a damaged head before a valid request is only skipped
    assert len(list(read_mooncake(p))) == 1


@pytest.mark.parametrize("text", ["", "\n\n", "not json\n"])
def test_require_requests_raises_at_the_end_of_an_empty_trace(tmp_path, text):
    p = tmp_path / "t.jsonl"
    p.write_text(text)
    assert list(read_mooncake(p)) == []
    with pytest.raises(InputError, match="no valid request in the trace"):
        list(read_mooncake(p, require_requests=True))


def test_limit_stops_reading_a_pipe_at_the_last_request(tmp_path):
    """With --limit N the reader never asks for line N+1: a pipe's writer that has sent N lines and then
    stalls is not waited for."""
    import os
    import threading

    r, w = os.pipe()
    os.write(w, (GOOD * 3).encode())
    done = threading.Event()
    got = []

    def consume():
        got.extend(read_mooncake(f"/dev/fd/{r}", limit=3))
        done.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    assert done.wait(timeout=20) and len(got) == 3  # returned though the writer never closed
    os.close(w)
    os.close(r)
