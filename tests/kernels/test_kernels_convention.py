"""Timing conventions (issue 10): graph-replay rows preferred under "graph", event rows under "eager"
(+ host launch time); the other timer's rows shifted by the op's measured offset; said in the detail."""

from __future__ import annotations

import pytest
from conftest import hardware

from k3sim.errors import InputError
from k3sim.predict import predict_kernel_time

HEAD = "M,N,K,seconds,seconds_p20,seconds_p80,reps,status,error,host_s"


def _run(root, name, date, rows, timer=None):
    run = root / name
    run.mkdir(parents=True)
    (run / "provenance.yaml").write_text(f'gpu_name: "Synthetic GPU"\ncommand: "pytest"\ndate_utc: "{date}"\n')
    head = HEAD + (",timer" if timer else "")
    lines = [head] + [f"{m},{n},{k},{s:.9g},{s:.9g},{s:.9g},200,ok,,{h:.6g}" + (f",{timer}" if timer else "")
                      for (m, n, k, s, h) in rows]
    (run / "gemm_bf16.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture
def two_timers(tmp_path):
    """Events rows (older run, no timer column) at M = 1..64 and 256; graph rows (newer) at M = 1..64,
    each 4 us shorter: the offset graph - events is -4 us. M = 256 is event-timed only."""
    from k3sim.kernels.predict import clear_cache

    root = tmp_path / "measured" / "testgpu"
    ms = [1, 2, 4, 8, 16, 32, 64]
    _run(root, "ev", "2026-01-01", [(m, 4096, 4096, 20e-6 + 0.1e-6 * m, 30e-6) for m in ms]
         + [(256, 4096, 4096, 60e-6, 30e-6)])
    # graph runs are dated EARLIER on purpose: under "graph" they still win (the timer, not the date, decides)
    _run(root, "gr", "2025-12-01", [(m, 4096, 4096, 16e-6 + 0.1e-6 * m, 35e-6) for m in ms], timer="graph")
    clear_cache()
    yield hardware(root)
    clear_cache()


def test_graph_prefers_graph_rows_whatever_their_date(two_timers):
    kt = predict_kernel_time("gemm_bf16", dict(M=8, N=4096, K=4096), two_timers)
    assert kt.source == "measured" and kt.convention == "graph"
    assert kt.seconds == pytest.approx(16.8e-6)
    assert "graph-timed row" in kt.detail


def test_eager_takes_event_rows_plus_their_host_time(two_timers):
    kt = predict_kernel_time("gemm_bf16", dict(M=8, N=4096, K=4096), two_timers, convention="eager")
    assert kt.convention == "eager"
    assert kt.seconds == pytest.approx(20.8e-6 + 30e-6)
    assert "events-timed row" in kt.detail and "host launch" in kt.detail


def test_event_only_shape_is_shifted_under_graph(two_timers):
    """M = 256 has only an event row (60 us): under graph it is 60 - 4 = 56 us, marked as shifted."""
    from k3sim.kernels.predict import profile_predictor

    st = profile_predictor(two_timers).store
    assert st.timer_offset_s("gemm_bf16") == pytest.approx(-4e-6)
    pts = st.points("gemm_bf16")
    row = pts[pts["M"] == 256].iloc[0]
    assert row["timer"] == "events-shifted" and row["seconds"] == pytest.approx(56e-6)
    eager = st.points("gemm_bf16", "eager")
    assert set(eager["timer"]) == {"events"} and len(eager) == 8
    kt = predict_kernel_time("gemm_bf16", dict(M=256, N=4096, K=4096), two_timers)
    assert kt.seconds == pytest.approx(56e-6) and "events-shifted-timed row" in kt.detail


def test_unknown_convention_is_bad_input(two_timers):
    with pytest.raises(InputError, match="convention"):
        predict_kernel_time("gemm_bf16", dict(M=8, N=4096, K=4096), two_timers, convention="cuda")
