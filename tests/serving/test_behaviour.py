"""Serving behaviour that says what it did (issue 24, item 9 and the serving parts of 10): Sarathi's unreachable
TPOT target, the prefix-aware router's common prefix, --time-scale, pp micro-batches by default, overload with
the sustainable rate, progress only at a terminal, and the serving sweep on the user's trace."""

from __future__ import annotations

import json
import sys

import pytest

from k3sim.serving.run import ServeSetup, simulate
from k3sim.workloads.request import TraceRequest

from serving_helpers import ROOT, TRACE, constant, linear, scenario, write_scenario  # noqa: F401 (a fixture)

ONE_ENGINE = {"pp_microbatches": False}


def _req(t, L, O, ids):
    return TraceRequest(t, L, O, block_ids=list(ids))


def run_main(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `k3sim argv...` through the real entry point, in this process."""
    from k3sim.cli import main

    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def table_text(out: str) -> str:
    """A printed key/value table as one line of words (box characters dropped, wrapped cells rejoined)."""
    return " ".join(out.translate({ord(c): " " for c in "│┃"}).split())


def one_line(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    for n in needles:
        assert n in err, (n, err)


@pytest.fixture
def constant_steps(monkeypatch):
    """Every step of every run `k3sim.serving.run.simulate` builds itself costs 0.05 s (the CLI's runs too)."""
    import k3sim.serving.run as run

    monkeypatch.setattr(run, "_step_fn", lambda setup, pool: (lambda nd, cs, pf: 0.05))


# ------------------------------------------------------------------------------------------ Sarathi
def test_sarathi_says_when_the_tpot_target_is_unreachable(scenario, capsys):
    """Step 0.05 s + 1e-4 s per token, TPOT target 0.1 s: even the 512-token floor (one hash block) takes
    0.05 + 0.0512 = 0.1012 s, so each of the 2048-token prompt's 4 prefill steps falls to the floor and misses
    the target; the result says so with the target, the floor and that step time. At a 0.16 s target the floor
    step (0.1012 s) meets it: the budget is still one block, but nothing is unreachable."""
    from k3sim.commands.serve import _print_summary

    body = {"engine": {"pool_bytes": "unbounded", "scheduler": "sarathi"}, "slo_tpot_s": 0.1}
    res = simulate(ServeSetup.from_scenario(scenario(body)), [_req(0.0, 2048, 3, range(4))],
                   step_seconds=linear(0.05, 1e-4))
    s = res.summary["sarathi"]
    assert s["tpot_unreachable"] and s["slo_tpot_s"] == 0.1 and s["floor_budget_tokens"] == 512
    # 4 prefill steps priced (the 2 decode-only steps after them need no budget), every one at the floor
    assert s["budget_decisions"] == 4 and s["floor_steps"] == 4 and s["floor_steps_with_decodes"] == 0
    assert s["floor_step_s_min"] == s["floor_step_s_max"] == pytest.approx(0.1012)
    assert res.frame().loc[0, "ttft_s"] == pytest.approx(4 * 0.1012)
    (warning,) = res.summary["warnings"]
    assert "0.1 s is unreachable in 4 of 4" in warning and "512 tokens" in warning and "0.1012 s" in warning
    _print_summary(res.summary, "test", {}, False)  # the CLI's table carries the same line
    assert "unreachable in 4 of 4" in table_text(capsys.readouterr().out)

    body["slo_tpot_s"] = 0.16
    res = simulate(ServeSetup.from_scenario(scenario(body)), [_req(0.0, 2048, 3, range(4))],
                   step_seconds=linear(0.05, 1e-4))
    s = res.summary["sarathi"]
    assert not s["tpot_unreachable"] and s["floor_steps"] == 0 and s["floor_budget_tokens"] is None
    assert res.summary["warnings"] == []
    vllm = simulate(ServeSetup.from_scenario(scenario({})), [_req(0.0, 600, 2, [0, 1])], step_seconds=constant(1.0))
    assert vllm.summary["sarathi"] is None  # vllm: no budget floor to report


# ------------------------------------------------------------------------------------------ router
def _shared_block0(n: int, start: float = 5.0):
    """Request 0 alone at t = 0 (its prefill caches block 0 on its replica), then n requests 0.5 s apart, each
    block 0 (a system prompt every request shares) + 3 blocks of its own, 200 output tokens (they stay)."""
    first = [_req(0.0, 2048, 200, [0, 1, 2, 3])]
    return first + [_req(start + 0.5 * i, 2048, 200, [0, 10 * (i + 1), 10 * (i + 1) + 1, 10 * (i + 1) + 2])
                    for i in range(n)]


def test_prefix_aware_router_spreads_requests_that_share_only_block_0(scenario):
    """Every request shares block 0: it counts for no replica, so 41 requests spread over 4 replicas by load
    (10 or 11 each). Counting it, the replica that served request 0 would hold the only cached block 0 and take
    every request up to the load cap: [33, 8, 0, 0] (measured with the common prefix counted)."""
    setup = ServeSetup.from_scenario(scenario({"replicas": 4, "router": "prefix-aware", "engine": ONE_ENGINE},
                                              num_gpus=64))
    res = simulate(setup, _shared_block0(40), step_seconds=constant(0.2))
    r = res.summary["router"]
    assert r["name"] == "prefix-aware" and r["ignored_common_blocks"] == 1 and r["load_cap"] == 32
    assert sorted(r["requests_per_engine"]) == [10, 10, 10, 11]
    assert sorted(res.frame()["replica"].value_counts().tolist()) == [10, 10, 10, 11]


def test_prefix_aware_router_keeps_affinity_beyond_the_common_block(scenario):
    """Two conversations behind the shared block 0: the second turn of each goes to the replica holding its
    first turn (8 cached blocks beyond block 0 there, none elsewhere)."""
    first = [_req(0.0, 4096, 5, [0, *range(1, 8)]), _req(0.0, 4096, 5, [0, *range(100, 107)])]
    follow = [_req(50.0, 6144, 5, [0, *range(100, 107), 200, 201, 202, 203]),
              _req(51.0, 6144, 5, [0, *range(1, 8), 300, 301, 302, 303])]
    setup = ServeSetup.from_scenario(scenario({"replicas": 2, "router": "prefix-aware", "engine": ONE_ENGINE},
                                              num_gpus=32))
    res = simulate(setup, first + follow, step_seconds=constant(0.05))
    df = res.frame().set_index("request")
    assert df.loc[2, "replica"] == df.loc[1, "replica"] and df.loc[3, "replica"] == df.loc[0, "replica"]
    assert df.loc[0, "replica"] != df.loc[1, "replica"] and res.summary["router"]["ignored_common_blocks"] == 1


# ------------------------------------------------------------------------------------------ --time-scale
def test_time_scale_keeps_the_traces_timing_scaled():
    from k3sim.serving.run import request_source

    def stream(**kw):
        return list(request_source(trace=TRACE, workload=None, n_requests=1, seed=0, arrival="poisson", cv=1.0,
                                   limit=50, **kw)(None))

    own, half = stream(), stream(time_scale=0.5)
    assert [r.arrival_s * 0.5 for r in own] == [r.arrival_s for r in half]  # every gap halved: twice the rate
    assert [(r.input_tokens, r.output_tokens, list(r.block_ids)) for r in own] == \
        [(r.input_tokens, r.output_tokens, list(r.block_ids)) for r in half]
    assert (len(half) - 1) / half[-1].arrival_s == pytest.approx(2 * (len(own) - 1) / own[-1].arrival_s)


@pytest.mark.parametrize("args, needles", [
    (["--time-scale", "0"], ["--time-scale:", "positive factor"]),
    (["--time-scale", "-2"], ["--time-scale:", "positive factor"]),
    (["--time-scale", "nan"], ["--time-scale:", "finite"]),
    (["--time-scale", "1e9"], ["--time-scale:", "outside"]),
    (["--time-scale", "0.5", "--arrival-rate", "1"], ["--time-scale:", "give one of the two"]),
    (["--time-scale", "0.5", "--sweep-rate", "1,2"], ["--time-scale:", "--sweep-rate"]),
])
def test_bad_time_scale_is_one_line_exit_2(capsys, args, needles):
    one_line(*run_main(capsys, "serve", "--trace", TRACE, "--limit", "5", *args), *needles)


def test_help_says_arrival_rate_replaces_the_timing_and_time_scale_keeps_it(capsys):
    code, out, _ = run_main(capsys, "serve", "--help")
    text = " ".join(out.split())
    assert code == 0 and "replaces the trace's own timing" in text and "--time-scale" in text
    assert "keeping its conversation timing" in text


# ------------------------------------------------------------------------------------------ pp micro-batches
def test_pp_microbatches_default_off_with_attention_dp_says_why(scenario):
    """pp 2 with attention DP 2: the default (micro-batches on) cannot apply, so the replica keeps one batch in
    flight and the result says why; asked for explicitly it is refused (tests/serving/test_dp.py)."""
    setup = ServeSetup.from_scenario(scenario({}, model="kimi-linear-48b",
                                              parallelism={"tp": 1, "pp": 2, "dp": 2, "ep": 2}, num_gpus=4))
    assert setup.pools[0].pp_engines == 1
    res = simulate(setup, [_req(0.0, 600, 3, [0, 1])], step_seconds=constant(1.0))
    assert res.summary["batches_in_flight"] == {"mixed": 1}
    (warning,) = res.summary["warnings"]
    assert "not modelled with attention DP (dp=2)" in warning


# ------------------------------------------------------------------------------------------ overload
def _every(gap_s: float, n: int):
    return [_req(gap_s * i, 512, 2, [i + 1]) for i in range(n)]


def test_overloaded_run_says_so_with_the_sustainable_rate(scenario, capsys):
    """One engine, one request at a time (max_batch 1), 1 s steps: a request takes its prefill step and one
    decode step, so request k starts at 2k and completes at 2k + 2: the fleet sustains 0.5 requests/s.
    200 arrivals 1 s apart (t = 0..199, 1/s): at the half-span 99.5 s, 100 arrived and 50 started (50 waiting);
    at 199 s, 200 arrived and 100 started (100 waiting): the queue grew by 50 > 3 x sqrt(100 arrivals after the
    half-span) = 30, so the run is overloaded. Sustainable rate: completions from 99.5 s to the last start
    (request 199 at 398 s), k = 49..198, 150 over 298.5 s. Arrivals 4 s apart never queue: not overloaded."""
    from k3sim.commands.serve import _print_summary

    setup = ServeSetup.from_scenario(scenario({"engine": {"max_batch": 1, "pool_bytes": "unbounded", **ONE_ENGINE}}))
    res = simulate(setup, _every(1.0, 200), step_seconds=constant(1.0))
    s = res.summary
    assert s["overloaded"] and s["offered_rate_per_s"] == pytest.approx(1.0)
    assert s["queue_growth_requests"] == 50 and s["overload_threshold_requests"] == pytest.approx(30.0)
    assert s["sustainable_rate_per_s"] == pytest.approx(150 / 298.5)
    _print_summary(s, "test", {}, False)
    text = table_text(capsys.readouterr().out)
    assert "overloaded arrivals at 1 requests/s, the fleet sustains about 0.5025 requests/s" in text
    assert "TTFT p50 / p99 not a steady state" in text  # no TTFT figure printed for a growing queue

    calm = simulate(setup, _every(4.0, 60), step_seconds=constant(1.0)).summary
    assert not calm["overloaded"] and calm["sustainable_rate_per_s"] is None
    assert calm["queue_growth_requests"] == 0 and calm["offered_rate_per_s"] == pytest.approx(0.25)


def test_overload_counts_the_decode_queue_of_a_pd_fleet(scenario):
    """P/D with a decode replica that holds one request at a time (max_batch 1) and 20 decode steps each: the
    prefill side keeps up, the requests pile up waiting for the decode replica, and the run is overloaded."""
    setup = ServeSetup.from_scenario(scenario({"replicas": 2, "engine": {"max_batch": 1, "pool_bytes": "unbounded",
                                                                           **ONE_ENGINE},
                                               "disaggregation": {"prefill": {"replicas": 1},
                                                                  "decode": {"replicas": 1}}}, num_gpus=32))
    reqs = [_req(2.0 * i, 512, 21, [i + 1]) for i in range(120)]  # every 2 s; a decode takes 20 s
    s = simulate(setup, reqs, step_seconds=constant(1.0)).summary
    assert s["overloaded"] and s["sustainable_rate_per_s"] == pytest.approx(1 / 20, rel=0.1)


# ------------------------------------------------------------------------------------------ progress
def _rate_sweep_json(capsys, monkeypatch, tty: bool) -> tuple[dict, str]:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    code, out, err = run_main(capsys, "serve", "--workload", "chat", "--requests", "30", "--sweep-rate", "1,4",
                              "--processes", "1", "--json")
    assert code == 0, err
    d = json.loads(out)
    for row in d["rows"]:
        row.pop("wall_s")  # the simulation's own run time: the one figure two runs never share
    return d, err


def test_rate_sweep_progress_only_at_a_terminal_and_never_in_the_output(capsys, monkeypatch, constant_steps):
    """--sweep-rate draws a progress bar on stderr at a terminal, nothing when stderr is piped, and stdout is
    the same either way."""
    piped, piped_err = _rate_sweep_json(capsys, monkeypatch, tty=False)
    shown, shown_err = _rate_sweep_json(capsys, monkeypatch, tty=True)
    assert piped_err == "" and shown_err != ""
    assert piped == shown and [r["arrival_rate"] for r in piped["rows"]] == [1.0, 4.0]


def test_sweep_rates_reports_each_finished_rate(scenario):
    from k3sim.serving.run import request_source, sweep_rates

    setup = ServeSetup.from_scenario(scenario({"engine": ONE_ENGINE}))
    src = request_source(trace=None, workload="chat", n_requests=20, seed=0, arrival="poisson", cv=1.0, limit=None)
    import k3sim.serving.run as run

    calls = []
    saved = run._step_fn
    run._step_fn = lambda setup, pool: (lambda nd, cs, pf: 0.05)
    try:
        df = sweep_rates(setup, src, [1.0, 2.0, 3.0], processes=1, progress=lambda d, t: calls.append((d, t)))
    finally:
        run._step_fn = saved
    assert calls == [(1, 3), (2, 3), (3, 3)] and df["arrival_rate"].tolist() == [1.0, 2.0, 3.0]
    assert {"overloaded", "sustainable_rate_per_s", "sarathi_tpot_unreachable"} <= set(df.columns)


# ------------------------------------------------------------------------------------------ serving sweep
def test_serving_sweep_serves_the_users_trace(tmp_path, capsys, constant_steps):
    """`k3sim sweep --trace`: every point serves the first --limit requests of the trace (not the synthetic
    sample), and the colocated point gives `serve`'s figures on the same trace and fleet."""
    path = write_scenario(tmp_path, num_gpus=32)
    code, out, err = run_main(capsys, "sweep", path, "--max-batch", "256", "--trace", TRACE, "--limit", "40",
                              "--out", tmp_path / "sw", "--json")
    assert code == 0, err
    d = json.loads(out)
    src = d["requests_source"]
    assert src["kind"] == "trace" and src["trace"] == str(TRACE) and src["requests"] == 40 and src["limit"] == 40
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "sw" / "sweep.parquet").set_index("prefill_replicas")
    assert rows["requests"].tolist() == [40, 40] and sorted(rows.index) == [0, 1]
    from k3sim.serving.run import TraceSample

    serve = simulate(ServeSetup.from_scenario(path), TraceSample(str(TRACE), 40).stream()).summary
    assert rows.loc[0, "ttft_p99_s"] == serve["ttft_p99_s"] and rows.loc[0, "token_hit_rate"] == serve["token_hit_rate"]

    code, out, err = run_main(capsys, "sweep", path, "--max-batch", "256", "--requests", "20", "--out",
                              tmp_path / "sw2")
    assert code == 0, err
    text = " ".join(out.split())
    assert "requests: a seeded synthetic chat sample (give --trace FILE for your traffic): 20 requests" in text


@pytest.mark.parametrize("args, needles", [
    (["--limit", "5"], ["--limit:", "add --trace"]),
    (["--time-scale", "0.5"], ["--time-scale:", "add --trace"]),
    (["--trace", TRACE, "--requests", "5"], ["--requests:", "use --limit N"]),
    (["--trace", TRACE, "--time-scale", "0"], ["--time-scale:", "positive factor"]),
    (["--trace", TRACE, "--time-scale", "2", "--arrival-rate", "1"], ["--time-scale:", "give one of the two"]),
    (["--trace", "/nonexistent/trace.jsonl"], ["--trace /nonexistent/trace.jsonl"]),
])
def test_serving_sweep_bad_trace_options_are_one_line(tmp_path, capsys, args, needles):
    out = tmp_path / "never"
    one_line(*run_main(capsys, "sweep", write_scenario(tmp_path, num_gpus=32), *args, "--out", out), *needles)
    assert not out.exists()


def test_training_sweep_refuses_a_trace(tmp_path, capsys):
    one_line(*run_main(capsys, "sweep", ROOT / "scenarios" / "k3-h200-train-32k.yaml", "--trace", TRACE, "--out",
                       tmp_path / "never"), "--trace:", "training sweep serves none")


def test_sweep_on_a_dask_scheduler_shows_progress_only_at_a_terminal(tmp_path, capsys, monkeypatch, constant_steps):
    """`k3sim sweep --scheduler`: a bar on stderr at a terminal, nothing when piped, the same stdout (but the
    wall time) either way."""
    import re

    from distributed import LocalCluster

    path = write_scenario(tmp_path, num_gpus=32)
    runs = []
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc:
        for i, tty in enumerate((False, True)):
            monkeypatch.setattr(sys.stderr, "isatty", lambda tty=tty: tty)
            code, out, err = run_main(capsys, "sweep", path, "--max-batch", "256", "--requests", "20",
                                      "--scheduler", lc.scheduler_address, "--out", tmp_path / f"sw{i}")
            assert code == 0, err
            runs.append((re.sub(r"in [0-9.]+ s on", "in T s on", out).replace(f"sw{i}", "sw"), err))
    (piped, piped_err), (shown, shown_err) = runs
    assert piped_err == "" and "sweep" in shown_err and piped == shown
