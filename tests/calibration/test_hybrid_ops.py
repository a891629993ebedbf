"""The hybrid-mixer harness (k3sim/calibration/hybrid_ops.py) and its ops without a GPU: the grids against the models'
heads per rank, the FLOP and byte counts of the new ops by hand, their refusals, option parsing and resuming, and
the committed H200 runs (20261202-1gpu-hybrid, -b, -c): every timed family passed its float64 check, and the rows
answer `kernel-time`."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from k3sim.calibration import hybrid_ops as h
from k3sim.errors import InputError
from k3sim.kernels.ops import OPS, validate_params

RUNS = Path(__file__).resolve().parents[2] / "hardware_profiles" / "measured" / "h200"
HYBRID_RUNS = [RUNS / n for n in ("20261202-1gpu-hybrid", "20261202-1gpu-hybrid-b", "20261202-1gpu-hybrid-c")]


def test_gdn_families_are_qwen3_next_and_qwen35_at_tp_1_to_8():
    """16 key heads over 32 (Qwen3-Next) and 64 (Qwen3.5) value heads, split over TP 1, 2, 4, 8."""
    want = {(16 // tp, v // tp) for v in (32, 64) for tp in (1, 2, 4, 8)}
    assert set(h.GDN_FAMILIES) == want and len(h.GDN_FAMILIES) == 8


def test_attention_shapes_divide_and_windows_fit_their_lengths():
    for hq, hkv, _ in h.GQA_PREFILL_SHAPES + h.GQA_DECODE_SHAPES:
        assert hq % hkv == 0
    assert set(h.SWA_SHAPES) <= set(h.GQA_PREFILL_SHAPES)  # the prefill check covers every windowed shape
    assert max(h.SWA_WINDOWS) < max(h.SWA_T)


def test_harness_params_are_the_registry_params():
    """Each CSV the harness writes is an op of the registry with the same parameter columns."""
    for op, params in h.OP_PARAMS.items():
        assert tuple(params) == OPS[op].params, op


def test_window_pairs_by_hand():
    # T = 4, W = 2: the queries see 1, 2, 2, 2 keys
    assert OPS["gqa_prefill_fwd"].flop({"T": 4, "Hq": 2, "Hkv": 1, "D": 8, "window": 2}) == 4 * 8 * 2 * 7
    # full attention (window = T): 1 + 2 + 3 + 4 pairs
    assert OPS["gqa_prefill_fwd"].flop({"T": 4, "Hq": 2, "Hkv": 1, "D": 8, "window": 4}) == 4 * 8 * 2 * 10
    # q, o over 2 heads and k, v over 1, 4 tokens of 8 bf16 values
    assert OPS["gqa_prefill_fwd"].bytes({"T": 4, "Hq": 2, "Hkv": 1, "D": 8, "window": 2}) == 2 * 4 * 8 * 2 * 3


def test_gdn_counts_by_hand():
    p = {"T": 64, "H": 2, "Hk": 1, "K": 128, "V": 128}
    # per token: q, k of one key head (2 x 128 bf16) + per value head v, o (2 x 128 bf16), g fp32, beta bf16
    per_token = 2 * 128 * 2 + 2 * (2 * 128 * 2 + 4 + 2)
    assert OPS["chunk_gdn_fwd"].bytes(p) == 64 * per_token + 2 * 128 * 128 * 4
    # the chunk FLOP are KDA's per value head, whatever the key heads
    assert OPS["chunk_gdn_fwd"].flop(p) == OPS["chunk_kda_fwd"].flop({"T": 64, "H": 2, "K": 128, "V": 128})
    assert OPS["chunk_gdn_fwd"].flop(p) == OPS["chunk_gdn_fwd"].flop(dict(p, Hk=2))
    assert OPS["chunk_gdn_fwd_bwd"].flop(p) == 3 * OPS["chunk_gdn_fwd"].flop(p)
    # decode: the fp32 state read and written, one token's inputs and output
    d = {"B": 1, "H": 2, "Hk": 1, "K": 128, "V": 128}
    assert OPS["recurrent_gdn_decode"].bytes(d) == 2 * 128 * 128 * 8 + per_token
    assert OPS["recurrent_gdn_decode"].flop(d) == 7 * 128 * 128 * 2


def test_mamba2_and_decode_counts_by_hand():
    # SSD as simple GLA per token and head, d_state 128, head_dim 64, chunk 64: 2 C (K + V) + 4 K V, 64 tokens
    assert OPS["mamba2_chunk_fwd"].flop({"T": 64, "H": 1, "K": 128, "V": 64}) == 64 * (2 * 64 * 192 + 4 * 128 * 64)
    assert OPS["mamba2_decode"].bytes({"B": 1, "H": 1, "P": 64, "N": 128}) == 8 * 64 * 128 + 3 * 2 * 64 + 2 + 2 * 2 * 128
    assert OPS["gqa_decode"].bytes({"B": 2, "C": 10, "Hq": 4, "Hkv": 2, "D": 8}) == 2 * 2 * (2 * 10 * 2 * 8 + 2 * 4 * 8)
    assert OPS["gqa_decode"].flop({"B": 2, "C": 10, "Hq": 4, "Hkv": 2, "D": 8}) == 4 * 2 * 4 * 10 * 8


@pytest.mark.parametrize("op,params,field", [
    ("chunk_gdn_fwd", {"T": 4096, "H": 32, "Hk": 12}, "Hk"),
    ("recurrent_gdn_decode", {"B": 1, "H": 8, "Hk": 3}, "Hk"),
    ("gqa_prefill_fwd", {"T": 4096, "Hq": 16, "Hkv": 2, "D": 256, "window": 8192}, "window"),
    ("gqa_prefill_fwd", {"T": 4096, "Hq": 16, "Hkv": 3, "D": 256, "window": 4096}, "Hkv"),
    ("gqa_decode", {"B": 1, "C": 4096, "Hq": 16, "Hkv": 3, "D": 128}, "Hkv"),
])
def test_bad_shapes_are_refused_naming_the_field(op, params, field):
    with pytest.raises(InputError) as e:
        validate_params(OPS[op], params)
    assert e.value.field == field


def test_family_options():
    assert h.parse_families("16:32, 2:8") == [(16, 32), (2, 8)]
    for bad in ("16:30", "16", "a:b", "0:4"):
        with pytest.raises(InputError):
            h.parse_families(bad)
    assert h.family_specs([(16, 32)], [128]) == ["gdn:16:32", "mamba2:128"]


def test_unknown_part_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        h.main(["--out", "/tmp/never-written", "--parts", "gdn_fwd,bogus"])
    assert e.value.code == 2 and "bogus" in capsys.readouterr().err


def test_resume_reads_ok_rows_only(tmp_path):
    (tmp_path / "chunk_gdn_fwd.csv").write_text("T,H,Hk,seconds,status\n4096,32,16,1e-3,ok\n8192,32,16,,failed\n")
    assert h.read_done(tmp_path) == {"chunk_gdn_fwd": {("4096", "32", "16")}}
    with pytest.raises(InputError):
        h.read_done(tmp_path / "missing")


def _rows(name: str) -> list[dict]:
    out = []
    for run in HYBRID_RUNS:
        path = run / f"{name}.csv"
        if path.is_file():
            with open(path, newline="") as fh:
                out += list(csv.DictReader(fh))
    return out


@pytest.mark.skipif(not HYBRID_RUNS[0].is_dir(), reason="the hybrid runs are not committed")
def test_every_timed_family_passed_its_float64_check():
    """No kernel check failed, and each op's timed (H, Hk) / head families have a passing check of that family. The
    only failed rows are run a's fla warm-ups, refused by fla's Triton-version guard before any check (README)."""
    rows = _rows("hybrid_check")
    checks = [r for r in rows if r["op"] in OPS]
    assert checks and all(r["passed"] == "1" for r in checks)
    assert max(float(r["rel_err"]) for r in checks) < h.CHECK_TOL
    assert all("warm-up failed" in r["output"] and "#640" in r["output"] for r in rows if r["op"] not in OPS)

    def checked(op: str) -> set[str]:
        return {r["shape"] for r in checks if r["op"] == op}

    for op in ("chunk_gdn_fwd", "chunk_gdn_fwd_bwd"):
        for r in (r for r in _rows(op) if r["status"] == "ok"):
            assert any(s.endswith(f"H={r['H']} Hk={r['Hk']}") for s in checked(op)), (op, r)
    for r in (r for r in _rows("recurrent_gdn_decode") if r["status"] == "ok"):
        assert any(s.endswith(f"H={r['H']} Hk={r['Hk']}") for s in checked("recurrent_gdn_decode")), r
    for op in ("mamba2_chunk_fwd", "mamba2_chunk_fwd_bwd"):
        for r in (r for r in _rows(op) if r["status"] == "ok"):
            assert any(s.endswith(f"H={r['H']}") for s in checked(op)), (op, r)


@pytest.mark.skipif(not HYBRID_RUNS[0].is_dir(), reason="the hybrid runs are not committed")
def test_a_measured_gdn_shape_answers_with_its_row():
    """Qwen3-Next's GDN layer at TP 1 (16 key / 32 value heads) over 16K tokens: the committed median."""
    from k3sim.configs import load_hardware
    from k3sim.kernels.predict import predict_kernel_time

    row = next(r for r in _rows("chunk_gdn_fwd") if (r["T"], r["H"], r["Hk"], r["status"]) == ("16384", "32", "16", "ok"))
    kt = predict_kernel_time("chunk_gdn_fwd", {"T": 16384, "H": 32, "Hk": 16}, load_hardware("h200"), convention="eager")
    assert kt.source == "measured"
    assert kt.seconds == pytest.approx(float(row["seconds"]) + float(row["host_s"]), rel=1e-6)
