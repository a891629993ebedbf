"""`k3sim cp`'s disk cache (k3sim.cp.cached): the intra-device fit and the KCP parts with their fixed costs. A hit
answers exactly as a miss and as no cache, a changed part file (same size) is refitted, and a warm query reads
no CSV through pandas."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from k3sim.configs.profiles import load_profile, measured_dir
from k3sim.output import to_jsonable

ROOT = Path(__file__).resolve().parents[2]


def forget() -> None:
    """Every in-process memo of the parts, the stores and the predictors: as a new process starts."""
    from k3sim.cp import kcp_parts
    from k3sim.kernels import store
    from k3sim.kernels.predict import clear_cache

    kcp_parts._PARTS.clear()
    store._CACHE.clear()
    clear_cache()


def step(hw) -> dict:
    from k3sim.cp import cp_step, geometry_from_model
    from k3sim.configs import load_model

    g = geometry_from_model(load_model("models/kimi-k3.yaml"), tp=1)
    return to_jsonable(cp_step(g, hw, 1 << 20, 8, "kcp", docs=1))


def entries(root: Path) -> list[Path]:
    return sorted((root / "cp").rglob("*.pkl")) if (root / "cp").is_dir() else []


def no_cache(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("K3SIM_CACHE_DIR", str(blocker / "cache"))


@pytest.fixture
def measured_copy(tmp_path, monkeypatch):
    """The committed H200 measurements in a directory of this test, an h200 profile that points at it, and an
    empty cache directory."""
    src = measured_dir(load_profile("h200"))
    dst = tmp_path / "measured"
    shutil.copytree(src, dst)
    hw = load_profile("h200").model_copy(update={"calibration_dir": str(dst)})
    monkeypatch.setenv("K3SIM_CACHE_DIR", str(tmp_path / "cache"))
    forget()
    yield hw, dst, tmp_path / "cache"
    forget()


def test_hit_answers_exactly_as_a_miss_and_as_no_cache(measured_copy, monkeypatch, tmp_path):
    hw, _, cache = measured_copy
    miss = step(hw)
    assert sorted(p.name for p in entries(cache)) == ["intra.pkl", "parts.pkl"]
    forget()
    hit = step(hw)
    forget()
    no_cache(monkeypatch, tmp_path)
    plain = step(hw)
    assert hit == miss == plain
    kcp = [r for r in hit["breakdown"] if r["component"].startswith("KCP fixed cost")]
    assert len(kcp) == 2 and kcp[0]["seconds_per_layer"] > 0  # the fixed cost came back from the entry


def test_a_part_file_edited_in_place_is_refitted(measured_copy, monkeypatch, tmp_path):
    """Same size, one digit of one measured pre-process time changed: another key, the new number is used."""
    hw, root, cache = measured_copy
    before = step(hw)
    path = sorted(root.glob("*/kcp_pre_fwd.csv"))[-1]
    data = path.read_bytes()
    lines = data.split(b"\n")
    header = lines[0].rstrip(b"\r").split(b",")
    col, status = header.index(b"seconds"), header.index(b"status")
    for i, line in enumerate(lines[1:], 1):
        cells = line.split(b",")
        if len(cells) > col and cells[status] == b"ok" and cells[col][-1:] in (b"1", b"2", b"3", b"4"):
            cells[col] = cells[col][:-1] + str(int(cells[col][-1:]) + 1).encode()
            lines[i] = b",".join(cells)
            break
    size = path.stat().st_size
    path.write_bytes(b"\n".join(lines))
    assert path.read_bytes() != data
    assert path.stat().st_size == size
    forget()
    after = step(hw)
    # the parts are refitted under a new key; the intra-device fit (chunk_kda_fwd rows) keeps its entry
    assert sorted(p.name for p in entries(cache)) == ["intra.pkl", "parts.pkl", "parts.pkl"]
    forget()
    no_cache(monkeypatch, tmp_path)
    assert after == step(hw) != before


def test_other_hardware_fields_are_another_key(measured_copy, monkeypatch, tmp_path):
    """The fixed costs hold kernel and collective times: a profile with other figures gets entries of its own,
    and answers as it does without a cache."""
    hw, _, cache = measured_copy
    step(hw)
    forget()
    other = hw.model_copy(update={"scaleup_bandwidth_bytes_per_s": hw.scaleup_bandwidth_bytes_per_s * 2,
                                  "num_sms": 114})
    b = step(other)
    assert len(entries(cache)) == 4
    forget()
    no_cache(monkeypatch, tmp_path)
    assert step(other) == b


def test_a_warm_cp_query_reads_no_csv_through_pandas(tmp_path):
    """The second of two identical queries, in a fresh process with the first one's cache, imports no pandas."""
    code = ("import sys\nfrom k3sim.cli import main\ntry:\n    main(['cp', '--seq-len', '256K', '--cp', '4', '--json'])\n"
            "except SystemExit:\n    pass\nprint('PANDAS=' + str('pandas' in sys.modules), file=sys.stderr)")
    env = dict(os.environ, K3SIM_CACHE_DIR=str(tmp_path / "cache"))
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert [r.stderr.strip().splitlines()[-1] for r in runs] == ["PANDAS=True", "PANDAS=False"]
    assert runs[0].stdout == runs[1].stdout and '"kda_layer_time_s"' in runs[1].stdout
