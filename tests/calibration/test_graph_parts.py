"""Graph-replay harness parts that run without a GPU: operand rotation sizing and the CPU stand-in timer."""

from __future__ import annotations

import pytest

from k3sim.calibration import graph_parts as gp


def test_operand_sets_cover_three_l2s(monkeypatch):
    """60 MiB L2: a 1 MiB call needs ceil(3 x 60) = 180 copies; a 1 GiB call one; tiny calls stop at
    the cap; a 4 GiB call fits once under the 6 GiB cap."""
    monkeypatch.setattr(gp, "l2_bytes", lambda: 60 * 2 ** 20)
    assert gp.operand_sets(2 ** 20) == 180
    assert gp.operand_sets(2 ** 30) == 1
    assert gp.operand_sets(100) == gp.MAX_SETS
    assert gp.operand_sets(100, cap=32) == 32
    assert gp.operand_sets(4 * 2 ** 30) == 1
    assert gp.operand_sets(2 * 2 ** 30 + 1) == 1  # want 1 anyway; the cap allows 2


def test_time_host_stands_in_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU machine times with graphs")
    calls = []
    t, extra = gp.time_graph([lambda: calls.append(1), lambda: calls.append(2)], budget_s=0.1)
    assert extra == {"timer": "host", "calls_per_graph": 1, "operand_sets": 2}
    assert t.seconds >= 0 and t.reps == 3 and len(calls) == 2 + 3


def test_parts_and_grids():
    assert gp.GRAPH_GEMM_M and max(gp.GRAPH_GEMM_M) == 1024 and sorted(set(gp.GRAPH_GEMM_M)) == sorted(gp.GRAPH_GEMM_M)
    assert max(gp.GRAPH_HBM_BYTES) == 256 * 2 ** 20
    # K3 routed experts: E = 896 / EP local, 16 / EP picked locally
    assert [(gp.K3_EXPERTS // ep, gp.K3_TOPK // ep) for ep in sorted(gp.FFN_EP)] == [
        (896, 16), (448, 8), (224, 4), (112, 2), (56, 1)]
    # MLA grid under B x C <= 2M positions, by hand: B = 1, 4, 16 take all 5 contexts (16 x 128K = 2M),
    # B = 64 three (<= 16K), B = 256 two (<= 4K): 20 shapes per head count
    cases = [(b, c) for b in gp.MLA_B for c in gp.MLA_C if b * c <= gp.MLA_MAX_POSITIONS]
    assert len(cases) == 20 and (16, 131072) in cases and (64, 65536) not in cases


def test_bad_part_is_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gp.main(["--out", str(tmp_path / "r"), "--parts", "nope"])
    assert e.value.code == 2
    assert "unknown part" in capsys.readouterr().err
