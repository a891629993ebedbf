"""The training harness (k3sim/calibration/train_fp8.py) without a GPU: its grids against the models and by hand,
the padding rule for cuBLAS's 128x128 scales, the byte and FLOP counts of the new ops, part and option handling,
resuming from an earlier run, and the committed H200 rows answering `kernel-time`. Torch- and Triton-dependent
tests (references by hand, the kernels under Triton's CPU interpreter, a tiny run the store accepts) are
skipped where torch is missing (CI has none)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3sim.calibration import grids
from k3sim.calibration import train_fp8 as t

RUNS = Path(__file__).resolve().parents[2] / "hardware_profiles" / "measured" / "h200"


def _model_linears() -> set[tuple[int, int]]:
    """(N, K) of every GEMM a training layer of the three models issues at TP 1-8, but the router, the LM head
    (not in the layers) and widths under 128, as k3sim.step.layers gives them."""
    from k3sim.configs.loaders import load_model
    from k3sim.step.batch import Batch
    from k3sim.step.layers import layer_calls, layer_signature
    from k3sim.step.layout import StepLayout

    root = Path(__file__).resolve().parents[2] / "models"
    out = set()
    for name in ("kimi-k3", "deepseek-v3", "kimi-linear-48b"):
        m = load_model(root / f"{name}.yaml")
        for tp in (1, 2, 4, 8):
            layout, seen = StepLayout(tp=tp, ep=8, expert_kernel="grouped_bf16"), set()
            batch = Batch(prefill=((4096, 0),))
            for i in range(m.num_layers):
                if layer_signature(m, i) in seen:
                    continue
                seen.add(layer_signature(m, i))
                for c in layer_calls(m, i, layout, batch, "grouped_bf16"):
                    if c.op.startswith("gemm_") and c.component != "moe_router" and c.params["N"] >= 128:
                        out.add((c.params["N"], c.params["K"]))
    return out


def test_train_linears_are_the_models_linears():
    """The committed list names exactly the linears the step model issues (a changed model changes this test)."""
    listed = {(n, k) for n, k, _ in grids.TRAIN_LINEARS}
    assert len(listed) == len(grids.TRAIN_LINEARS) == 101
    assert listed == _model_linears()
    assert (36864, 7168, "k3 tp1 kda_qkv_proj, ds3 tp1 dense_gate_up") in grids.TRAIN_LINEARS


def test_train_gemm_cases_by_hand(monkeypatch):
    """Linears (7168, 2048) and (4096, 4096) at tokens 1024, 4096. Tokens 1024: forward (1024, 7168, 2048) and
    (1024, 4096, 4096); dgrad (1024, 2048, 7168) (the square one repeats its forward); wgrad (2048, 7168, 1024)
    and (4096, 4096, 1024): 5. Tokens 4096: the same, but the square wgrad (4096, 4096, 4096) is its forward: 4."""
    monkeypatch.setattr(grids, "TRAIN_LINEARS", [(7168, 2048, "a"), (4096, 4096, "b")])
    cases = [(c["M"], c["N"], c["K"]) for c in grids.train_gemm_cases([1024, 4096])]
    assert cases == [(1024, 7168, 2048), (1024, 4096, 4096), (1024, 2048, 7168), (2048, 7168, 1024),
                     (4096, 4096, 1024), (4096, 7168, 2048), (4096, 4096, 4096), (4096, 2048, 7168),
                     (2048, 7168, 4096)]


def test_the_committed_grid_is_coarse_first():
    cases = grids.train_gemm_cases()
    assert len(cases) == 1256 == len({tuple(c.values()) for c in cases})
    assert cases[0]["M"] == 4096 and grids.TRAIN_M[0] == 4096  # the first pass spans every linear at 4096 tokens


def test_k_padding_rule_by_hand():
    """cuBLAS reads 128x128 scales with a leading dimension of ceil(K / 128) floats: wrong unless a multiple of 4
    (seen in run 20261202-1gpu-train-fp8), harmless with one block row (N <= 128). K 2304 = 18 blocks -> 2560
    (20); 2112 = 16.5 -> 17 blocks -> 2560; 448 = 3.5 -> 4 blocks: as is; 2048: as is."""
    assert t.needs_k_pad(7168, 2304) and t.needs_k_pad(7168, 2112) and t.needs_k_pad(256, 128)
    assert not t.needs_k_pad(7168, 2048) and not t.needs_k_pad(7168, 448) and not t.needs_k_pad(128, 2304)
    assert not t.needs_k_pad(7168, 2304, "1x128-1x128")
    assert t._padded(1024, 7168, 2304) == (1024, 7168, 2560) == t._padded(1024, 7168, 2112)
    assert t._padded(1024, 264, 7168) == (1024, 384, 7168)  # whole blocks where torch or cuBLAS refuses


def test_permute_cases_respect_the_byte_cap(monkeypatch):
    """7 T x 4 topk x 3 D = 84 under 16 GiB (largest 65536 x 16 x 7168 x 2 B = 15.0 GB). Under 1 GiB
    (T topk D <= 536,870,912): D 7168 keeps T topk <= 74,898 (18 pairs), D 3584 <= 149,796 (22), D 2048
    <= 262,144 (25): 65."""
    assert len(t.permute_cases()) == 84
    monkeypatch.setattr(grids, "TRAIN_PERMUTE_MAX_BYTES", 2 ** 30)
    cases = t.permute_cases()
    assert len(cases) == 65 and cases[0] == dict(T=1024, topk=2, D=7168)
    assert {c["D"]: sum(1 for x in cases if x["D"] == c["D"]) for c in cases} == {7168: 18, 2048: 25, 3584: 22}


def test_new_ops_bytes_and_flop_by_hand():
    """gemm_fp8_block M = N = K = 256: e4m3 2 x 65536 + bf16 2 x 65536 + fp32 scales 4 x (256 x 2 + 2 x 2) =
    264,208 B; K 200 (a partial block, 2 scales a row): 51200 x 2 + 131072 + 2064 = 235,536 B, 2 x 256^2 x 200
    FLOP. fp8_quant_128_t T 256, D 8: 3 x 2048 + 4 x 8 x 2 = 6208 B, 6144 FLOP; T 200 (2 groups): 4864 B.
    T 2, topk 3, D 8 (6 picks): permute / bwd / unpermute 2 (2 + 6) 8 + 12 x 6 = 200 B, FLOP 0 / 48 / 96;
    unpermute bwd 2 (2 + 12) 8 + 72 = 296 B, 3 x 48 = 144 FLOP."""
    from k3sim.kernels.ops import OPS

    g = OPS["gemm_fp8_block"]
    assert g.bytes(dict(M=256, N=256, K=256)) == 264208 and g.bytes(dict(M=256, N=256, K=200)) == 235536
    assert g.flop(dict(M=256, N=256, K=200)) == 2 * 256 * 256 * 200 and g.dtype == "fp8" and g.family == "gemm"
    q = OPS["fp8_quant_128_t"]
    assert q.bytes(dict(T=256, D=8)) == 6208 and q.flop(dict(T=256, D=8)) == 6144 and q.bytes(dict(T=200, D=8)) == 4864
    p = dict(T=2, topk=3, D=8)
    for op, flop in (("moe_permute_fused", 0), ("moe_permute_fused_bwd", 48), ("moe_unpermute_fused", 96)):
        assert OPS[op].bytes(p) == 200 and OPS[op].flop(p) == flop, op
    assert OPS["moe_unpermute_fused_bwd"].bytes(p) == 296 and OPS["moe_unpermute_fused_bwd"].flop(p) == 144


def test_bad_options_are_one_line_exit_2(tmp_path, capsys):
    for argv in (["--parts", "nope"], ["--parts", ""], ["--parts", "quant", "--part-budgets", "permute=10"],
                 ["--permute-ops", "moe_permute"], ["--gemm-tokens", "4096,x"], ["--gemm-tokens", "0"],
                 ["--resume-from", str(tmp_path / "absent")], ["--budget-s", "0"]):
        with pytest.raises(SystemExit) as e:
            t.main(["--out", str(tmp_path / "r"), *argv])
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, argv
    assert not (tmp_path / "r").exists()
    assert t.select_parts("quant, permute") == ["quant", "permute"]


def test_resume_skips_what_an_earlier_run_measured(tmp_path, monkeypatch):
    """An ok row is skipped, a failed one measured again; ops the run names in --permute-ops are measured again."""
    with open(tmp_path / "gemm_fp8_block.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerows([["M", "N", "K", "seconds", "status"], [1024, 7168, 2048, 1e-5, "ok"],
                     [1024, 7168, 2304, "", "failed"]])
    done = t.read_done(tmp_path)
    assert done == {"gemm_fp8_block": {("1024", "7168", "2048")}}
    monkeypatch.setattr(t, "RESUME", done)
    cases = [dict(M=1024, N=7168, K=2048), dict(M=1024, N=7168, K=2304), dict(M=2048, N=7168, K=2048)]
    assert t._todo("gemm_fp8_block", ["M", "N", "K"], cases) == cases[1:]


@pytest.mark.parametrize("op,run,params", [
    ("gemm_fp8_block", "20261202-1gpu-train-fp8", dict(M=4096, N=7168, K=2048)),
    ("gemm_fp8_block", "20261202-1gpu-train-fp8-b", dict(M=4096, N=7168, K=2304)),  # padded K: run b
    ("fp8_quant_128_t", "20261202-1gpu-train-fp8", dict(T=16384, D=7168)),
    ("moe_permute_fused", "20261202-1gpu-train-fp8-b", dict(T=16384, topk=8, D=7168)),  # b supersedes a
    ("moe_permute_fused_bwd", "20261202-1gpu-train-fp8", dict(T=16384, topk=8, D=7168)),
    ("moe_unpermute_fused", "20261202-1gpu-train-fp8", dict(T=16384, topk=8, D=7168)),
    ("moe_unpermute_fused_bwd", "20261202-1gpu-train-fp8", dict(T=16384, topk=8, D=7168)),
])
def test_committed_rows_answer_kernel_time(op, run, params):
    """kernel-time answers a measured shape with the committed run's own median."""
    from k3sim.predict import predict_kernel_time

    with open(RUNS / run / f"{op}.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh)
                if r["status"] == "ok" and all(int(r[k]) == v for k, v in params.items())]
    assert len(rows) == 1
    k = predict_kernel_time(op, params, "h200")
    assert k.source == "measured" and k.method == "exact" and run in k.detail
    assert k.seconds == pytest.approx(float(rows[0]["seconds"]), rel=1e-9)


# ---- with torch ------------------------------------------------------------------------------------------

def test_block_quant_pads_a_partial_block_and_dequantises_back():
    """x [2, 200]: row 0 holds 448 in block 0 and 44.8 in the 72-wide partial block 1 -> scales 1 and 0.1;
    dequantised values come back (e4m3 holds 448 and 448 x 0.1 / 0.1)."""
    torch = pytest.importorskip("torch")

    x = torch.zeros(2, 200)
    x[0, 0], x[0, 150], x[1, 7] = 448.0, 44.8, -4.48
    q, s = t.quant_blocks(x, 1)
    assert q.shape == (2, 200) and s.shape == (2, 2)
    assert s[0].tolist() == pytest.approx([1.0, 0.1]) and s[1, 0].item() == pytest.approx(0.01)
    assert torch.allclose(t.dequant_blocks(q, s, 1), x, rtol=1e-6)
    q2, s2 = t.quant_blocks(x, 128)  # one 128-row block holds both rows
    assert s2.shape == (1, 2) and s2[0, 1].item() == pytest.approx(0.1)


def test_quant_128_t_reference_by_hand():
    """128 tokens x 2 channels: channel 0 has 896 at token 5 -> scale 2, code 448 at [0, 5]; channel 1 all zero
    -> the floor scale, zero codes. The output is [D, T]."""
    torch = pytest.importorskip("torch")
    from k3sim.calibration import dispatch_ops as d

    x = torch.zeros(128, 2)
    x[5, 0], x[6, 0] = 896.0, 2.0
    q, s = d.quant_128_t_reference(x.bfloat16())
    assert q.shape == (2, 128) and s.shape == (1, 2)
    assert s[0, 0].item() == 2.0 and s[0, 1].item() == pytest.approx(d.SCALE_FLOOR)
    assert q.float()[0, 5].item() == 448.0 and q.float()[0, 6].item() == 1.0 and q.float()[1].abs().sum() == 0
    assert torch.equal(d.dequant_t(q, s), x)


def test_index_and_unpermute_backward_references_by_hand():
    """ids [[2, 0], [0, 1]] (E 3): flat [2, 0, 0, 1] sorts stably to picks [1, 2, 3, 0]: inv [3, 0, 1, 2],
    offsets [0, 2, 3, 4]. rows 1..4 (one channel) by row, w [[.5, 2], [1, 3]], dy [10, 100]: pick 0 sits in
    row 3 (value 4) -> d_row 5, dw 40; pick 1 row 0 (1) -> 20, 10; pick 2 row 1 (2) -> 100, 200; pick 3 row 2
    (3) -> 300, 300."""
    torch = pytest.importorskip("torch")
    from k3sim.calibration import permute_fused as pf

    ids = torch.tensor([[2, 0], [0, 1]], dtype=torch.int32)
    inv, perm, offs = pf.index_reference(ids, 3)
    assert inv.tolist() == [3, 0, 1, 2] and perm.tolist() == [1, 2, 3, 0] and offs.tolist() == [0, 2, 3, 4]
    rows = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    d_rows, dw = pf.unpermute_bwd_reference(torch.tensor([[10.0], [100.0]]), rows, inv,
                                            torch.tensor([[0.5, 2.0], [1.0, 3.0]]))
    assert d_rows[:, 0].tolist() == [20.0, 100.0, 300.0, 5.0] and dw.tolist() == [[40.0, 10.0], [200.0, 300.0]]
    x = torch.tensor([[1.0], [2.0]])
    assert pf.permute_reference(x, perm, 2)[:, 0].tolist() == [1.0, 2.0, 2.0, 1.0]
    assert pf.permute_bwd_reference(rows, perm, 2)[:, 0].tolist() == [1.0 + 4.0, 2.0 + 3.0]


KERNELS = """
import torch
from k3sim.calibration import dispatch_ops as d, permute_fused as pf
from k3sim.calibration.mxfp4 import rel_err
g = torch.Generator().manual_seed(0)
for T, k, E, D in ((37, 3, 10, 300), (200, 4, 256, 130), (300, 1, 1, 64)):
    ids = torch.rand(T, E, generator=g).argsort(-1)[:, :k].to(torch.int32).contiguous()
    inv, perm, offs = pf.build_index(ids, E)
    ri, rp, ro = pf.index_reference(ids, E)
    assert torch.equal(inv.long(), ri) and torch.equal(perm.long(), rp) and torch.equal(offs.long(), ro)
    x = torch.randn(T, D, generator=g).bfloat16()
    assert torch.equal(pf.permute_fused(x, ids, E)[0], pf.permute_reference(x, rp, k))
    gr, w = torch.randn(T * k, D, generator=g).bfloat16(), torch.rand(T, k, generator=g)
    dy = torch.randn(T, D, generator=g).bfloat16()
    assert rel_err(pf.permute_bwd(gr, inv, k, block_d=128), pf.permute_bwd_reference(gr, rp, k)) < 1e-2
    dr, dw = pf.unpermute_bwd(dy, gr, inv, w, block_d=128)
    rr, rw = pf.unpermute_bwd_reference(dy, gr, inv, w)
    assert rel_err(dr, rr) < 1e-2 and rel_err(dw, rw) < 1e-4
x = (torch.randn(384, 100, generator=g) * 3).bfloat16()
x[128:256, 5] = 0
q, s = d.quant_128_t(x, block_d=32)
qr, sr = d.quant_128_t_reference(x)
assert torch.allclose(s, sr, rtol=1e-6, atol=0) and torch.equal(q.float(), qr.float())
print("ok")
"""


def _interpret(code: str, timeout: int = 600):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def test_kernels_equal_their_references_under_the_triton_interpreter():
    """The counting-sort index equals torch's stable sort (a partial last block, 256 experts in two compare
    chunks, one expert); the permute's rows are exact; the backwards within bf16 / fp32 rounding (300 and 130
    channels in 128-wide blocks: masked blocks); fp8_quant_128_t equals its reference (100 channels in 32-wide
    tiles, a zero group)."""
    r = _interpret(KERNELS)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok"]


TINY_RUN = """
import sys
from pathlib import Path
from k3sim.calibration import train_fp8 as t, grids, records
records.provenance = lambda command, gpus, parts: {"gpu_name": "cpu", "command": command, "parts": ",".join(parts)}
t.operand_sets = lambda nbytes, cap=0: 2
t.INDEX_TIMING = [(64, 2, 8)]
t.QUANT_CHECK_SHAPES = [(256, 100)]
grids.TRAIN_PERMUTE_T, grids.TRAIN_PERMUTE_TOPK, grids.TRAIN_PERMUTE_D = [40], [2], [300]
grids.TRAIN_QUANT_T, grids.TRAIN_QUANT_D = [256], [200]
t.run(Path(sys.argv[1]), ["permute_check", "quant_check", "permute", "quant"], 600, {})
"""


def test_tiny_run_writes_files_the_store_accepts(tmp_path):
    """A CPU run (host timer) of the permute and quantisation parts: every op file parses under the store's
    checks with one ok row; the checks pass."""
    out = tmp_path / "run"
    r = _interpret(TINY_RUN.replace("sys.argv[1]", repr(str(out))))
    assert r.returncode == 0, r.stderr[-2000:]
    from k3sim.kernels.store import _read_csv

    for op in ("fp8_quant_128_t", *t.PERMUTE_OPS):
        path = out / f"{op}.csv"
        df = _read_csv(path, op, "run", path.read_bytes())
        assert int((df["status"] == "ok").sum()) == 1, op
    checks = (out / "permute_check.csv").read_text().splitlines()
    assert len(checks) == 7 and all(",ok," in line for line in checks[1:])
    assert ",ok," in (out / "quant_check.csv").read_text().splitlines()[1]
