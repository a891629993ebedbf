"""The kernel predictor's disk cache (k3sim.kernels.cache): a hit answers exactly as a miss and as no cache,
any change of a measured file rebuilds it, and it never stands in for validation or fails a query."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from pathlib import Path

import pytest
from conftest import COLL_POINTS, GEMM_POINTS, HBM_POINTS, hardware, write_run

from k3sim.errors import InputError
from k3sim.kernels import cache
from k3sim.kernels.predict import clear_cache, profile_predictor
from k3sim.predict import predict_kernel_time

# (op, params, convention): exact, interpolated, boundary-held and off-grid shapes, a collective, both timers
QUERIES = [
    ("gemm_bf16", dict(M=64, N=7168, K=2048), "graph"),
    ("gemm_bf16", dict(M=96, N=7168, K=2048), "graph"),
    ("gemm_bf16", dict(M=24, N=5000, K=3000), "eager"),
    ("gemm_bf16", dict(M=65536, N=7168, K=2048), "graph"),
    ("hbm_copy", dict(bytes=3 * 2 ** 20), "graph"),
    ("hbm_copy", dict(bytes=2 ** 38), "eager"),
    ("all_gather", dict(bytes=3 * 2 ** 20, gpus=2), "graph"),
    ("all_gather", dict(bytes=2 ** 24, gpus=8), "graph"),
]
EXACT = ("gemm_bf16", dict(M=64, N=7168, K=2048), "graph")


def fresh() -> None:
    """Forget every in-process memo (the profile predictors and the parsed stores), as a new process would."""
    from k3sim.kernels import store

    clear_cache()
    store._CACHE.clear()


def answers(hw, queries=QUERIES) -> list[tuple]:
    """Every query's answer from a fresh predictor, floats as their exact bits."""
    fresh()
    out = []
    for op, p, conv in queries:
        kt = predict_kernel_time(op, p, hw, convention=conv)
        out.append((op, tuple(p.items()), kt.seconds.hex(), kt.source, kt.detail, kt.method, kt.convention))
    return out


def parsed(hw) -> bool:
    """Whether the profile's predictor was built from the store (a miss of its entries) rather than from them."""
    return profile_predictor(hw)._store is not None


def entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*.pkl"))


@pytest.fixture
def profile(tmp_path, monkeypatch):
    """A synthetic calibrated profile and an empty cache directory of its own."""
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    root = tmp_path / "measured" / "testgpu"
    write_run(root, "run1", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS, "all_gather": COLL_POINTS},
              wiggle=0.03)
    yield hardware(root), root, tmp_path / "cache"
    fresh()


def no_cache(monkeypatch, tmp_path) -> None:
    """A cache directory that cannot exist (under a regular file): every save fails, every load misses."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV, str(blocker / "cache"))


def answers_without_cache(hw, monkeypatch, tmp_path) -> list[tuple]:
    """The answers with no usable cache directory (the path the code takes where nothing can be written)."""
    saved = os.environ[cache.ENV]
    no_cache(monkeypatch, tmp_path)
    out = answers(hw)
    monkeypatch.setenv(cache.ENV, saved)
    return out


def test_hit_answers_exactly_as_a_miss_and_as_no_cache(profile, monkeypatch, tmp_path):
    hw, _, cdir = profile
    want = answers_without_cache(hw, monkeypatch, tmp_path)
    monkeypatch.setenv(cache.ENV, str(cdir))
    cold = answers(hw)
    assert parsed(hw) and entries(cdir)
    warm = answers(hw)
    assert not parsed(hw)  # every answer came from the cache: the store was not parsed
    assert cold == want and warm == want


def test_hit_on_the_committed_h200_data_is_exact(monkeypatch, tmp_path):
    """The real profile: measured, interpolated, extrapolated (head dim 64) and collective answers."""
    from k3sim.configs import load_hardware

    hw = load_hardware("h200")
    queries = [("chunk_kda_fwd", dict(T=32768, H=12), "graph"), ("chunk_kda_fwd", dict(T=20000, H=12), "eager"),
               ("chunk_kda_fwd", dict(T=32768, H=12, K=64, V=64), "graph"),
               ("gemm_bf16", dict(M=64, N=7168, K=2048), "graph"), ("mla_decode", dict(B=64, C=32768, H=12), "eager"),
               ("all_gather", dict(bytes=6291456, gpus=8), "graph"),
               # both collective series (comm.model.SERIES): barrier-started rows, an empty graph series
               ("all_reduce", dict(bytes=2 ** 20, gpus=2), "eager"), ("send_recv", dict(bytes=2 ** 20, gpus=2), "graph")]
    no_cache(monkeypatch, tmp_path)
    want = answers(hw, queries)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    assert answers(hw, queries) == want and parsed(hw)
    assert answers(hw, queries) == want and not parsed(hw)
    fresh()


def test_same_size_same_mtime_edit_rebuilds(profile):
    """A rewrite that keeps the size and (forced back) the mtime: only the bytes differ, and they decide."""
    hw, root, _ = profile
    before = answers(hw)
    path = root / "run1" / "gemm_bf16.csv"
    st = path.stat()
    text = path.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("64,7168,2048,"))
    cell = line.split(",")[3]
    digit = "1" if cell[0] != "1" else "2"  # the seconds' leading digit: same length, another value
    path.write_text(text.replace(line, line.replace(cell, digit + cell[1:], 1), 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    fresh()
    kt = predict_kernel_time(*EXACT[:2], hw)
    assert parsed(hw) and kt.seconds == float(digit + cell[1:])
    assert answers(hw) != before


@pytest.mark.parametrize("change", ["add-run", "add-op", "remove-csv", "remove-run"])
def test_adding_or_removing_a_file_rebuilds(profile, change):
    hw, root, _ = profile
    if change.startswith("remove"):  # the removed data has to come from a second run
        write_run(root, "run2", {"hbm_copy": HBM_POINTS[:4]}, wiggle=0.4)
    before = answers(hw)
    answers(hw)
    assert not parsed(hw)  # warm
    if change == "add-run":  # a re-measurement of some shapes supersedes
        write_run(root, "run3", {"gemm_bf16": GEMM_POINTS[:6]}, wiggle=0.5)
    elif change == "add-op":
        (root / "run1" / "hbm_read.csv").write_text((root / "run1" / "hbm_copy.csv").read_text())
    elif change == "remove-csv":
        (root / "run2" / "hbm_copy.csv").unlink()
    else:
        for p in (root / "run2").iterdir():
            p.unlink()
        (root / "run2").rmdir()
    after = answers(hw)
    assert parsed(hw)
    if change == "add-op":
        assert "hbm_read" in profile_predictor(hw).ops() and after == before
    else:
        assert after != before


@pytest.mark.parametrize("where", ["a regular file", "under a regular file", "/dev/null/k3sim", "read-only"])
def test_unwritable_cache_dir_falls_back_silently(profile, monkeypatch, tmp_path, where):
    hw, _, cdir = profile
    want = answers(hw)
    if where == "a regular file":
        target = tmp_path / "file"
        target.write_text("x")
    elif where == "under a regular file":
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "cache"
    elif where == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        target = tmp_path / "ro"
        target.mkdir(mode=0o500)
    else:
        target = Path(where)
    monkeypatch.setenv(cache.ENV, str(target))
    assert answers(hw) == want and parsed(hw)
    assert answers(hw) == want and parsed(hw)  # nothing was cached: parsed again
    assert not (target.is_dir() and entries(target))


class _Tripwire:
    """Unpickled by a plain unpickler, it would call `_trip` (a stand-in for code run by a planted file)."""

    def __reduce__(self):
        return (_trip, ())


TRIPPED: list[int] = []


def _trip():
    TRIPPED.append(1)


def _rewrite(path: Path, how: str) -> None:
    blob = path.read_bytes()
    if how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "bit flip":
        path.write_bytes(blob[:-5] + bytes([blob[-5] ^ 0x10]) + blob[-4:])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(len(blob)))
    elif how == "planted global":  # a valid header and checksum around a pickle that names a function
        key = path.parent.name
        payload = pickle.dumps((key, _Tripwire()), protocol=5)
        path.write_bytes(cache.FORMAT + hashlib.sha256(payload).digest() + payload)
    elif how == "other key":  # well formed, but saved under another key (a file moved between directories)
        payload = pickle.dumps(("0" * 64, {"ops": []}), protocol=5)
        path.write_bytes(cache.FORMAT + hashlib.sha256(payload).digest() + payload)


@pytest.mark.parametrize("how", ["truncated", "bit flip", "empty", "garbage", "planted global", "other key"])
def test_corrupted_cache_file_is_ignored_and_rebuilt(profile, how):
    hw, _, cdir = profile
    want = answers(hw)
    files = entries(cdir)
    assert len(files) >= 4  # the index and one entry per op and convention asked
    for path in files:
        _rewrite(path, how)
    assert answers(hw) == want and parsed(hw)
    assert not TRIPPED  # nothing in the file was called
    for path in files:  # rewritten whole
        assert cache.load(path.parent.name, path.stem) is not None
    assert answers(hw) == want and not parsed(hw)


@pytest.mark.parametrize("edit,match", [
    (lambda cell: "-1", "is not a positive number"),
    (lambda cell: "fast", "seconds='fast' is not a positive number"),
    (lambda cell: "1e-9", "faster than the datasheet roofline"),  # in range, ~2000x beyond the GPU's peak
])
def test_invalid_row_is_refused_although_a_cache_exists(profile, edit, match):
    """The cache holds the previous bytes' validated predictor; the new bytes are another key, so the store is
    parsed and the row refused; no entry is written for bytes that failed."""
    hw, root, cdir = profile
    want = answers(hw)
    path = root / "run1" / "gemm_bf16.csv"
    good = path.read_text()
    line = next(ln for ln in good.splitlines() if ln.startswith("64,7168,2048,"))
    cells = line.split(",")
    cells[3] = edit(cells[3])
    path.write_text(good.replace(line, ",".join(cells), 1))
    n = len(entries(cdir))
    fresh()
    with pytest.raises(InputError, match=re.escape(match) if "'" in match else match):
        predict_kernel_time(*EXACT[:2], hw)
    assert len(entries(cdir)) == n
    path.write_text(good)  # the previous bytes again: their entries are still valid
    assert answers(hw) == want and not parsed(hw)


def test_edited_fit_file_rebuilds(profile):
    """fitted.yaml is part of the key: a hand-edited fit shows in the next answer."""
    from k3sim.kernels.fit import FITTED_NAME, fit_profile, write_fitted
    from k3sim.kernels.store import load_store

    hw, root, _ = profile
    fp = fit_profile(load_store(root), hw)
    write_fitted(root / FITTED_NAME, fp)
    shape = dict(bytes=2 ** 38)

    def model_s() -> float:
        fresh()
        return profile_predictor(hw).op("hbm_copy").model_seconds(shape)[0]

    first = model_s()
    assert model_s() == first and not parsed(hw)  # warm
    fp.ops["hbm_copy"].roofline.eff_bytes *= 0.5
    write_fitted(root / FITTED_NAME, fp)
    assert model_s() == pytest.approx(2 * first, rel=0.01) and parsed(hw)


def test_cache_location(monkeypatch, tmp_path):
    """$K3SIM_CACHE_DIR, else $XDG_CACHE_HOME/k3sim (an absolute one), else ~/.cache/k3sim: never the cwd."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "k3sim"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "k3sim"


def test_parsed_store_hit_is_identical(tmp_path, monkeypatch):
    """The parsed store (k3sim.kernels.store) from the cache: every frame, dtype (numbers, pandas strings, a
    mixed column) and derived table equals a fresh parse's."""
    import pandas as pd

    from k3sim.kernels import store as st

    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    root = tmp_path / "m"
    write_run(root, "a", {"gemm_bf16": GEMM_POINTS, "hbm_copy": HBM_POINTS, "all_gather": COLL_POINTS})
    write_run(root, "b", {"gemm_bf16": GEMM_POINTS[:5]}, failed=False, wiggle=0.2)  # error column all empty
    (root / "b" / "notes.csv").write_text("x\n1\n")
    st._CACHE.clear()
    new = st.load_store(root)
    st._CACHE.clear()
    hit = st.load_store(root)
    assert hit is not new and entries(tmp_path / "cache")
    assert new.rows["gemm_bf16"]["error"].dtype == object  # strings in run a, nothing in run b
    for op in new.rows:
        pd.testing.assert_frame_equal(hit.rows[op], new.rows[op], check_exact=True)
        assert [type(hit.rows[op][c].array) for c in hit.rows[op]] == [type(new.rows[op][c].array)
                                                                        for c in new.rows[op]]
        for conv in ("graph", "eager"):
            pd.testing.assert_frame_equal(hit.points(op, conv), new.points(op, conv), check_exact=True)
    assert (hit.runs, hit.ignored, hit.ops(), hit.fingerprint, hit.op_fingerprints, hit.run_order()) == \
        (new.runs, new.ignored, new.ops(), new.fingerprint, new.op_fingerprints, new.run_order())
    st._CACHE.clear()


def test_physical_check_is_per_hardware_although_the_store_is_cached(profile):
    """A store cached (and checked) for one profile is still held to another profile's roofline: a GPU with a
    hundredth of the bandwidth and peak makes the synthetic rows unphysical."""
    from types import SimpleNamespace

    hw, _, _ = profile
    answers(hw)
    slow = SimpleNamespace(**{**vars(hw), "name": "slowgpu",
                              "hbm_bandwidth_bytes_per_s": hw.hbm_bandwidth_bytes_per_s / 100,
                              "peak_flops_per_s": {k: v / 100 for k, v in hw.peak_flops_per_s.items()}})
    fresh()
    with pytest.raises(InputError, match="faster than the datasheet roofline of profile 'slowgpu'"):
        predict_kernel_time(*EXACT[:2], slow)
    assert answers(hw)  # the first profile still answers from its entries
