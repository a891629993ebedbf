import json
import subprocess
import sys
import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
CONV = str(TRACES / "conversation_head300.jsonl")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """As tests/conftest.py does: `python -m k3sim ...` in a subprocess from the repository root."""
    return subprocess.run([sys.executable, "-m", "k3sim", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_json_keys_and_values():
    proc = run_cli("prefix-cache", "--trace", CONV, "--model", "models/kimi-k3.yaml", "--policy", "decoupled",
                   "--hash-block", "512", "--physical-block", "6144", "--capacity-bytes", "64e9", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("token_hit_rate", "request_hit_rate", "prefill_tokens_saved", "checkpoint_bytes_peak", "evictions"):
        assert key in out
    assert 0 < out["token_hit_rate"] < 1 and out["requests"] == 300 and out["capacity_bytes"] == 64e9
    # the CLI is glue: its numbers are exactly the package's replay of the same configuration
    from k3sim.prefix_cache.setup import make_config
    from k3sim.serving.prefix_cache_run import simulate
    from k3sim.serving.replay import StepCost

    # the step clock is derived from the default scenario's step model unless given; the CLI reports it
    clock = out["step_clock"]
    assert clock["source"].startswith("step model of") and clock["tokens_per_s"] > 0 and clock["step_overhead_s"] > 0
    ref = simulate(CONV, make_config(ROOT / "models/kimi-k3.yaml", "decoupled", 512, 6144, 64e9),
                   cost=StepCost(clock["tokens_per_s"], clock["step_overhead_s"]))
    for key in ("token_hit_rate", "request_hit_rate", "prefill_tokens_saved", "checkpoint_bytes_peak", "evictions",
                "page_bytes", "requests_rejected"):
        assert out[key] == getattr(ref, key), key
    assert out["page_bytes"] == 6144 * 27648  # one physical block of K3 MLA KV (27 KiB/token, all MLA layers)


def test_step_clock_is_the_step_models_line_unless_given():
    from k3sim.configs import load_model
    from k3sim.serving.replay import ModelStepCost

    d = json.loads(run_cli("prefix-cache", "--trace", CONV, "--policy", "decoupled", "--capacity-bytes", "64e9",
                           "--limit", "20", "--json").stdout)["step_clock"]
    msc = ModelStepCost.from_scenario(ROOT / "scenarios/default.yaml", load_model(ROOT / "models/kimi-k3.yaml"))
    from k3sim.serving.replay import StepCost

    clock = StepCost(d["tokens_per_s"], d["step_overhead_s"])
    # the line gives the step model's one-token decode step and its full-budget (8192) prefill step exactly
    assert clock(0, 1) == pytest.approx(msc.fn(1, msc.mean_context, ()), rel=1e-9)
    assert clock(8192, 0) == pytest.approx(msc.fn(0, 0, ((8192, 0),)), rel=1e-9)
    given = json.loads(run_cli("prefix-cache", "--trace", CONV, "--limit", "20", "--tokens-per-s", "2e5",
                               "--step-overhead-s", "0.01", "--json").stdout)["step_clock"]
    assert given == {"tokens_per_s": 2e5, "step_overhead_s": 0.01, "source": "option"}


def test_table_output_unbounded_coarse():
    proc = run_cli("prefix-cache", "--trace", CONV, "--policy", "coarse")
    assert proc.returncode == 0, proc.stderr
    assert "token hit rate" in proc.stdout and "unbounded" in proc.stdout
    from k3sim.prefix_cache.setup import make_config
    from k3sim.serving.prefix_cache_run import simulate

    ref = simulate(CONV, make_config(ROOT / "models/kimi-k3.yaml", "coarse", 512, 6144, None))
    assert 0 < ref.token_hit_rate < 0.1  # 6144-token blocks: only the few long shared prefixes hit
    assert f"{100 * ref.token_hit_rate:.2f} %" in proc.stdout
    assert f"{100 * ref.request_hit_rate:.2f} %" in proc.stdout


def test_bad_inputs_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(Path(CONV).read_text().splitlines()[0] + "\n" + '{"timestamp": 1, "input_length": -5}\n')
    cases = [
        ("--hash-block", "500", "--hash-block"),
        ("--capacity-bytes", "1e6", ""),
        ("--kda-groups", "0", "--kda-groups"),    # 0 is not "the default": it is refused
        ("--kda-groups", "-2", "--kda-groups"),
    ]
    for opt, val, names in cases:
        proc = run_cli("prefix-cache", "--trace", CONV, opt, val)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert names in proc.stderr
    proc = run_cli("prefix-cache", "--trace", str(bad), "--strict")
    assert proc.returncode == 2 and "line 2" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("prefix-cache", "--trace", str(bad), "--json")  # default: skip and count
    assert proc.returncode == 0
    out = json.loads(proc.stdout)
    assert out["trace_lines_skipped"] == 1 and out["extra"]["trace_problems"][0]["line"] == 2


def test_sweep_writes_table_and_plots(tmp_path):
    proc = run_cli("prefix-cache", "--trace", CONV, "--sweep", "--physical-blocks", "2048,6144",
                   "--capacities", "none,64e9", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["rows"]) == 3 * 2 * 2
    for f in out["files"].values():
        assert Path(f).exists() and Path(f).stat().st_size > 0
    assert [p.name for p in tmp_path.glob(".*")] == [".k3sim-manifest.json"]  # no temp files left behind
    # a sweep row is the same replay as a single run of that configuration
    one = json.loads(run_cli("prefix-cache", "--trace", CONV, "--policy", "decoupled", "--physical-block", "2048",
                             "--capacity-bytes", "64e9", "--json").stdout)
    row = next(r for r in out["rows"] if (r["policy"], r["physical_block_tokens"], r["capacity_bytes"])
               == ("decoupled", 2048, 64e9))
    for key in ("token_hit_rate", "request_hit_rate", "prefill_tokens_saved", "checkpoint_bytes_peak", "evictions"):
        assert row[key] == one[key], key


def test_synthetic_workload_allows_fine_hash_blocks():
    proc = run_cli("prefix-cache", "--workload", "chat", "--requests", "100", "--hash-block", "64",
                   "--physical-block", "1024", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["hash_block_tokens"] == 64 and out["token_hit_rate"] > 0.3
    proc = run_cli("prefix-cache", "--trace", CONV, "--hash-block", "256", "--physical-block", "1024")
    assert proc.returncode == 2 and "multiple" in proc.stderr  # Mooncake ids are 512-token blocks
    proc = run_cli("prefix-cache", "--workload", "chat", "--trace", CONV)
    assert proc.returncode == 2


def _one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_trace_one_line_and_sweep_leaves_nothing(tmp_path):
    out_dir = tmp_path / "sweep"
    _one_line_exit_2(run_cli("prefix-cache", "--trace", tmp_path / "missing.jsonl"), "--trace", "file not found")
    _one_line_exit_2(run_cli("prefix-cache", "--trace", tmp_path / "missing.jsonl", "--sweep", "--out", out_dir),
                     "file not found")
    assert not out_dir.exists()


def test_sweep_bad_blocks_exit_2_before_writing(tmp_path):
    out_dir = tmp_path / "sweep"
    # a zero hash block used to end in ZeroDivisionError inside the grid
    _one_line_exit_2(run_cli("prefix-cache", "--trace", CONV, "--sweep", "--hash-blocks", "0", "--out", out_dir),
                     "--hash-blocks")
    # coarse hashes whole physical blocks: 1000 is not a multiple of the trace's 512-token ids
    _one_line_exit_2(run_cli("prefix-cache", "--trace", CONV, "--sweep", "--physical-blocks", "1000",
                             "--capacities", "none", "--out", out_dir), "--physical-blocks", "512")
    assert not out_dir.exists()
    _one_line_exit_2(run_cli("prefix-cache", "--trace", CONV, "--policy", "coarse", "--physical-block", "1000",
                             "--hash-block", "1000"), "--physical-block")


def test_capacity_too_small_for_every_request_exit_2(tmp_path):
    """4 pages hold the smallest request (1 KV page + 3 KDA state slots) but none of these 20,000-token ones."""
    t = tmp_path / "long.jsonl"
    t.write_text("".join(json.dumps({"timestamp": i, "input_length": 20000, "output_length": 10,
                                     "hash_ids": list(range(40))}) + "\n" for i in range(2)))
    page = 6144 * 27648
    _one_line_exit_2(run_cli("prefix-cache", "--trace", t, "--capacity-bytes", str(4 * page)), "too small", "2 requests")
    proc = run_cli("prefix-cache", "--trace", t, "--capacity-bytes", str(7 * page), "--json")  # 4 KV + 3 KDA pages
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"] == 2


def test_sweep_unbounded_only_writes_all_files(tmp_path):
    """A sweep with no finite capacity used to crash in the capacity plot (log axis with no data) after writing
    the table: now the capacity plot shows the unbounded lines only."""
    proc = run_cli("prefix-cache", "--trace", CONV, "--sweep", "--physical-blocks", "6144", "--capacities", "none",
                   "--policies", "decoupled", "--out", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["rows"]) == 1 and out["rows"][0]["requests"] == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".k3sim-manifest.json", *(Path(f).name for f in
                                                                                           out["files"].values())])
    table = run_cli("prefix-cache", "--trace", CONV, "--sweep", "--physical-blocks", "6144", "--capacities", "none",
                    "--policies", "decoupled", "--out", tmp_path / "t")  # the printed table, not JSON
    assert table.returncode == 0, table.stderr
    assert "unbounded" in table.stdout


def test_trace_without_valid_request_and_bad_limit_exit_2(tmp_path):
    """All lines malformed (or an empty file) used to print a table of zeros with exit 0."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{not json\n{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]}\n')
    _one_line_exit_2(run_cli("prefix-cache", "--trace", bad), "no valid request", "2 malformed", "line 1")
    _one_line_exit_2(run_cli("prefix-cache", "--trace", bad, "--sweep", "--out", tmp_path / "s"), "no valid request")
    assert not (tmp_path / "s").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _one_line_exit_2(run_cli("prefix-cache", "--trace", empty), "no valid request")
    _one_line_exit_2(run_cli("prefix-cache", "--trace", CONV, "--limit", "-1"), "--limit")


def test_non_finite_capacity_and_bad_processes_exit_2(tmp_path):
    """These ended in tracebacks (NaN page count; a negative worker pool)."""
    for cap in ("nan", "inf"):
        _one_line_exit_2(run_cli("prefix-cache", "--trace", CONV, "--capacity-bytes", cap), "finite")
    _one_line_exit_2(run_cli("prefix-cache", "--trace", CONV, "--sweep", "--processes", "-1", "--out",
                             tmp_path / "s"), "--processes")
    assert not (tmp_path / "s").exists()


def test_bad_option_values_name_their_option(tmp_path):
    """NaN/inf step costs ran to exit 0, a negative seed and an infinite block list ended in tracebacks, a
    fractional block was truncated, CacheConfig errors named no option, and 70 KDA groups of 69 layers passed."""
    cases = [
        (("--trace", CONV, "--tokens-per-s", "nan"), "--tokens-per-s"),
        (("--trace", CONV, "--step-overhead-s", "inf"), "--step-overhead-s"),
        (("--trace", CONV, "--max-running", "0"), "--max-running"),
        (("--workload", "chat", "--seed", "-1", "--requests", "10"), "--seed"),
        (("--trace", CONV, "--kda-groups", "70"), "--kda-groups"),
        (("--trace", CONV, "--policy", "lru"), "--policy: field 'policy'"),
        (("--trace", CONV, "--physical-block", "0"), "--physical-block: must be at least 16"),
        (("--trace", CONV, "--retention-interval", "100"), "--retention-interval"),
        (("--trace", CONV, "--sweep", "--physical-blocks", "6144.7", "--out", tmp_path / "s"), "'6144.7'"),
        (("--trace", CONV, "--sweep", "--physical-blocks", "inf", "--out", tmp_path / "s"), "--physical-blocks"),
        (("--trace", CONV, "--sweep", "--policies", ",", "--out", tmp_path / "s"), "--policies: needs"),
        (("--trace", CONV, "--sweep", "--capacities", "-5", "--out", tmp_path / "s"), "--capacities"),
        (("--trace", CONV, "--sweep", "--name", "a/b", "--out", tmp_path / "s"), "--name"),
    ]
    for args, needle in cases:
        _one_line_exit_2(run_cli("prefix-cache", *args), needle)
    assert not (tmp_path / "s").exists()


def test_sweep_bad_out_and_capacities_below_one_request(tmp_path):
    """--out under a file and a grid where every capacity is below one request ended in tracebacks; a grid where
    only some are below now writes every file, the skipped rows marked in the table."""
    (tmp_path / "afile").write_text("")
    base = ("prefix-cache", "--trace", CONV, "--sweep", "--policies", "decoupled")
    _one_line_exit_2(run_cli(*base, "--physical-blocks", "6144", "--capacities", "none",
                             "--out", tmp_path / "afile" / "sub"), "--out", "not a directory")
    _one_line_exit_2(run_cli(*base, "--physical-blocks", "6144", "--capacities", "1e3", "--out", tmp_path / "s"),
                     "--capacities", "below what one request needs")
    assert not (tmp_path / "s").exists()
    # 5e8 B: 2 pages of 6144 tokens < 4 needed (1 KV + 3 KDA slots); 35 pages of 512 tokens >= 1 + 3 x 11
    proc = run_cli(*base, "--physical-blocks", "512,6144", "--capacities", "none,5e8", "--out", tmp_path / "m",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    notes = [(r["physical_block_tokens"], r["capacity_bytes"]) for r in out["rows"] if r.get("note")]
    assert notes == [(6144, 5e8)] and len(out["rows"]) == 4
    assert all(Path(f).stat().st_size > 0 for f in out["files"].values())
    assert "capacity below one request" in Path(out["files"]["table"]).read_text()
