"""The EP all-to-all model (k3sim.comm.ep): exact bytes on hand-worked cases, the routing design against brute
force and a simulation of DeepEP's gating, monotonicity, the fit, bad input, speed and the facade."""

from __future__ import annotations

import itertools
import json
import math
import time
from math import prod

import numpy as np
import pytest

from k3sim.comm import ep
from k3sim.comm.routing import cps_weights, place, rank_groups
from k3sim.errors import InputError
from k3sim.kernels.ops import COLLECTIVE_OPS, OPS, ep_copy_bytes

H800_UP, H800_OUT = 200e9, 50e9  # hardware_profiles/h800.yaml, one direction per GPU


def params(**kw) -> dict:
    base = dict(T=128, D=7168, topk=8, E=256, R=0, ep=16, G=8, nodes_max=0, kernel=1, dtype_bytes=1,
                zipf_milli=0, seed=0)
    base.update(kw)
    return base


def test_copy_bytes_fp8_is_values_plus_fp32_scales_and_combine_is_bf16():
    assert ep_copy_bytes("dispatch", 7168, 1) == 7168 + 4 * 56 == 7392  # 56 scales of 128 channels
    assert ep_copy_bytes("dispatch", 7168, 2) == 14336
    assert ep_copy_bytes("combine", 7168, 1) == 14336  # combine always bf16
    assert ep_copy_bytes("dispatch", 3584, 1) == 3584 + 4 * 28
    assert ep_copy_bytes("dispatch", 100, 1) == 100 + 4  # ceil(100 / 128) = 1 scale
    assert ep_copy_bytes("dispatch", 7168, 1) < ep_copy_bytes("dispatch", 7168, 2)


def test_ep16_over_two_nodes_uniform_exact_copies():
    """EP 16 = 2 nodes of 8, E = 256 (16 per rank, 128 per node), top-8 without replacement.
    P(a token misses a node) = C(128, 8) / C(256, 8) = 128*127*...*121 / (256*255*...*249) = 0.003490;
    P(it misses a rank) = C(240, 8) / C(256, 8) = 240*...*233 / (256*...*249) = 0.592295.
    normal: RDMA 1 other node x 0.996510 copies per token; NVLink: a forwarder relays the 2 nodes' tokens
    (its own and its peer's) to the 7 other ranks of its node: 2 x 7 x 0.407705 = 5.70787 copies per token.
    low-latency: 8 messages per token, 8 x 8/16 = 4 to the other node (RDMA), 8 x 7/16 = 3.5 to the 7 other
    ranks of the own node (NVLink), 0.5 stay on the GPU."""
    miss_node = prod(range(121, 129)) / prod(range(249, 257))
    miss_rank = prod(range(233, 241)) / prod(range(249, 257))
    assert miss_node == pytest.approx(0.0034899, rel=1e-4) and miss_rank == pytest.approx(0.592295, rel=1e-5)
    rt = ep.routing(256, 0, 16, 8, 0, 8, 0, 0)
    assert (rt.nodes, rt.per_node) == (2, 8)
    assert np.allclose(rt.hit_node, 1 - miss_node, rtol=1e-12) and np.allclose(rt.hit_rank, 1 - miss_rank, rtol=1e-12)
    assert rt.hit_node.sum() == pytest.approx(1.993020, rel=1e-6)  # distinct destination nodes, own included
    assert 16 * rt.hit_rank[0] == pytest.approx(6.523280, rel=1e-6)  # distinct destination ranks per token
    rdma, nvl = rt.normal_copies()
    assert rdma == pytest.approx(1 - miss_node, rel=1e-12) and nvl == pytest.approx(2 * 7 * (1 - miss_rank), rel=1e-12)
    assert ep.routing(256, 0, 16, 8, 0, 8, 0, 0).ll_copies() == pytest.approx((4.0, 3.5), rel=1e-12)
    assert rt.ll_copies(nvlink=False) == pytest.approx((7.5, 0.0), rel=1e-12)  # 15/16 of 8 off the GPU, all RDMA
    # the bytes of the busiest rank at T = 4096, fp8 dispatch: 30.17 MB on the NIC, 172.8 MB on NVLink
    r_s, n_s, rb, nb = ep._link_terms("normal", "dispatch", rt, 4096, 7392, H800_UP, H800_OUT)
    assert rb == pytest.approx(4096 * 0.99651006 * 7392, rel=1e-7) == pytest.approx(30.171965e6, rel=1e-6)
    assert nb == pytest.approx(4096 * 5.7078696 * 7392, rel=1e-7)
    assert (r_s, n_s) == pytest.approx((rb / H800_OUT, nb / H800_UP))
    # low-latency dispatch messages carry DeepEP's 16-byte header: 128 x 4 x 7408 B on the NIC
    _, _, rb, nb = ep._link_terms("low_latency", "dispatch", rt, 128, 7392, H800_UP, H800_OUT)
    assert (rb, nb) == (128 * 4 * 7408, 128 * 3.5 * 7408)


def test_intranode_ep8_copies():
    """EP 8 in one node, E = 256 (32 per rank): a token goes once to each distinct other rank it hits:
    7 x (1 - C(224, 8) / C(256, 8)) copies per token, sent and received alike."""
    h = 1 - prod(range(217, 225)) / prod(range(249, 257))
    rt = ep.routing(256, 0, 8, 8, 0, 8, 0, 0)
    assert rt.nodes == 1 and rt.normal_copies() == pytest.approx((0.0, 7 * h), rel=1e-12)
    assert rt.ll_copies() == pytest.approx((0.0, 7.0), rel=1e-12)  # 8 x 7/8 messages over NVLink


def test_node_limited_closed_form_ep64():
    """EP 64 = 8 nodes, node-limited to 4 (DeepSeek-V3's setting): 4 destination nodes per token, each with one
    pick uniform in its 32 experts, the other 4 picks uniform over the remaining 124 of the chosen nodes:
    P(rank hit) = 4/8 x (1 - (1 - 4/32) C(120, 4) / C(124, 4))."""
    rt = ep.routing(256, 0, 64, 8, 4, 8, 0, 0)
    h = 0.5 * (1 - (28 / 32) * (120 * 119 * 118 * 117) / (124 * 123 * 122 * 121))
    assert np.allclose(rt.hit_rank, h, rtol=1e-12) and np.allclose(rt.hit_node, 0.5)
    assert rt.hit_node.sum() == pytest.approx(4.0)
    unlimited = ep.routing(256, 0, 64, 8, 0, 8, 0, 0)
    assert unlimited.hit_node.sum() == pytest.approx(8 * (1 - prod(range(217, 225)) / prod(range(249, 257))))
    assert rt.normal_copies()[0] < unlimited.normal_copies()[0]  # the cap cuts the network copies: 3.5 vs 4.6


def test_node_limited_model_against_deepeps_gating():
    """A seeded simulation of DeepEP's test gating (tests/legacy/test_internode.py: iid scores, the top 4 of 8
    node groups by their best score, then the top 8 of those experts): distinct nodes and ranks per token
    within 1 % of the closed form (the gating hits 3.98 nodes, the model says 4)."""
    rng = np.random.default_rng(0)
    T, N, per, k = 4000, 8, 32, 8
    s = np.abs(rng.standard_normal((T, N * per))) + 1
    top = np.argsort(-s.reshape(T, N, per).max(-1), 1)[:, :4]
    mask = np.full((T, N), -np.inf)
    np.put_along_axis(mask, top, 0.0, 1)
    idx = np.argpartition(-(s.reshape(T, N, per) + mask[..., None]).reshape(T, -1), k, 1)[:, :k]
    nodes = np.mean([len(set(r)) for r in idx // per])
    ranks = np.mean([len(set(r)) for r in idx // 4])
    rt = ep.routing(256, 0, 64, 8, 4, 8, 0, 0)
    assert nodes == pytest.approx(rt.hit_node.sum(), rel=0.01)
    assert ranks == pytest.approx(rt.hit_rank.sum(), rel=0.01)


def test_weighted_design_against_brute_force():
    """`_design` (P(miss a group), expected picks in it) equals enumeration of every k-subset with
    P(S) ~ prod w_e, on 7 experts with uneven weights and groups holding partial shares."""
    w = np.array([0.30, 0.05, 0.20, 0.10, 0.15, 0.12, 0.08])
    groups = [[(0, 1.0), (3, 1.0)], [(2, 0.5), (5, 1.0)], [(1, 1.0)], [(2, 0.5), (4, 0.25), (6, 1.0)]]
    for k in (1, 2, 3, 5):
        subsets = list(itertools.combinations(range(7), k))
        pw = np.array([prod(w[list(S)]) for S in subsets])
        pw /= pw.sum()
        miss, mass = ep._design(w, k, groups)
        for g, grp in enumerate(groups):
            share = dict(grp)
            exp_miss = sum(p * prod(1 - share.get(e, 0.0) for e in S) for p, S in zip(pw, subsets))
            exp_mass = sum(p * sum(share.get(e, 0.0) for e in S) for p, S in zip(pw, subsets))
            assert miss[g] == pytest.approx(exp_miss, rel=1e-10, abs=1e-14)
            assert mass[g] == pytest.approx(exp_mass, rel=1e-10)


def test_weighted_path_at_uniform_weights_is_the_closed_form():
    for E, n, G in ((256, 16, 8), (256, 8, 8), (384, 32, 8)):
        a, b = ep._uniform(E, n, G, 0, 8), ep._weighted(E, 0, n, G, 0, 8, 0, 0)
        for f in ("hit_rank", "hit_node", "mass_rank"):
            assert np.allclose(getattr(a, f), getattr(b, f), rtol=1e-9), (E, n, f)
    # node-limited: the mean-field form against the exact closed form, within 0.5 %
    a, b = ep._uniform(256, 64, 8, 4, 8), ep._weighted(256, 0, 64, 8, 4, 8, 0, 0)
    assert np.allclose(a.hit_rank, b.hit_rank, rtol=0.005) and np.allclose(a.hit_node, b.hit_node, rtol=1e-9)
    assert np.allclose(a.mass_rank, b.mass_rank, rtol=1e-9)


def test_zipf_makes_the_hottest_rank_receive_more_and_redundancy_relieves_it():
    masses = [ep.routing(256, 0, 32, 8, 0, 8, z, 0).mass_rank for z in (0, 500, 1000, 1500)]
    hottest = [float(m.max()) for m in masses]
    assert all(m.sum() == pytest.approx(8.0) for m in masses)  # topk pairs per token, whatever the skew
    assert hottest[0] == pytest.approx(8 / 32) and hottest == sorted(hottest) and hottest[-1] > 2 * hottest[0]
    times = [ep.ep_time("combine", params(ep=32, zipf_milli=z), "h800").seconds for z in (0, 500, 1000, 1500)]
    assert times == sorted(times) and times[-1] > 1.5 * times[0]
    relieved = ep.routing(256, 32, 32, 8, 0, 8, 1000, 0).mass_rank.max()  # 32 EPLB slots, one per rank
    assert relieved < ep.routing(256, 0, 32, 8, 0, 8, 1000, 0).mass_rank.max()
    # another seed is another ranking: the same skew, a different hottest expert
    assert not np.allclose(ep.routing(256, 0, 32, 8, 0, 8, 1000, 1).mass_rank, masses[2])


def test_placement_with_redundant_slots_is_eplb_like():
    w = np.array([0.4, 0.2, 0.2, 0.1, 0.1])  # the loads the plan is made from (k3sim.comm.routing.place)
    ranks = rank_groups(*place(w, 4, 3), 4)  # 8 slots on 4 ranks: the hot expert gets the extra replicas first
    assert sum(len(r) for r in ranks) <= 8 and all(len(r) <= 2 for r in ranks)
    share = {}
    for r in ranks:
        for e, c in r:
            share[e] = share.get(e, 0.0) + c
    assert share == pytest.approx({e: 1.0 for e in range(5)})  # every expert's picks fully placed
    # by hand: replicas to e0 (0.4 -> 0.2 per replica), then e0 again (tie with e1, e2 at 0.2: lowest index),
    # then e1: replicas 3, 2, 1, 1, 1. Pieces largest first onto the least-loaded rank with a free slot:
    # e2 0.2 -> r0, e0 0.133 -> r1, r2, r3, e1 0.1 -> r1, r2, e3 0.1 -> r3, e4 0.1 -> r0
    assert [sorted(e for e, _ in r) for r in ranks] == [[2, 4], [0, 1], [0, 1], [0, 3]]
    loads = [sum(w[e] * c for e, c in r) for r in ranks]
    assert loads == pytest.approx([0.3, 0.4 / 3 + 0.1, 0.4 / 3 + 0.1, 0.4 / 3 + 0.1])
    assert rank_groups(*place(w, 5, 0), 5) == [[(e, 1.0)] for e in range(5)]  # R = 0: contiguous, DeepEP's


def test_capped_design_against_brute_force():
    """`_capped_design` (P(miss a group), expected picks in it) for inclusion probabilities with one expert in
    every set (q = 1) equals enumeration: that expert always, then every 3-subset of the other six with
    P(S) ~ prod of their conditional Poisson weights; the expected picks are q itself."""
    q = np.array([1.0, 0.9, 0.6, 0.5, 0.4, 0.35, 0.25])  # sums to 4: one certain expert + 3 of the other 6
    k = 4
    groups = [[(0, 0.5), (3, 1.0)], [(0, 0.5), (1, 1.0)], [(2, 1.0), (5, 0.5)], [(4, 1.0), (5, 0.5), (6, 1.0)]]
    w = cps_weights(q[1:], 3)
    subsets = list(itertools.combinations(range(1, 7), 3))
    pw = np.array([prod(w[[e - 1 for e in S]]) for S in subsets])
    pw /= pw.sum()
    miss, mass = ep._capped_design(q, k, groups)
    for g, grp in enumerate(groups):
        share = dict(grp)
        exp_miss = sum(p * prod(1 - share.get(e, 0.0) for e in (0, *S)) for p, S in zip(pw, subsets))
        assert miss[g] == pytest.approx(exp_miss, rel=1e-10, abs=1e-14)
        assert mass[g] == pytest.approx(sum(q[e] * c for e, c in grp), rel=1e-10)


def test_time_is_the_calibrated_busiest_link_plus_latency():
    cal = ep.calibration()
    kt = ep.ep_time("dispatch", params(T=4096, kernel=0), "h800")
    rt = ep.routing(256, 0, 16, 8, 0, 8, 0, 0)
    r_s, n_s, _, _ = ep._link_terms("normal", "dispatch", rt, 4096, 7392, H800_UP, H800_OUT)
    a, b = cal.latency["dispatch"]
    assert kt.seconds == pytest.approx(a + b * 4 + max(r_s / cal.f_rdma, n_s / cal.f_nvl), rel=1e-12)
    assert kt.method == "normal:nvlink"  # EP 16: the forwarding over NVLink is the limiter (DeepEP's 43 GB/s)
    assert ep.CALIBRATION in kt.source and "latency unchanged" in kt.detail
    # another profile: the same fractions of its own links (H200 NVLink 450 GB/s): faster, the latency kept
    assert ep.ep_time("dispatch", params(T=4096, kernel=0), "h200").seconds < kt.seconds
    ll = ep.ep_time("dispatch", params(ep=256), "h800")
    assert ll.method == "low_latency:rdma" and ll.seconds == pytest.approx(194e-6, rel=0.03)  # DeepEP: 194 us


def test_monotone_in_tokens_width_and_dtype():
    for kernel in (0, 1, 2):
        ts = [ep.ep_time("dispatch", params(T=t, kernel=kernel), "h200").seconds for t in (1, 16, 64, 128)]
        assert ts == sorted(ts) and ts[0] < ts[-1]
        ds = [ep.ep_time("dispatch", params(D=d, kernel=kernel), "h200").seconds for d in (1024, 3584, 7168)]
        assert ds == sorted(ds)
        fp8 = ep.ep_time("dispatch", params(kernel=kernel), "h200").seconds
        bf16 = ep.ep_time("dispatch", params(kernel=kernel, dtype_bytes=2), "h200").seconds
        assert fp8 < bf16
        # combine ignores the dispatch dtype: always bf16
        assert ep.ep_time("combine", params(kernel=kernel), "h200").seconds == \
            ep.ep_time("combine", params(kernel=kernel, dtype_bytes=2), "h200").seconds
    # the low-latency floor grows with EP (77 -> 194 us dispatch on H800 from EP 8 to 256)
    lat = [ep.ep_time("dispatch", params(ep=n), "h800").seconds for n in (8, 16, 32, 64, 128, 256)]
    assert lat == sorted(lat) and lat[0] == pytest.approx(77e-6, rel=0.03)


def test_nccl_is_the_plain_all_to_all_of_the_same_copies():
    from k3sim.comm import collective_time

    kt = ep.ep_time("combine", params(kernel=2, ep=32), "h200")
    ref = collective_time("all_to_all", 128 * 8 * 14336, 32, "h200", gpus_per_node=8)
    assert kt.seconds == ref.seconds and kt.method.startswith("nccl:")


def test_comm_sms():
    assert ep.comm_sms("normal", "h200") == 20 and ep.comm_sms("low_latency", "h200") == 0
    assert ep.comm_sms("low-latency", "h800") == 0 and ep.comm_sms("nccl", "h200") == ep.NCCL_P2P_CHANNELS == 16
    with pytest.raises(InputError, match="unknown EP kernel") as err:
        ep.comm_sms("deepep", "h200")
    assert err.value.field == "kernel"


def test_constants_of_the_contract():
    assert ep.KERNEL_CODES == {"normal": 0, "low_latency": 1, "nccl": 2}
    assert ep.LL_MAX_TOKENS_PER_RANK == 128
    assert "ep_dispatch" in OPS and OPS["ep_combine"].kind == "ep"
    assert "ep_dispatch" not in COLLECTIVE_OPS and "all_to_all" in COLLECTIVE_OPS


@pytest.mark.parametrize("kw,field,match", [
    (dict(ep=300, E=256, R=32), "ep", "exceeds the 288 expert slots"),
    (dict(ep=12), "ep", "whole nodes"),
    (dict(ep=32, nodes_max=5), "nodes_max", "exceeds the 4 node"),
    (dict(T=129), "T", "low-latency buffer of 128"),
    (dict(kernel=3), "kernel", "outside the allowed range"),
    (dict(topk=300, E=256), "topk", "exceeds E"),
])
def test_bad_input_names_the_parameter(kw, field, match):
    with pytest.raises(InputError, match=match) as err:
        ep.ep_time("dispatch", params(**kw), "h200")
    assert err.value.field == field


def test_fp8_dispatch_needs_an_fp8_profile():
    from k3sim.configs import load_hardware

    hw = load_hardware("h200")
    no_fp8 = hw.model_copy(update={"name": "no-fp8", "peak_flops_per_s": {"bf16": 989e12}})
    with pytest.raises(InputError, match="no fp8 peak") as err:
        ep.ep_time("dispatch", params(), no_fp8)
    assert err.value.field == "dtype_bytes"
    assert ep.ep_time("dispatch", params(dtype_bytes=2), no_fp8).seconds > 0
    assert ep.ep_time("combine", params(), no_fp8).seconds > 0  # combine is bf16 anyway
    with pytest.raises(InputError, match="phase"):
        ep.ep_time("gather", params(), "h200")


def test_speed_at_ep256():
    ep.ep_time("dispatch", params(ep=256), "h200")
    t0 = time.perf_counter()
    for T in range(1, 101):
        ep.ep_time("dispatch", params(ep=256, T=T), "h200")
    assert (time.perf_counter() - t0) / 100 < 0.005
    t0 = time.perf_counter()  # a new skewed, redundant layout: the recursion runs once, then it is memoised
    ep.ep_time("combine", params(ep=256, E=288, R=32, zipf_milli=1200, seed=3, T=64), "h200")
    assert time.perf_counter() - t0 < 1.0


def test_the_facade_and_the_cli(cli):
    from k3sim.predict import predict_kernel_time

    kt = predict_kernel_time("ep_dispatch", params(ep=64), "h200", convention="eager")
    assert kt.convention == "eager" and kt.seconds == ep.ep_time("dispatch", params(ep=64), "h200").seconds
    sets = [x for k, v in params(ep=64).items() for x in ("--set", f"{k}={v}")]
    proc = cli("kernel-time", "ep_dispatch", *sets, "--hardware", "h800", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["seconds"] == pytest.approx(173e-6, rel=0.05)  # DeepEP's EP 64 low-latency dispatch on H800
    assert ep.CALIBRATION in res["source"] and res["method"] == "low_latency:rdma"
    proc = cli("kernel-time", "ep_dispatch", *[s.replace("T=128", "T=512") for s in sets])
    assert proc.returncode == 2 and "--set T=512" in proc.stderr and "buffer of 128" in proc.stderr


def test_the_fit_recovers_known_parameters():
    """Rows made by the model itself from chosen parameters, on the tables' geometry: the fit returns them."""
    rows = [r for r in ep.table_rows() if r.role == "fit"]
    truth = ep.Calibration(0.70, 0.80, {"dispatch": (20e-6, 1e-6), "combine": (10e-6, 3e-6)}, 0, 0.0)
    synth = [ep.TableRow(r.table, r.kernel, r.phase, r.ep, r.tokens, truth.predict(r), r.rdma_s, r.nvl_s, "fit",
                         r.reported, r.hardware) for r in rows]
    got = ep.fit(synth)
    assert (got.f_nvl, got.f_rdma) == pytest.approx((0.70, 0.80), abs=6e-4)
    for ph in ep.PHASES:
        assert got.latency[ph] == pytest.approx(truth.latency[ph], abs=2e-7)
    assert got.rms_rel < 1e-3


def test_the_link_fraction_is_clamped_to_one():
    """A profile whose scale-up link is slower than the bus bandwidth its measurements reached: the collective
    model never runs a link above 1 x its bandwidth (issue 21)."""
    from k3sim.comm import collective_time
    from k3sim.configs import load_hardware

    slow = load_hardware("h200").model_copy(update={"scaleup_bandwidth_bytes_per_s": 250e9})
    kt = collective_time("all_gather", 2 ** 28, 16, slow)
    assert "clamped to 1" in kt.detail
    assert kt.seconds >= 15 * 2 ** 28 / 50e9  # 16 GPUs span 2 nodes: the NIC (50 GB/s) at fraction 1, at least
