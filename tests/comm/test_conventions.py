"""A collective's timing conventions are separate series of measured rows (issue 20, item 2): the caller's
convention picks its own rows where they exist at the GPU count, another series' rows otherwise, and every answer
carries the convention of the rows (or fit) it came from (`k3sim.comm.model.SERIES`).

The H200 rows quoted below are the committed CSVs': `20261130-2gpu/all_reduce.csv` (barrier-started, no timer
column; 2 GPUs, 1 KiB to 1 GiB) and `20261201-external-aiconfigurator/all_reduce.csv` (timer graph; 2, 4 and 8
GPUs, 512 B to 512 MiB); `20261130-2gpu/send_recv.csv` has barrier rows only."""

from __future__ import annotations

import pytest

from k3sim.comm import collective_time
from k3sim.comm.model import SERIES, TIMERS
from k3sim.kernels.predict import profile_predictor
from k3sim.predict import predict_kernel_time

MiB = 2 ** 20


def test_each_convention_answers_from_its_own_rows_where_they_exist():
    """1 MiB all_reduce on 2 GPUs is measured both ways: 14.26 us graph-timed, 63.504 us barrier-started."""
    g = collective_time("all_reduce", MiB, 2, "h200", convention="graph")
    b = collective_time("all_reduce", MiB, 2, "h200", convention="barrier")
    assert (g.seconds, g.source, g.convention) == (1.426e-05, "measured", "graph")
    assert (b.seconds, b.source, b.convention) == (6.35039993e-05, "measured", "barrier")
    assert "barrier-started rows" in b.detail and "graph-timed rows" in g.detail


def test_another_series_answers_where_the_own_has_no_rows_and_says_so():
    """8 GPUs: graph rows only (26.14 us at 1 MiB), so a barrier caller gets them, labelled a lower bound; send_recv:
    barrier rows only (128.624 us at 1 KiB), so a graph caller gets them, labelled an upper bound. A stream caller
    (no stream rows yet) gets the barrier rows at 2 GPUs."""
    b8 = collective_time("all_reduce", MiB, 8, "h200", convention="barrier")
    assert (b8.seconds, b8.convention) == (2.614e-05, "graph")
    assert "no barrier-timed rows here" in b8.detail and "lower bound" in b8.detail
    sr = collective_time("send_recv", 1024, 2, "h200", convention="graph")
    assert (sr.seconds, sr.convention) == (0.000128624, "barrier")
    assert "no graph-timed rows here" in sr.detail and "upper bound" in sr.detail
    st = collective_time("all_reduce", MiB, 2, "h200", convention="stream")
    assert (st.seconds, st.convention) == (6.35039993e-05, "barrier") and "upper bound" in st.detail


def test_no_row_is_shifted_into_another_series():
    """1 GiB on 2 GPUs was measured barrier-started only. The graph series does not hold it (the kernels' mixed
    points would shift it by the timers' offset into a 'measured' graph answer): the graph answer is the graph
    rows' model held at their range, not the barrier row, and not a measurement."""
    g = collective_time("all_reduce", 2 ** 30, 2, "h200", convention="graph")
    b = collective_time("all_reduce", 2 ** 30, 2, "h200", convention="barrier")
    assert b.source == "measured" and b.convention == "barrier"
    assert g.convention == "graph" and g.source == "model" and g.method == "boundary-held"
    assert g.seconds != b.seconds
    pp = profile_predictor("h200")
    for series in SERIES:
        opp = pp.series("all_reduce", TIMERS[series])
        if opp is not None:
            assert set(opp.timers.values()) == {TIMERS[series]}  # as measured: no "-shifted" row
    assert pp.series("all_reduce", "stream") is None  # no stream-timed rows committed
    assert pp.series("send_recv", "graph") is None


@pytest.mark.parametrize("convention", ["graph", "barrier"])
def test_the_model_says_its_fit_is_graph_timed(convention):
    """Off the measured GPU counts (16 GPUs, two nodes) the model answers from the profile's one alpha-beta fit,
    made on the graph-preferred points: the answer carries "graph" whatever the caller asked, and says so."""
    kt = collective_time("all_reduce", MiB, 16, "h200", convention=convention)
    assert kt.source == "model" and kt.convention == "graph"
    assert ("no barrier-timed fit here" in kt.detail) == (convention == "barrier")


def test_the_facade_maps_kernel_conventions_to_series():
    """predict_kernel_time: a CUDA-graph step ("graph") takes graph rows, an eager call the barrier-started ones."""
    g = predict_kernel_time("all_reduce", {"bytes": MiB, "gpus": 2}, "h200", convention="graph")
    e = predict_kernel_time("all_reduce", {"bytes": MiB, "gpus": 2}, "h200", convention="eager")
    assert (g.seconds, g.convention) == (1.426e-05, "graph")
    assert (e.seconds, e.convention) == (6.35039993e-05, "barrier")


def test_the_kernel_store_keeps_one_timer_when_asked():
    """`MeasurementStore.points(op, only=timer)`: that timer's rows as measured; the mixed points shift the
    barrier-only 1 GiB shape by the op's offset (the difference between the two is that offset, or half the row)."""
    store = profile_predictor("h200").store
    graph = store.points("all_reduce", "graph", only="graph")
    events = store.points("all_reduce", "graph", only="events")
    mixed = store.points("all_reduce", "graph")
    assert set(graph["timer"]) == {"graph"} and set(events["timer"]) == {"events"}
    assert sorted(set(graph["gpus"])) == [2, 4, 8] and sorted(set(events["gpus"])) == [2]
    assert 2 ** 30 not in set(graph["bytes"]) and 2 ** 30 in set(events["bytes"])
    row = mixed[(mixed["bytes"] == 2 ** 30) & (mixed["gpus"] == 2)].iloc[0]
    assert row["timer"] == "events-shifted"
    assert store.points("all_reduce", "graph", only="stream").empty


def test_a_fit_made_on_barrier_rows_only_says_barrier():
    """send_recv has no graph row, so its fit (and a model answer across nodes: one GPU per node) is barrier-timed;
    a graph caller is told it got an upper bound."""
    kt = collective_time("send_recv", MiB, 2, "h200", gpus_per_node=1, convention="graph")
    assert kt.source == "model" and kt.convention == "barrier"
    assert "no graph-timed fit here, barrier-started fit" in kt.detail and "upper bound" in kt.detail
