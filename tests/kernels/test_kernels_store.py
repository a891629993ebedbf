"""Loading measured runs: concatenation, failed rows, corrupt and foreign files."""

from __future__ import annotations

import os

import pytest
from conftest import GEMM_POINTS, HBM_POINTS, write_run

from k3sim.errors import InputError
from k3sim.kernels.store import load_store


def test_runs_are_concatenated_and_failed_rows_kept(tmp_path):
    write_run(tmp_path, "a", {"gemm_bf16": GEMM_POINTS[:10]})
    write_run(tmp_path, "b", {"gemm_bf16": GEMM_POINTS[5:20], "hbm_copy": HBM_POINTS})
    (tmp_path / "b" / "notes.txt").write_text("free text is ignored")
    (tmp_path / "b" / "kcp_extra.csv").write_text("x,y\n1,2\n")
    st = load_store(tmp_path)
    assert sorted(st.runs) == ["a", "b"]
    assert len(st.ok("gemm_bf16")) == 25 and len(st.failed("gemm_bf16")) == 2
    pts = st.points("gemm_bf16")
    assert len(pts) == 20  # five shapes measured by both runs: the latest run's measurement is used
    both = pts[pts["rows"] == 2]
    assert len(both) == 5 and set(both["runs"]) == {"b"}
    assert st.ops() == ["gemm_bf16", "hbm_copy"]
    assert st.ignored == ["b/kcp_extra.csv"]
    assert pts["M"].dtype.kind == "i"


def test_latest_run_supersedes(tmp_path):
    write_run(tmp_path, "z-old", {"hbm_copy": HBM_POINTS[:2]})
    new = write_run(tmp_path, "a-new", {"hbm_copy": HBM_POINTS[:2]}, wiggle=0.5)
    (tmp_path / "z-old" / "provenance.yaml").write_text('gpu_name: g\ncommand: c\ndate_utc: "2026-01-01T00:00:00"\n')
    (new / "provenance.yaml").write_text('gpu_name: g\ncommand: c\ndate_utc: "2026-01-02T00:00:00"\n')
    pts = load_store(tmp_path).points("hbm_copy")
    assert list(pts["runs"]) == ["a-new", "a-new"] and list(pts["rows"]) == [2, 2]
    want = [float(line.split(",")[1]) for line in (new / "hbm_copy.csv").read_text().splitlines()[1:3]]
    assert list(pts["seconds"]) == want


def test_fingerprint_follows_content(tmp_path):
    """Content, not file times: the same bytes rewritten keep the fingerprint; a changed file changes its
    own op's fingerprint and the total, and leaves the other ops' (per-op fit staleness rests on it)."""
    run = write_run(tmp_path, "a", {"hbm_copy": HBM_POINTS, "gemm_bf16": GEMM_POINTS[:4]})
    s1 = load_store(tmp_path)
    text = (run / "hbm_copy.csv").read_text()
    (run / "hbm_copy.csv").write_text(text)  # same bytes, a later mtime (set: timestamps may be coarse)
    st = (run / "hbm_copy.csv").stat()
    os.utime(run / "hbm_copy.csv", ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    assert load_store(tmp_path) is s1  # the same bytes: the parse is reused (memoised by content, not mtime)
    from k3sim.kernels import store

    store._CACHE.clear()
    s2 = load_store(tmp_path)  # parsed again from the rewritten file
    assert s2 is not s1 and (s2.fingerprint, s2.op_fingerprints) == (s1.fingerprint, s1.op_fingerprints)
    (run / "hbm_copy.csv").write_text(text + "\n")
    s3 = load_store(tmp_path)
    assert s3.fingerprint != s1.fingerprint and s3.op_fingerprints["hbm_copy"] != s1.op_fingerprints["hbm_copy"]
    assert s3.op_fingerprints["gemm_bf16"] == s1.op_fingerprints["gemm_bf16"]


@pytest.mark.parametrize("content,match", [
    ("M,N,K,seconds,status\n1,2,3,1e-5,ok\n4,5\n\"unterminated", "corrupt CSV"),
    ("a,b,c\n1,2,3\n", "missing column"),
    ("M,N,K,seconds,status\n1,2,3,1e-5,maybe\n", "status must be ok or failed"),
    ("M,N,K,seconds,status\n1,2,3,fast,ok\n", "seconds='fast' is not a positive number"),
    ("M,N,K,seconds,status\n1,2,3,-1,ok\n", "is not a positive"),
    ("M,N,K,seconds,status\n1,2,3,inf,ok\n", "line 2: seconds=inf is not a positive number"),
    ("M,N,K,seconds,status\n1.5,2,3,1e-5,ok\n", "M=.* is not a positive integer"),
    ("M,N,K,seconds,status\n1,2,3,1e-5,ok\n1,33554432,3,1e-5,ok\n", "line 3: N=33554432 outside the op's allowed range"),
])
def test_corrupt_or_foreign_csv(tmp_path, content, match):
    run = write_run(tmp_path, "a", {})
    (run / "gemm_bf16.csv").write_text(content)
    with pytest.raises(InputError, match=match) as err:
        load_store(tmp_path)
    assert "gemm_bf16.csv" in str(err.value)


def test_failed_rows_may_be_empty(tmp_path):
    run = write_run(tmp_path, "a", {})
    (run / "gemm_bf16.csv").write_text("M,N,K,seconds,status,error\n1,2,3,1e-5,ok,\n4,5,6,,failed,OOM\n")
    st = load_store(tmp_path)
    assert len(st.ok("gemm_bf16")) == 1 and st.failed("gemm_bf16")["error"].tolist() == ["OOM"]


@pytest.mark.parametrize("prov,match", [
    ("- just\n- a list\n", "not a mapping"),
    ("gpu_name: x\n", "lacks command"),
    ("gpu_name: [unclosed\n", "unreadable provenance"),
])
def test_foreign_provenance(tmp_path, prov, match):
    run = write_run(tmp_path, "a", {"hbm_copy": HBM_POINTS})
    (run / "provenance.yaml").write_text(prov)
    with pytest.raises(InputError, match=match) as err:
        load_store(tmp_path)
    assert "provenance.yaml" in str(err.value)


def test_csvs_without_provenance(tmp_path):
    run = write_run(tmp_path, "a", {"hbm_copy": HBM_POINTS})
    (run / "provenance.yaml").unlink()
    with pytest.raises(InputError, match="no provenance.yaml"):
        load_store(tmp_path)
    with pytest.raises(InputError, match="no such"):
        load_store(tmp_path / "missing")


def test_spread_and_warmup_flags(tmp_path):
    run = write_run(tmp_path, "a", {})
    (run / "hbm_copy.csv").write_text(
        "bytes,seconds,seconds_p20,seconds_p80,reps,status,error\n"
        "1048576,1e-5,0.9e-5,1.3e-5,5,ok,\n"       # cut to 5 reps although short: slow warm-up before it
        "2097152,2e-5,1.9e-5,2.1e-5,25,ok,\n"
        "4194304,4e-5,,,25,ok,\n"
        "8388608,8e-5,,,200,ok,\n"                # a short kernel's extra repetitions do not make the
        "16777216,1.6e-4,,,25,ok,\n")             # base count look like a cut
    pts = load_store(tmp_path).points("hbm_copy")
    assert list(pts["warmup"]) == [True, False, False, False, False]
    assert list(pts["spread"]) == pytest.approx([0.4, 0.1, 0.0, 0.0, 0.0])


def test_collective_row_on_one_gpu_is_foreign(tmp_path):
    """A 1-GPU all_gather has no wire bytes: fitted, it would turn into nonsense times, so it is refused."""
    run = write_run(tmp_path, "a", {})
    (run / "all_gather.csv").write_text("bytes,gpus,seconds,status\n1024,2,1e-5,ok\n1024,1,1e-5,ok\n")
    with pytest.raises(InputError, match="line 3: gpus=1 outside") as err:
        load_store(tmp_path)
    assert "all_gather.csv" in str(err.value)


# ---- issue 19: every numeric column bounded, rows beyond the datasheet roofline refused ------------------------

@pytest.mark.parametrize("cell,ok", [("", True), ("nan", True), ("NaN", True), ("7e-06", True),
                                     ("soon", False), ("-1e-6", False), ("1e10", False)])
def test_optional_numeric_columns_may_be_unmeasured_but_not_wrong(tmp_path, cell, ok):
    """host_s empty or `nan` is "not measured" (committed KCP runs write `nan`); text or a value outside the
    bounds table's seconds range is refused with its line."""
    run = write_run(tmp_path, "a", {})
    (run / "hbm_copy.csv").write_text(f"bytes,seconds,host_s,status\n1024,1e-5,8e-6,ok\n2048,2e-5,{cell},ok\n")
    if ok:
        assert len(load_store(tmp_path).ok("hbm_copy")) == 2
    else:
        with pytest.raises(InputError, match="line 3: host_s=") as err:
            load_store(tmp_path)
        assert err.value.field == "host_s"


def test_line_numbers_count_blank_lines_and_quoted_newlines(tmp_path):
    """The line named is the file's line, not row + 2: a blank line and a quoted two-line error come before."""
    run = write_run(tmp_path, "a", {})
    (run / "hbm_copy.csv").write_text('bytes,seconds,status,error\n1024,1e-5,failed,"out of\nmemory"\n\n'
                                      "2048,2e-5,ok,\n4096,-1,ok,\n")
    with pytest.raises(InputError, match="line 6: seconds=-1 is not a positive number"):
        load_store(tmp_path)


@pytest.mark.parametrize("op,params,factor_ok", [
    ("hbm_copy", {"bytes": 2 ** 30}, 1.1), ("gemm_bf16", {"M": 8192, "N": 8192, "K": 8192}, 1.1),
    ("all_gather", {"bytes": 2 ** 28, "gpus": 2}, 1.9),
])
def test_rows_beyond_the_datasheet_roofline_are_refused_for_the_profile(tmp_path, op, params, factor_ok):
    """A row at `factor_ok` x the roofline speed loads (under PHYSICAL_FACTOR of its kind); 1e6 x does not."""
    from conftest import hardware

    from k3sim.kernels.ops import OPS
    from k3sim.kernels.predict import datasheet_time
    from k3sim.kernels.store import PHYSICAL_FACTOR

    hw = hardware(tmp_path)
    roof = datasheet_time(OPS[op], params, hw, "").seconds
    assert factor_ok < PHYSICAL_FACTOR[OPS[op].kind]
    cols = ",".join(params)
    vals = ",".join(str(v) for v in params.values())
    for speedup, refused in ((factor_ok, False), (1e6, True)):
        root = tmp_path / f"x{speedup:g}"
        run = write_run(root, "a", {})
        (run / f"{op}.csv").write_text(f"{cols},seconds,status\n{vals},{roof / speedup:.9g},ok\n")
        assert len(load_store(root).ok(op)) == 1  # without the profile: no roofline to hold it to
        if refused:
            with pytest.raises(InputError, match="line 2: seconds=.* faster than the datasheet roofline"):
                load_store(root, hardware=hw)
        else:
            load_store(root, hardware=hw)


def test_the_roofline_check_runs_once_per_profile(tmp_path, monkeypatch):
    from conftest import hardware

    import k3sim.kernels.predict as predict

    write_run(tmp_path, "a", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS})
    calls = []
    real = predict.datasheet_time
    monkeypatch.setattr(predict, "datasheet_time", lambda *a: calls.append(1) or real(*a))
    hw = hardware(tmp_path)
    load_store(tmp_path, hardware=hw)
    first = len(calls)
    load_store(tmp_path, hardware=hw)
    assert first == len(GEMM_POINTS) + len(HBM_POINTS) and len(calls) == first  # cached store, checked once


def test_a_measured_file_must_be_a_regular_file(tmp_path):
    run = write_run(tmp_path, "a", {})
    os.mkfifo(run / "hbm_copy.csv")  # nobody writes it: opened, it would wait forever
    with pytest.raises(InputError, match="is a pipe, not a file"):
        load_store(tmp_path)
