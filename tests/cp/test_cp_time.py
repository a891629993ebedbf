"""Time composition with a fake kernel clock: overlap, fold, links, documents, hybrid sums."""

from __future__ import annotations

import pytest

from cp_fakes import ALPHA, LINK, SDPA_FLOPS, fake_kernel_time, hw, k3
from k3sim.cp import cp_step
from k3sim.cp.comm import KernelClock
from k3sim.cp.layers import kcp_layer, ring_layer
from k3sim.cp.model import layer_inputs
from k3sim.cp.published import predict_published


def x_(S, P, **kw):
    return layer_inputs(k3(kw.pop("tp", 1)), kw.pop("hw", hw()), S, P, kernel_time=fake_kernel_time, **kw)


def rows(phase):
    return {r["component"].split(",")[0].split(":")[0]: r["seconds"] for r in phase.rows}


def test_kcp_forward_composition():
    """fwd = main(L) + pre-process 0.90 x main(L) + 7 fold steps + all-gather + halo, all in series."""
    x = x_(65536, 8, state_dtype="bf16")
    lc = kcp_layer(x)
    main = 2e-5 + 8192 * 96 * 1e-10
    fold = 7 * 2 * (96 * 128) * 128 * 128 / 6e14
    ag = ALPHA + 7 * 96 * 128 * 256 * 2 / LINK
    halo = ALPHA + 3 * 96 * 384 * 2 / LINK
    expect = main + x.kcp_pre_factor * main + fold + ag + halo
    assert lc.fwd.time_s == pytest.approx(expect, rel=1e-9)
    assert lc.fwd.exposed_comm_s == pytest.approx(ag + halo, rel=1e-9)


def test_fp32_fold_by_hand():
    """P = 8, one document: the last rank folds 7 summaries; each step is a (96 x 128) x 128 x 128 matmul
    (fake GEMM at 6e14 FLOP/s: 2 x 12288 x 128 x 128 / 6e14 = 0.671089 us), in three TF32 passes for an
    fp32 state (fla PR #740): 7 x 3 x 0.671089 us = 14.0929 us; one pass in bf16: 4.69762 us."""
    b = rows(kcp_layer(x_(65536, 8, state_dtype="bf16")).fwd)
    f = rows(kcp_layer(x_(65536, 8, state_dtype="fp32")).fwd)
    assert b["fold"] == pytest.approx(4.697620e-6, rel=1e-6)
    assert f["fold"] == pytest.approx(14.09286e-6, rel=1e-6)


def test_kcp_comm_is_length_independent_compute_is_not():
    a, b = kcp_layer(x_(32768, 8)), kcp_layer(x_(1048576, 8))
    assert a.fwd.recv_bytes == b.fwd.recv_bytes
    assert a.fwd.comm_s == pytest.approx(b.fwd.comm_s)
    assert b.fwd.compute_s > 10 * a.fwd.compute_s         # 32x the tokens, fixed fold and launch costs


def test_docs_at_rank_edges_skip_fold_and_preprocess():
    r = rows(kcp_layer(x_(65536, 8, docs=8)).fwd)
    assert r["fold"] == 0 and r["pre-process (M"] == 0


def test_ring_hides_comm_under_compute_on_nvlink_not_on_a_slow_link():
    fast = ring_layer(x_(262144, 8, mla_kv="expanded"), "zigzag-ring")
    slow = ring_layer(x_(262144, 8, mla_kv="expanded", bandwidth_override=1e9), "zigzag-ring")
    assert fast.fwd.exposed_comm_s == pytest.approx(0.0, abs=1e-12)
    assert slow.fwd.exposed_comm_s > 1.0                 # 7 hops of 2 GB at 1 GB/s
    assert slow.fwd.time_s == pytest.approx(slow.fwd.compute_s + slow.fwd.exposed_comm_s)


def test_zigzag_beats_contiguous_ring_on_causal_work():
    """Contiguous: slowest rank computes 1 diagonal + 7 full blocks per step sequence (15 half-blocks);
    zigzag: every rank 2P - 1 = 15 chunk blocks of L/2 plus 2 diagonals (~ 8 half-blocks)."""
    ct = ring_layer(x_(65536, 8, mla_kv="expanded"), "ring").fwd.compute_s
    zz = ring_layer(x_(65536, 8, mla_kv="expanded"), "zigzag-ring").fwd.compute_s
    assert 1.7 < ct / zz < 2.0
    # by hand, c = L/2 = 4096, seconds per pair 4 H D / SDPA_FLOPS (H = 96, D = max(192, 128) = 192, V padded to
    # the QK dim: the one MLA head-dim rule, k3sim.configs.mla):
    # contiguous  = diagonal L(L+1)/2 + 7 full L^2 blocks = 30c^2 + c pairs;
    # zigzag      = step 0: 2 diagonals c(c+1)/2 + 1 full c^2, each of 7 later steps 2c^2 = 16c^2 + c pairs
    c, pair_s = 4096, 4 * 96 * 192 / SDPA_FLOPS
    assert ct == pytest.approx((30 * c * c + c) * pair_s, rel=1e-12)
    assert zz == pytest.approx((16 * c * c + c) * pair_s, rel=1e-12)


def test_link_scale_out_beyond_domain():
    assert cp_step(k3(), hw(), 65536, 8, kernel_time=fake_kernel_time).link == "scale-up"
    assert cp_step(k3(), hw(), 65536, 16, kernel_time=fake_kernel_time).link == "scale-out"
    assert cp_step(k3(tp=2), hw(), 65536, 8, "kcp", "ring", kernel_time=fake_kernel_time).link == "scale-out"


def test_hybrid_step_sums_layers():
    r = cp_step(k3(), hw(), 131072, 8, "kcp", "zigzag-ring", state_dtype="bf16", kernel_time=fake_kernel_time)
    assert r.step_attention_time_s == pytest.approx(69 * r.kda.time_s + 24 * r.mla.time_s)
    assert r.kda_layer_recv_bytes_per_rank == 42 * 2 ** 20 + 3 * 96 * 384 * 2
    assert {b["layer"] for b in r.breakdown} == {"kda", "mla"}


def test_ulysses_kda_forward_by_hand():
    """S = 65536, P = 8: each rank runs chunk_kda on 96 / 8 = 12 heads over all 65 536 tokens (fake:
    2e-5 + 65536 x 12 x 1e-10 = 98.6432 us), after an all-to-all of its 8192 tokens' q, k, v, g (128 each)
    and beta: 8192 x 96 x 513 x 2 B = 806 879 232 B, 7/8 of it on the wire (1e-5 + 1.76505 ms), and before
    one of o: 8192 x 96 x 128 x 2 B x 7/8 (1e-5 + 0.44040 ms); nothing overlaps: 2.32409344 ms."""
    r = cp_step(k3(), hw(), 65536, 8, "ulysses", "ulysses", kernel_time=fake_kernel_time)
    assert r.kda.fwd.compute_s == pytest.approx(98.6432e-6, rel=1e-12)
    assert r.kda.fwd.time_s == pytest.approx(2.32409344e-3, rel=1e-12)


def test_published_setting_rates_are_percentages():
    p = predict_published(hw(scaleup=2e11), kernel_time=fake_kernel_time)
    for ph in ("fwd", "fwd_bwd"):
        assert 0 < p[ph]["kcp_rate_pct"] <= 100 and 0 < p[ph]["a2a_rate_pct"] <= 100
        assert p[ph]["a2a_over_kcp_time"] == pytest.approx(p[ph]["a2a_s"] / p[ph]["kcp_s"])
    # fwd + bwd by hand: one chunk_kda_fwd_bwd call without CP; Ulysses runs it on H/P = 16 heads over all
    # 32K tokens and its two all-to-alls (in: q, k, v, g, beta; out: o) once forward and once backward
    L, e = 8192, 2
    a2a_comm = 2 * ALPHA + 3 / 4 * L * 64 * (3 * 128 + 128 + 1 + 128) * e / LINK
    assert p["fwd_bwd"]["no_cp_s"] == pytest.approx(6e-5 + 3 * 32768 * 64 * 1e-10, rel=1e-12)
    assert p["fwd_bwd"]["a2a_s"] == pytest.approx(6e-5 + 3 * 32768 * 16 * 1e-10 + 2 * a2a_comm, rel=1e-12)


def test_clock_memoises():
    calls = []

    def kt(op, p, h):
        calls.append(op)
        return fake_kernel_time(op, p, h)

    c = KernelClock(hw(), kt)
    c("chunk_kda_fwd", T=1024, H=8)
    c("chunk_kda_fwd", T=1024, H=8)
    assert calls == ["chunk_kda_fwd"]


def test_document_distribution_shrinks_fold_and_masked_work():
    """Short documents (mean 4K of 256K): fewer ranks folded, far fewer attention pairs on MLA layers."""
    from k3sim.cp.docs import sample_doc_lengths

    S = 262144
    one = cp_step(k3(), hw(), S, 8, "kcp", "zigzag-ring", kernel_time=fake_kernel_time)
    many = cp_step(k3(), hw(), S, 8, "kcp", "zigzag-ring", kernel_time=fake_kernel_time,
                   doc_lengths=sample_doc_lengths(S, 4096, seed=3))
    assert rows(many.kda.fwd)["fold"] < rows(one.kda.fwd)["fold"]
    assert many.mla.fwd.compute_s < 0.1 * one.mla.fwd.compute_s
    assert many.kda_layer_recv_bytes_per_rank == one.kda_layer_recv_bytes_per_rank


def test_seed_rate_solve_round_trips():
    """Feeding back the solved pre-process factor reproduces the seed's 76 % forward rate."""
    p = predict_published(hw(scaleup=2e11), kernel_time=fake_kernel_time)
    k = p["pre_factor_for_seed_fwd_rate"]
    again = predict_published(hw(scaleup=2e11), kernel_time=fake_kernel_time, kcp_pre_factor=k)
    assert again["fwd"]["kcp_rate_pct"] == pytest.approx(76.0, rel=1e-9)


def test_flop_ratios_by_hand():
    """C = 64, K = V = 128. chunk fwd: parallel 5 x 2C^2K + C^3/3, serial 3 x 2CKV;
    KCP pre-process 2 x 2CKV + 2CK^2 + 2K^3 -> 10 485 760 / 11 621 717.3 = 0.902; LASP-2 local state 2CKV."""
    from k3sim.cp.flops import chunk_fwd_flops, kcp_preprocess_factor, lasp2_local_state_factor
    from k3sim.cp.intra_device import MU_M_CHAIN

    total = 5 * 2 * 64 * 64 * 128 + 64 ** 3 / 3 + 3 * 2 * 64 * 128 * 128
    assert chunk_fwd_flops()["total"] == pytest.approx(total, rel=1e-12)
    assert kcp_preprocess_factor() == pytest.approx(10_485_760 / total, rel=1e-12)
    assert round(kcp_preprocess_factor(), 2) == 0.90
    assert lasp2_local_state_factor() == pytest.approx(2 * 64 * 128 * 128 / total, rel=1e-12)
    assert MU_M_CHAIN == 1.5                             # (2CK^2 + 2K^3) / (2 x 2CK^2) at C = 64, K = 128


def test_published_setting_values_from_fake_kernels():
    """PR #691 setting on the fake clock: no-CP time, the all-to-all time written out by hand, rates."""
    p = predict_published(hw(scaleup=2e11), kernel_time=fake_kernel_time)
    single = 2e-5 + 32768 * 64 * 1e-10
    L, e = 8192, 2
    a2a = (2e-5 + 32768 * 16 * 1e-10
           + 2 * ALPHA + 3 / 4 * L * 64 * (3 * 128 + 128 + 1 + 128) * e / LINK)   # in + out all-to-all, P = 4
    f = p["fwd"]
    assert f["no_cp_s"] == pytest.approx(single, rel=1e-12)
    assert f["a2a_s"] == pytest.approx(a2a, rel=1e-12)
    assert f["kcp_rate_pct"] == pytest.approx(100 * single / 4 / f["kcp_s"], rel=1e-12)
    assert f["kcp_time_saved_vs_a2a_pct"] == pytest.approx(100 * (1 - f["kcp_s"] / a2a), rel=1e-12)
    main = 2e-5 + 8192 * 64 * 1e-10
    fold = 3 * 3 * 2 * (64 * 128) * 128 * 128 / 6e14        # 3 fold steps, fp32 state = 3 TF32 passes
    ag = ALPHA + 3 * 64 * 128 * 256 * 4 / LINK               # no conv halo: the op alone, as PR #691 times it
    assert f["kcp_s"] == pytest.approx(main * (1 + 10_485_760 / (5 * 2 * 64 * 64 * 128 + 64 ** 3 / 3
                                                                  + 3 * 2 * 64 * 128 * 128)) + fold + ag, rel=1e-12)
