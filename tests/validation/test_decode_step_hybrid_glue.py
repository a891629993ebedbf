"""The glue split of a whole-step run (`decode_step_hybrid.glue_split`): profiled kernels of the unmeasured family
grouped by the implementation piece they come from, on a hand-written kernels.csv."""

from __future__ import annotations

import csv

import pytest

from k3sim.errors import InputError
from k3sim.validation import decode_step_hybrid as V

COLS = ["config", "part", "expert_kernel", "B", "C", "chunk", "prefix", "decodes", "seq", "micro_batch", "phase",
        "kernel", "calls", "gpu_s"]
# real names from run 20261202-wholestep-qwen (trimmed where the profiler's 160 characters ran on)
INDEX_ADD = ("void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true, "
             "at::native::(anonymous namespace)::ReduceAdd>(at::cuda::detail::TensorInfo<float")
WHERE = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::where_kernel_impl(at::TensorIterator"
MUL = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native"
TOPK = "void at::native::mbtopk::computeBlockDigitCounts<float, unsigned int, unsigned int, 2>(at::cuda::detail::TensorInfo<float const, unsigned int>"
GEMM = "nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NNN"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"


def test_pieces_of_real_kernel_names():
    assert V.glue_piece(INDEX_ADD) == "MoE combine: fp32 index_add (+ expert-count scatter_add)"
    assert V.glue_piece(WHERE) == "select (torch.where)"
    assert V.glue_piece(MUL) == "bf16 multiply / add"
    assert V.glue_piece(TOPK) == "top-k, sorts, softmax (router, permute)"
    assert V.glue_piece("chunk_fwd_kernel_o") == "fla chunk output (GDN kernel, filed as glue)"
    assert V.glue_piece("Memcpy DtoD (Device -> Device)") == "copies and casts"
    assert V.glue_piece(FILL) == V.GLUE_REST


def _write(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS)
        w.writeheader()
        for part, x, kernel, calls, s in rows:
            base = {"B": x, "C": 4096} if part == "decode" else {"chunk": x, "prefix": 0, "decodes": 0}
            w.writerow({"config": "q", "part": part, "expert_kernel": "grouped_bf16", **base, "kernel": kernel,
                        "calls": calls, "gpu_s": s})


def test_split_sums_by_point_and_drops_measured_families(tmp_path):
    _write(tmp_path / "kernels.csv", [
        ("prefill", 2048, INDEX_ADD, 16, 4.5e-3),
        ("prefill", 2048, WHERE, 16, 1.7e-3),
        ("prefill", 2048, "void at::native::indexFuncSmallIndex<float, long, unsigned int, 2, 2, -2, "
                          "at::native::(anonymous namespace)::ReduceAdd>", 2, 0.1e-3),
        ("prefill", 2048, GEMM, 12, 1.6e-3),          # a GEMM: measured family, not glue
        ("decode", 8, INDEX_ADD, 16, 0.07e-3),
        ("decode", 8, FILL, 30, 0.02e-3),
    ])
    g = V.glue_split(tmp_path)
    pre = g[g.part == "prefill"].set_index("piece")
    # the two ReduceAdd kernels are one piece: 4.5 + 0.1 ms, 16 + 2 calls
    assert pre.loc["MoE combine: fp32 index_add (+ expert-count scatter_add)", "gpu_s"] == pytest.approx(4.6e-3)
    assert pre.loc["MoE combine: fp32 index_add (+ expert-count scatter_add)", "calls"] == 18
    assert pre.loc["select (torch.where)", "gpu_s"] == pytest.approx(1.7e-3)
    assert len(pre) == 2                              # the GEMM is not in the split
    dec = g[g.part == "decode"].set_index("piece")
    assert dec.gpu_s.sum() == pytest.approx(0.09e-3)
    assert set(dec.index) == {"MoE combine: fp32 index_add (+ expert-count scatter_add)", V.GLUE_REST}


def test_split_refuses_a_directory_without_kernels(tmp_path):
    with pytest.raises(InputError, match="kernels.csv not found"):
        V.glue_split(tmp_path)
