"""Perfetto JSON: one track per stage, every op once, named by kind, chunk and micro-batch; Gantt PNG."""

from __future__ import annotations

import json

from k3sim.pipeline import EncoderWork, build_schedule, run_pipeline, uniform_costs
from k3sim.pipeline.trace import write_gantt, write_perfetto


def test_perfetto_trace_has_one_track_per_stage_and_every_op(tmp_path):
    s = build_schedule("interleaved-1f1b", 4, 8, 2)
    r = run_pipeline(s, uniform_costs(4, 2, 1.0, 2.0, send_s=0.1), EncoderWork.uniform(8, 0.3), "bubble")
    path = write_perfetto(r.timeline, tmp_path / "t.json")
    ev = json.loads(path.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in ev if e.get("name") == "thread_name" and e["pid"] == 0}
    assert tracks == {f"stage {d}" for d in range(4)}
    ops = [e for e in ev if e["ph"] == "X" and e["pid"] == 0]
    assert len(ops) == r.timeline.program.num_ops == 4 * 8 * 2 * 2 + 2 * 8
    names = {e["name"] for e in ops}
    assert "F1.mb3" in names and "B0.mb7" in names and "EF.mb0" in names and "EB.mb5" in names
    sends = [e for e in ev if e["ph"] == "X" and e["pid"] == 1]
    assert sends and all(abs(e["dur"] - 0.1e6) < 1e-6 for e in sends if e["name"].startswith("send F"))
    for d in range(4):                                  # no overlap on a track
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ops if e["tid"] == d)
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:]))


def test_gantt_png_is_written(tmp_path):
    r = run_pipeline(build_schedule("1f1b", 3, 4), uniform_costs(3, 1, 1.0, 2.0))
    out = write_gantt(r.timeline, tmp_path / "g.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
