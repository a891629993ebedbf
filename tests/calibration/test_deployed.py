"""The deployed-shape harness (k3sim/calibration/deployed.py) without a GPU: its grids by hand, the MLA launch
variants and their names, the kernels around the dispatch on hand-worked cases, the fp32 expert reference,
block quantisation, bad options, and a tiny end-to-end run under Triton's CPU interpreter whose CSVs the
measured store accepts. Torch-dependent tests are skipped where torch is missing (CI has none)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from k3sim.calibration import grids
from k3sim.calibration.mla_decode import Variant, num_splits


def test_mla_grid_by_hand(monkeypatch):
    """6 H x 6 B x 6 C = 216 calls (the largest cache, B 256 x C 128K x 576 x 2 B = 36 GiB, fits under 60 GiB);
    the first pass is the first 3 B x first 3 C for every H (54). Under a 1 GiB cap (B C <= 932,067): B 1 takes
    6 contexts, B 8 five (not 128K), B 32 three (<= 16K), B 64 and 128 two (1K, 4K), B 256 one: 19 per H."""
    from k3sim.calibration import deployed as d

    cases = d.mla_cases()
    assert len(cases) == 216 and len({tuple(c.values()) for c in cases}) == 216
    first = cases[:54]
    assert {c["B"] for c in first} == {64, 1, 256} and {c["C"] for c in first} == {32768, 4096, 131072}
    assert {c["H"] for c in first} == {16, 32, 64, 128, 256, 512}
    assert cases[0] == dict(B=64, C=32768, H=128)  # the headline shape first
    monkeypatch.setattr(grids, "DEPLOYED_MLA_MAX_CACHE_BYTES", 2 ** 30)
    assert len(d.mla_cases()) == 19 * 6


def test_expert_grid_covers_rank_tokens_and_their_pairs():
    """At EP 32 / 128 with 8 experts per token (8 % ep != 0) a rank's op B is 8 x its tokens at topk 1."""
    b = set(grids.DEPLOYED_EXPERT_B)
    assert set(grids.DEPLOYED_RANK_TOKENS) <= b and {8 * t for t in grids.DEPLOYED_RANK_TOKENS} <= b
    assert [e for e, _ in grids.DEPLOYED_EXPERTS] == [256 // 32, 256 // 128, 384 // 128, 288 // 32, 384 // 32]


def test_head_classes_and_their_variants():
    from k3sim.calibration import deployed as d

    assert [d.mla_class(h) for h in (8, 16, 17, 32, 33, 64, 512)] == ["h16", "h16", "h32", "h32", "h64+", "h64+",
                                                                      "h64+"]
    wide = [v for v in d.class_variants("h64+") if v.max_block_h == 64]
    assert wide and all(v.num_warps == 8 for v in wide)  # a [64, 512] fp32 accumulator over 256 threads
    assert all(v.max_block_h == 32 for v in d.class_variants("h16"))
    for cls in d.MLA_CLASSES:
        for v in d.class_variants(cls):
            assert Variant.from_name(v.name) == v


def test_variant_names_round_trip_and_refuse_garbage():
    v = Variant(64, 8, 2, 64, head_fastest=True, waves=4)
    assert v.name == "c64-w8-s2-h64-t-v4" and Variant.from_name(v.name) == v
    for v in (Variant(64, 8, 2, 64, fused=True), Variant(32, 4, 2, 32, True, 1, lazy=True)):
        assert Variant.from_name(v.name) == v
    assert Variant(fused=True).name.endswith("-f") and Variant(lazy=True).name.endswith("-z")
    assert Variant().name == "c32-w8-s2-h32"  # the issue-10 names are unchanged
    with pytest.raises(ValueError):
        Variant.from_name("c64-w8")


def test_split_waves_by_hand():
    """H = 128 in 64-head tiles: 2 tiles. B = 1, C = 128K: 2 waves want 264 / 2 = 132 splits, 4 waves 264,
    1 wave 66; the 256-position floor caps at 131072 / 256 = 512. B = 64: ceil(264 / 128) = 3."""
    assert num_splits(1, 131072, 128, 64) == 132
    assert num_splits(1, 131072, 128, 64, waves=4) == 264
    assert num_splits(1, 131072, 128, 64, waves=1) == 66
    assert num_splits(64, 32768, 128, 64) == 3


def test_bad_options_are_one_line_exit_2(tmp_path, capsys):
    from k3sim.calibration import deployed as d

    for argv in (["--parts", "nope"], ["--parts", "mla", "--part-budgets", "moe_fp8=10"],
                 ["--variants", "h7=c32-w4-s2-h32"], ["--variants", "h16=fast"], ["--mla-heads", "96,x"],
                 ["--mla-batches", "0"]):
        with pytest.raises(SystemExit) as e:
            d.main(["--out", str(tmp_path / "r"), *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


# ---- with torch ------------------------------------------------------------------------------------------

def test_permute_and_unpermute_by_hand():
    """ids [[2, 0], [0, 1], [1, 2]]: flat [2, 0, 0, 1, 1, 2] sorts stably to picks [1, 2, 3, 4, 0, 5]
    (tokens 0, 1, 1, 2, 0, 2). Rows 10..60 in that order with weights [[.25, .75], [.5, .5], [1, 2]]:
    token 0 = .25 x 50 + .75 x 10 = 20, token 1 = .5 x 20 + .5 x 30 = 25, token 2 = 1 x 40 + 2 x 60 = 160."""
    torch = pytest.importorskip("torch")
    from k3sim.calibration import dispatch_ops as d

    x = torch.tensor([[1.0, -1.0], [2.0, -2.0], [3.0, -3.0]]).bfloat16()
    ids = torch.tensor([[2, 0], [0, 1], [1, 2]], dtype=torch.int32)
    rows, perm, inv = d.permute(x, ids)
    assert perm.tolist() == [1, 2, 3, 4, 0, 5] and inv.tolist() == [4, 0, 1, 2, 3, 5]
    assert rows[:, 0].float().tolist() == [1.0, 2.0, 2.0, 3.0, 1.0, 3.0]
    sorted_rows = torch.tensor([[10.0], [20.0], [30.0], [40.0], [50.0], [60.0]]).bfloat16()
    w = torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 2.0]])
    assert d.unpermute_torch(sorted_rows, perm, w)[:, 0].float().tolist() == [20.0, 25.0, 160.0]
    # rows that are their token's own row come back as the row times the sum of its weights
    assert d.unpermute_torch(rows, perm, w).float().tolist() == [[1.0, -1.0], [2.0, -2.0], [9.0, -9.0]]


def test_quant_reference_by_hand():
    """Group 0: one element 896 -> scale 896 / 448 = 2, the element 2 -> 1.0; group 1 all zero -> the floor
    scale, zeros; dequantised values come back (e4m3 is exact for 448 and 1)."""
    torch = pytest.importorskip("torch")
    from k3sim.calibration import dispatch_ops as d

    x = torch.zeros(1, 256)
    x[0, 0], x[0, 1] = 896.0, 2.0
    q, s = d.quant_reference(x.bfloat16())
    assert s.tolist() == [[2.0, pytest.approx(d.SCALE_FLOOR)]]
    assert q.float()[0, :2].tolist() == [448.0, 1.0] and q.float()[0, 128:].abs().sum().item() == 0.0
    assert torch.equal(d.dequant(q, s), x)


def test_block_quant_shapes_and_scales():
    """128x128 blocks of a 256 x 256 matrix: 2 x 2 scales, each its block's amax / 448."""
    torch = pytest.importorskip("torch")
    from k3sim.calibration.deployed import block_quant

    x = torch.zeros(256, 256)
    x[0, 0], x[200, 130] = 448.0, -44.8
    q, s = block_quant(x, 128)
    assert s.shape == (2, 2) and s[0, 0].item() == 1.0 and s[1, 1].item() == pytest.approx(0.1)
    assert q.float()[200, 130].item() == -448.0
    q1, s1 = block_quant(x, 1)
    assert s1.shape == (256, 2)


def test_fp8_reference_by_hand():
    """K = N = 1, expert 1: gate 1, up 0.5, down 2 (exact in e4m3), x = 2, weight 0.5:
    0.5 x silu(2) x (2 x 0.5) x 2 = silu(2) = 2 / (1 + e^-2) = 1.76159."""
    torch = pytest.importorskip("torch")
    from k3sim.calibration.deployed import fp8_reference

    w_gu = torch.tensor([[[3.0, 3.0]], [[1.0, 0.5]]]).to(torch.float8_e4m3fn)  # [E, K, 2N]
    w_d = torch.tensor([[[3.0]], [[2.0]]]).to(torch.float8_e4m3fn)  # [E, N, K]
    out = fp8_reference(torch.tensor([[2.0]]), torch.tensor([[1]]), torch.tensor([[0.5]]), w_gu,
                        torch.ones(2, 2), w_d, torch.ones(2, 1))
    assert out.item() == pytest.approx(2 / (1 + math.exp(-2)), rel=1e-6)


INTERPRETED = """
import sys, torch
from k3sim.calibration import dispatch_ops as d, mla_decode as m
g = torch.Generator().manual_seed(0)
x = (torch.randn(5, 384, generator=g) * 3).bfloat16()
x[2, 128:256] = 0
q, s = d.quant_128(x, groups=2)
qr, sr = d.quant_reference(x)
assert torch.allclose(s, sr, rtol=1e-6, atol=0), (s, sr)
assert torch.equal(q.float(), qr.float())  # the interpreter's fp32 path: torch rounds (dispatch_ops.quant_128)
ids = torch.rand(7, 5, generator=g).argsort(-1)[:, :3].to(torch.int32)
rows = torch.randn(21, 300, generator=g).bfloat16()
_, perm, inv = d.permute(rows[:7], ids)
w = torch.rand(7, 3, generator=g)
un, ref_un = d.unpermute(rows, inv, w, block_d=128), d.unpermute_torch(rows, perm, w)
assert float((un.float() - ref_un.float()).norm() / ref_un.float().norm()) < 1e-2
cases = ((2, 150, 70, m.Variant(32, 4, 2, 32, True, 4)), (1, 100, 64, m.Variant(32, 8, 2, 64, True, 1)),
         (2, 300, 20, m.Variant(32, 4, 2, 32, lazy=True)), (1, 200, 40, m.Variant(32, 4, 2, 32, fused=True)))
for B, C, H, v in cases:
    ql, qr_ = torch.randn(B, H, 512, generator=g).bfloat16(), torch.randn(B, H, 64, generator=g).bfloat16()
    cache = torch.randn(B, C, 576, generator=g).bfloat16()
    lens = torch.tensor([C - 37 * i for i in range(B)], dtype=torch.int32)
    out = m.MLADecode(B, C, H, "cpu", variant=v)(ql, qr_, cache, lens)
    ref = m.reference(ql, qr_, cache, lens)
    e = float((out.float() - ref).norm() / ref.norm())
    assert e < 1e-2, (v.name, e)
print("ok")
"""


def _interpret(code: str, timeout: int = 300):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def test_quant_kernel_and_mla_grid_orders_under_the_triton_interpreter():
    """The fp8 kernel's scales and scaled values equal its torch reference (2 groups per program, a 3-group
    row: a masked group; a zero group); the Triton unpermute equals the torch one (300 channels in 128-wide
    blocks: a masked block); the MLA kernel with head tiles innermost, other split waves, fused and lazy
    accumulation equals the fp32 reference (70 heads in three 32-head tiles, ragged lengths; 64 heads in one
    64-head tile)."""
    r = _interpret(INTERPRETED)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok"]


TINY_RUN = """
import sys
from pathlib import Path
from k3sim.calibration import deployed as d, grids, graph_parts as gp, records
records.provenance = lambda command, gpus, parts: {"gpu_name": "cpu", "command": command, "parts": ",".join(parts)}
d.operand_sets = lambda nbytes, cap=0: 2
d.MLA_CHECK_CASES = [(2, 100, 16)]
grids.DEPLOYED_MLA_H, grids.DEPLOYED_MLA_B, grids.DEPLOYED_MLA_C = [16], [1, 2], [64]
grids.DEPLOYED_DISPATCH_T, grids.DEPLOYED_QUANT_D, grids.DEPLOYED_DISPATCH_D = [4], [256], 256
grids.DEPLOYED_PERMUTE_TOPK = [2]
d.run(Path(sys.argv[1]), ["mla_check", "mla", "dispatch_check", "dispatch"], 300, {})
"""


def test_tiny_run_writes_files_the_store_accepts(tmp_path):
    """A CPU run (host timer) of the MLA and dispatch parts: every op file parses under the store's checks,
    with the rows and the variant column expected."""
    out = tmp_path / "run"
    r = _interpret(TINY_RUN.replace("sys.argv[1]", repr(str(out))))
    assert r.returncode == 0, r.stderr[-2000:]
    from k3sim.kernels.store import _read_csv

    counts = {}
    for op in ("mla_decode", "fp8_quant_128", "ep_permute", "ep_unpermute"):
        path = out / f"{op}.csv"
        df = _read_csv(path, op, "run", path.read_bytes())
        counts[op] = int((df["status"] == "ok").sum())
        if op == "mla_decode":
            assert set(df["variant"]) == {"c32-w4-s2-h32"}
    assert counts == {"mla_decode": 2, "fp8_quant_128": 1, "ep_permute": 1, "ep_unpermute": 1}
    checks = (out / "dispatch_check.csv").read_text().splitlines()
    assert len(checks) == 4 and all(",ok," in line for line in checks[1:])
    assert "parts: \"mla_check,mla,dispatch_check,dispatch\"" in (out / "provenance.yaml").read_text()


def test_best_split_plan_times_distinct_split_counts_and_keeps_the_fastest(monkeypatch):
    """B = 1, C = 1024, H = 16: every plan hits the 1024 / 256 = 4-split floor, one timing. B = 256, C = 1024:
    2 waves ceil(264 / 256) = 2 splits, 4 waves ceil(528 / 256) = 3, 1 wave ceil(132 / 256) = 1: three
    timings, the fastest (4 waves here) kept with its variant name."""
    from types import SimpleNamespace

    from k3sim.calibration import deployed as d

    calls = []

    def fake(B, C, H, v):
        calls.append(v.waves)
        return SimpleNamespace(seconds={2: 3.0, 4: 1.0, 1: 2.0}[v.waves]), {"variant": v.name}

    monkeypatch.setattr(d, "time_mla", fake)
    d.time_mla_best_split(1, 1024, 16, Variant(32, 4, 2, 32))
    assert calls == [2]
    calls.clear()
    t, ex = d.time_mla_best_split(256, 1024, 16, Variant(32, 4, 2, 32))
    assert calls == [2, 4, 1] and t.seconds == 1.0 and ex["variant"] == "c32-w4-s2-h32-v4"


def test_new_ops_bytes_and_flop_by_hand():
    """fp8_quant_128 T 2, D 256: 2 x 256 x (2 + 1) + 4 x 2 x 2 scales = 1552 B, 3 x 512 = 1536 FLOP (D 200:
    2 groups too). ep_permute / ep_unpermute T 2, topk 3, D 8: bf16 (2 + 6) x 8 x 2 = 128 B + 12 x 6 = 72:
    200 B; FLOP 0 / 2 x 6 x 8 = 96. moe_grouped_fp8 B 4, E 2, topk 1, K 8, N 16: 2 (1 - 1/2)^4 = 1.875
    experts x 16 x (8 + 4) + 4 rows x (8 + 4 + 32) = 360 + 176 = 536 B; 2 x 4 x 8 x 16 = 1024 FLOP."""
    from k3sim.kernels.ops import OPS

    q = OPS["fp8_quant_128"]
    assert q.bytes(dict(T=2, D=256)) == 1552 and q.flop(dict(T=2, D=256)) == 1536
    assert q.bytes(dict(T=2, D=200)) == 2 * 200 * 3 + 16
    p = dict(T=2, topk=3, D=8)
    assert OPS["ep_permute"].bytes(p) == OPS["ep_unpermute"].bytes(p) == 200
    assert OPS["ep_permute"].flop(p) == 0 and OPS["ep_unpermute"].flop(p) == 96
    g = OPS["moe_grouped_fp8"]
    assert g.bytes(dict(B=4, E=2, K=8, N=16, topk=1)) == pytest.approx(536)
    assert g.flop(dict(B=4, E=2, K=8, N=16, topk=1)) == 1024 and g.dtype == "fp8"


def test_sweep_tokens_measures_records_failures_and_stops_at_the_deadline():
    """The expert-shape sweep of moe_fp8 / moe_grouped_fp8: a failing point is recorded and the sweep goes on;
    past the deadline every point is recorded as skipped, none measured."""
    import time

    from k3sim.calibration.deployed import sweep_tokens

    class Writer:
        def __init__(self):
            self.ok_rows, self.failed_rows = [], []

        def ok(self, p, t, **ex):
            self.ok_rows.append((p["B"], t, ex))

        def failed(self, p, why):
            self.failed_rows.append((p["B"], str(why)))

    def measure(B, E, topk):
        if B == 512:
            raise RuntimeError("out of memory")
        return B * 1e-6, {"distinct_experts": E}

    w = Writer()
    done = sweep_tokens(w, measure, dict(E=8, topk=1), time.monotonic() + 60, tokens=[128, 512, 2048],
                        free=lambda: None)
    assert done == 2 and [b for b, *_ in w.ok_rows] == [128, 2048] and w.ok_rows[0][2] == {"distinct_experts": 8}
    assert w.failed_rows == [(512, "out of memory")]
    w = Writer()
    assert sweep_tokens(w, measure, dict(E=8, topk=1), time.monotonic() - 1, tokens=[128, 2048],
                        free=lambda: None) == 0
    assert w.ok_rows == [] and [why for _, why in w.failed_rows] == ["skipped: part time budget exhausted"] * 2
