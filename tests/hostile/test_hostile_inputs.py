"""Issue 19, input files: every input kind (scenario, model, profile, topology, trace, measured CSV) goes through
one reader (`k3sim.reader`). A directory, a device, a broken or looping link, a name too long, an oversized file
or line is one line and exit 2 naming what is wrong (never "file not found" for something that is there); a
pipe is read exactly once (a trace from a FIFO serves as many requests as from a file); a measured row faster
than the datasheet roofline is refused when loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hostile_helpers import ROOT, assert_one_line, run_main

TRACE = ROOT / "data" / "traces" / "synthetic_trace.jsonl"
GEMM_ROWS = ROOT / "hardware_profiles" / "measured" / "h200" / "20261130-1gpu-b" / "gemm_bf16.csv"
HANG_S = 60  # generous: a FIFO case that regressed to a hang fails here instead of stalling the suite


def _scenario_cmd(p):
    return ["plan", p, "--no-report"]


def _model_cmd(p):
    return ["model-info", "--model", p]


def _profile_cmd(p):
    return ["kernel-time", "gemm_bf16", "--hardware", p, "--set", "M=1", "--set", "N=1", "--set", "K=1"]


def _topology_cmd(p):
    return ["kernel-time", "all_gather", "--set", "bytes=1024", "--set", "gpus=2", "--topology", p]


def _serve_cmd(p):
    return ["serve", "--trace", p]


def _prefix_cache_cmd(p):
    return ["prefix-cache", "--trace", p]


# (command for a path of this kind, the size cap of the kind in bytes)
KINDS = {
    "scenario": (_scenario_cmd, "config"), "model": (_model_cmd, "config"), "profile": (_profile_cmd, "config"),
    "topology": (_topology_cmd, "config"), "serve-trace": (_serve_cmd, "trace"),
    "prefix-cache-trace": (_prefix_cache_cmd, "trace"),
}


def _cap(kind: str) -> int:
    from k3sim.reader import MAX_CONFIG_BYTES
    from k3sim.workloads.mooncake import MAX_TRACE_BYTES

    return MAX_CONFIG_BYTES if KINDS[kind][1] == "config" else MAX_TRACE_BYTES


def _hostile(tmp_path: Path, case: str, kind: str) -> tuple[Path, list[str]]:
    """A path of the named hostile sort and the words its error line must hold."""
    if case == "directory":
        (tmp_path / "d.yaml").mkdir()
        return tmp_path / "d.yaml", ["is a directory"]
    if case == "device":
        return Path("/dev/zero"), ["/dev/zero", "is a device, not a file"]
    if case == "dangling-link":
        (tmp_path / "link.yaml").symlink_to(tmp_path / "gone.yaml")
        return tmp_path / "link.yaml", ["symbolic link to", "which does not exist"]
    if case == "link-loop":
        (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
        (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
        return tmp_path / "a.yaml", ["symbolic link loop"]
    if case == "name-too-long":
        return tmp_path / ("n" * 300 + ".yaml"), ["file name too long"]
    if case == "oversized":  # sparse: no disk is spent, the size alone is refused before reading
        p = tmp_path / "big.yaml"
        with open(p, "wb") as f:
            f.truncate(_cap(kind) + 1)
        return p, [f"{_cap(kind) + 1:,} bytes is too large"]
    raise AssertionError(case)


CASES = ["directory", "device", "dangling-link", "link-loop", "name-too-long", "oversized"]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", CASES)
def test_a_hostile_path_is_one_line_naming_what_is_there(tmp_path, capsys, kind, case):
    """Was: "file not found" for a symlink loop or a dangling link, a traceback or a hang for /dev/zero."""
    path, needles = _hostile(tmp_path, case, kind)
    line = assert_one_line(*run_main(capsys, *KINDS[kind][0](path)), *needles)
    if case != "name-too-long":
        assert "not found" not in line


@pytest.mark.parametrize("kind", ["serve-trace", "prefix-cache-trace"])
@pytest.mark.parametrize("line_bytes", [2 * 2 ** 20, 8 * 2 ** 20])
def test_a_trace_line_over_its_cap_is_refused_with_its_number(tmp_path, capsys, kind, line_bytes):
    p = tmp_path / "t.jsonl"
    p.write_bytes(TRACE.read_bytes().split(b"\n", 1)[0] + b"\n" + b"x" * line_bytes + b"\n")
    assert_one_line(*run_main(capsys, *KINDS[kind][0](p)), "line 2: longer than", "bytes")


# ---- pipes: read exactly once, capped, never waited on twice ------------------------------------------------

def _fifo_with_writer(tmp_path: Path, source: str) -> tuple[Path, subprocess.Popen]:
    """A FIFO and a writer process (`cat SOURCE > FIFO`); the writer blocks until k3sim opens the FIFO."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", 'exec cat "$1" > "$2"', "sh", source, str(fifo)],
                              stderr=subprocess.DEVNULL)
    return fifo, writer


def _k3sim(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k3sim", *map(str, argv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=HANG_S)


def _stop(writer: subprocess.Popen) -> None:
    if writer.poll() is None:
        writer.kill()
    writer.wait(timeout=10)


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_endless_pipe_is_refused_at_its_cap(tmp_path, kind):
    """/dev/zero through a FIFO: a config is refused past its byte cap, a trace at its first line's cap (the
    old reader grew without bound: 5 GB in 30 s)."""
    fifo, writer = _fifo_with_writer(tmp_path, "/dev/zero")
    try:
        proc = _k3sim(*KINDS[kind][0](fifo))
    finally:
        _stop(writer)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    want = "is too large" if KINDS[kind][1] == "config" else "line 1: longer than"
    assert want in lines[0] and str(fifo) in lines[0], lines[0]


@pytest.mark.parametrize("source,key", [(ROOT / "models" / "kimi-k3.yaml", "model"),
                                        (ROOT / "models" / "kimi-linear-48b.yaml", "model")])
def test_a_config_from_a_fifo_is_read_once_and_works(tmp_path, source, key):
    if not source.exists():
        pytest.skip(f"{source.name} not shipped")
    fifo, writer = _fifo_with_writer(tmp_path, str(source))
    try:
        proc = _k3sim("model-info", "--model", fifo, "--json")
    finally:
        _stop(writer)
    assert proc.returncode == 0, proc.stderr
    direct = _k3sim("model-info", "--model", source, "--json")
    assert json.loads(proc.stdout)[key] == json.loads(direct.stdout)[key]


@pytest.mark.parametrize("command", ["serve", "prefix-cache"])
@pytest.mark.parametrize("requests", [40, 97])
def test_a_trace_from_a_fifo_serves_as_many_requests_as_from_a_file(tmp_path, command, requests):
    """Was: a validation pass drained the FIFO, the run served 0 requests and exited 0 (or the second open
    waited forever). Now the trace is validated while it is consumed, once."""
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(TRACE.read_bytes().splitlines(keepends=True)[:requests]))
    fifo, writer = _fifo_with_writer(tmp_path, str(part))
    try:
        piped = _k3sim(command, "--trace", fifo, "--json")
    finally:
        _stop(writer)
    assert piped.returncode == 0, piped.stderr
    from_file = _k3sim(command, "--trace", part, "--json")
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(piped.stdout)["requests"] == json.loads(from_file.stdout)["requests"] == requests


def test_a_bad_trace_line_in_a_fifo_is_one_line_with_its_number_and_no_output(tmp_path):
    """Validated while consumed: an error mid-stream is still one line, exit 2, its line number, and no --out."""
    lines = TRACE.read_bytes().splitlines(keepends=True)[:30]
    part = tmp_path / "bad.jsonl"
    part.write_bytes(b"".join(lines[:20]) + b'{"timestamp": 1, "input_length": -3}\n' + b"".join(lines[20:]))
    fifo, writer = _fifo_with_writer(tmp_path, str(part))
    out = tmp_path / "out"
    try:
        proc = _k3sim("serve", "--trace", fifo, "--out", out)
    finally:
        _stop(writer)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "line 21:" in err[0], proc.stderr
    assert not out.exists()


def test_a_rate_sweep_refuses_a_pipe_it_would_read_once_per_rate(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)  # no writer: a reader that opened it would wait forever
    proc = _k3sim("serve", "--trace", fifo, "--sweep-rate", "1,2")
    assert proc.returncode == 2 and "can be read only once" in proc.stderr and "--trace" in proc.stderr


def _absolute_scenario(tmp_path: Path, name: str) -> Path:
    """A shipped scenario with its model path made absolute (a FIFO has no directory to resolve it from)."""
    src = (ROOT / "scenarios" / name).read_text()
    model = next(l.split(":", 1)[1].strip() for l in src.splitlines() if l.startswith("model:"))
    out = tmp_path / name
    out.write_text(src.replace(f"model: {model}", f"model: {(ROOT / 'scenarios' / model).resolve()}", 1))
    return out


def test_a_plan_of_a_scenario_from_a_fifo_reads_it_once(tmp_path):
    """Was: `plan FIFO` read its scenario again for the serving section and waited forever on the FIFO."""
    scenario = _absolute_scenario(tmp_path, "kimi-linear-48b-h200.yaml")
    fifo, writer = _fifo_with_writer(tmp_path, str(scenario))
    try:
        piped = _k3sim("plan", fifo, "--no-report", "--json")
    finally:
        _stop(writer)
    assert piped.returncode == 0, piped.stderr
    direct = _k3sim("plan", scenario, "--no-report", "--json")
    keys = ("requests", "ttft_p99_s", "tpot_p99_s", "token_hit_rate")  # the serving section, read from it once
    got, want = json.loads(piped.stdout), json.loads(direct.stdout)
    assert got["requests"] > 0 and {k: got[k] for k in keys} == {k: want[k] for k in keys}


def test_a_serve_of_a_scenario_from_a_fifo_reads_it_once(tmp_path):
    """Was: the option rules read the scenario again for its router settings and waited on the FIFO."""
    scenario = _absolute_scenario(tmp_path, "kimi-linear-48b-h200.yaml")
    fifo, writer = _fifo_with_writer(tmp_path, str(scenario))
    try:
        proc = _k3sim("serve", "--scenario", fifo, "--workload", "chat", "--requests", "5", "--json")
    finally:
        _stop(writer)
    assert proc.returncode == 0 and json.loads(proc.stdout)["requests"] == 5, proc.stderr


def test_a_sweep_refuses_a_scenario_it_would_read_in_every_task(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)  # no writer: a reader that opened it would wait forever
    proc = _k3sim("sweep", fifo, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "can be read only once" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


# ---- measured CSVs: the same reader, regular files only, rows checked when loaded ------------------------------

def _profile(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the h200 profile whose calibration_dir is a one-run temp directory (GEMM rows of a real run)."""
    run = tmp_path / "measured" / "run1"
    run.mkdir(parents=True)
    (run / "provenance.yaml").write_text('gpu_name: "NVIDIA H200"\ncommand: "pytest"\ndate_utc: "2026-01-01"\n')
    text = (ROOT / "hardware_profiles" / "h200.yaml").read_text()
    assert "calibration_dir: measured/h200" in text
    profile = tmp_path / "p.yaml"
    profile.write_text(text.replace("calibration_dir: measured/h200", f"calibration_dir: {run.parent}"))
    return profile, run


def _gemm_query(profile: Path) -> list:
    return ["kernel-time", "gemm_bf16", "--hardware", profile, "--set", "M=4096", "--set", "N=4096",
            "--set", "K=4096"]


@pytest.mark.parametrize("case,needles", [
    ("directory", ["is a directory, expected a measured CSV"]),
    ("device", ["is a device, not a file"]),
    ("fifo", ["is a pipe, not a file"]),
    ("dangling-link", ["symbolic link to", "which does not exist"]),
    ("link-loop", ["symbolic link loop"]),
    ("oversized", ["bytes is too large for a measured CSV"]),
])
def test_a_hostile_measured_csv_is_one_line(tmp_path, case, needles):
    """A subprocess: a FIFO among the measurements must be refused unopened (nobody writes it)."""
    profile, run = _profile(tmp_path)
    csv = run / "gemm_bf16.csv"
    if case == "directory":
        csv.mkdir()
    elif case == "device":
        csv.symlink_to("/dev/zero")
    elif case == "fifo":
        os.mkfifo(csv)
    elif case == "dangling-link":
        csv.symlink_to(run / "gone.csv")
    elif case == "link-loop":
        csv.symlink_to(run / "other.csv")
        (run / "other.csv").symlink_to(csv)
    else:
        from k3sim.reader import MAX_MEASURED_BYTES

        with open(csv, "wb") as f:
            f.truncate(MAX_MEASURED_BYTES + 1)
    proc = _k3sim(*_gemm_query(profile))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(n in lines[0] for n in needles) and "gemm_bf16.csv" in lines[0], lines[0]


def _with_cell(src: Path, dst: Path, row: int, column: str, value: str) -> int:
    """`src` with one cell of data row `row` (0-based) replaced; returns that row's line number."""
    lines = src.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[row + 1].split(",")
    cells[header.index(column)] = value
    lines[row + 1] = ",".join(cells)
    dst.write_text("\n".join(lines) + "\n")
    return row + 2


@pytest.mark.parametrize("row,seconds", [(3, "1e-300"), (40, "1e-9"), (0, "5e-12")])
def test_a_measured_row_faster_than_the_roofline_is_refused_when_loaded(tmp_path, capsys, row, seconds):
    """Was: a 1e-300 s row was served as "measured". Now loading the store refuses it, naming the file, the
    line and the column, with the fix."""
    profile, run = _profile(tmp_path)
    line = _with_cell(GEMM_ROWS, run / "gemm_bf16.csv", row, "seconds", seconds)
    assert_one_line(*run_main(capsys, *_gemm_query(profile)), "gemm_bf16.csv", "field 'seconds'",
                    f"line {line}:", "faster than the datasheet roofline", "remove the row or re-measure")


@pytest.mark.parametrize("column,value,needle", [
    ("reps", "0", "reps=0 is outside"), ("reps", "2.5", "a whole number"), ("reps", "1e12", "is outside"),
    ("seconds_p20", "-1", "is outside"), ("seconds_p80", "inf", "is outside"), ("seconds", "1e12", "is outside"),
    ("seconds_p20", "fast", "is not a number"),
])
def test_every_numeric_column_of_a_measured_row_is_bounded(tmp_path, capsys, column, value, needle):
    profile, run = _profile(tmp_path)
    line = _with_cell(GEMM_ROWS, run / "gemm_bf16.csv", 5, column, value)
    assert_one_line(*run_main(capsys, *_gemm_query(profile)), f"field '{column}'", f"line {line}:", needle)


def test_no_committed_measurement_is_refused():
    """The factor (store.PHYSICAL_FACTOR) against the data: every committed row of every calibrated profile
    loads for its own profile."""
    from k3sim.configs import load_hardware
    from k3sim.configs.loaders import hardware_names
    from k3sim.configs.profiles import measured_dir
    from k3sim.kernels.store import load_store

    checked = 0
    for name in hardware_names():
        hw = load_hardware(name)
        d = measured_dir(hw)
        if d is not None:
            store = load_store(d, hardware=hw)
            checked += sum(len(df) for df in store.rows.values())
    assert checked > 1000


# ---- the reader itself --------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_line", [64, 4096])
def test_iter_lines_refuses_a_long_line_from_a_pipe_without_reading_it_all(max_line):
    """A pipe that never ends: the reader stops at the cap (a bounded read), not at the end."""
    from k3sim.errors import InputError
    from k3sim.reader import CHUNK_BYTES, iter_lines

    r, w = os.pipe()
    sent = [0]

    def feed():
        try:
            with os.fdopen(w, "wb") as f:
                while sent[0] < 64 * CHUNK_BYTES:
                    f.write(b"y" * CHUNK_BYTES)
                    sent[0] += CHUNK_BYTES
        except (BrokenPipeError, OSError):
            pass

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    with pytest.raises(InputError, match="line 1: longer than"):
        for _ in iter_lines(f"/dev/fd/{r}", max_line_bytes=max_line):
            pass
    os.close(r)
    t.join(timeout=10)
    assert sent[0] < 64 * CHUNK_BYTES  # stopped long before the writer was done


@pytest.mark.parametrize("text", [b"a\nb\n", b"a\nb", b"\n\nlast", b""])
def test_iter_lines_numbers_lines_like_a_file(tmp_path, text):
    from k3sim.reader import iter_lines

    p = tmp_path / "f"
    p.write_bytes(text)
    got = list(iter_lines(p, max_line_bytes=16))
    assert got == [(i + 1, line) for i, line in enumerate(text.split(b"\n")) if i < len(text.split(b"\n")) - 1
                   or line]


def test_an_anonymous_pipe_read_twice_gives_the_same_bytes():
    """A command may look at its input twice (the scenario's name, then the plan): `<(...)` cannot be
    reopened, so the second read gets what the first got instead of an empty file."""
    from k3sim.reader import read_bytes

    r, w = os.pipe()
    os.write(w, b"name: x\n")
    os.close(w)
    try:
        first = read_bytes(f"/dev/fd/{r}", max_bytes=100)
        assert read_bytes(f"/dev/fd/{r}", max_bytes=100) == first == b"name: x\n"
    finally:
        os.close(r)
