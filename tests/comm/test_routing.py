"""The one routing distribution (k3sim.comm.routing): capped top-k inclusion, the conditional Poisson design
with those inclusion probabilities, MoonEP (training) and EPLB (serving) placements, and one placement seen by
the all-to-all and the step's expert load."""

import itertools
import time
from math import prod

import numpy as np
import pytest

from k3sim.comm import ep as comm_ep
from k3sim.comm.routing import (_pack, _replicate, cps_inclusion, cps_weights, eplb_imbalance, eplb_placement,
                                ep_imbalance, inclusion_probabilities, place, popularity, rank_groups,
                                top_k_inclusion)


def test_imbalance_uniform_small_skew_large_moonep_flattens():
    uni = ep_imbalance(896, 64, 16, 32768, seed=1)
    skew = ep_imbalance(896, 64, 16, 32768, skew=1.0, seed=1)
    moon = ep_imbalance(896, 64, 16, 32768, skew=1.0, redundant_per_rank=2, seed=1)
    assert 1.0 < uni.max_over_mean < 1.1        # multinomial noise only
    assert skew.max_over_mean > 2.0
    assert moon.max_over_mean < 1.01            # replicas split the hot experts
    assert ep_imbalance(896, 64, 16, 32768, seed=1) == uni  # seeded


def test_a_token_picks_an_expert_at_most_once():
    # w = .6 .2 .1 .1, top-2: 2 x .6 = 1.2 picks per token is impossible; the hot expert is capped at 1 and
    # the other pick spreads over .2 .1 .1 in proportion: .5 .25 .25; per draw (/2): .5 .25 .125 .125
    assert inclusion_probabilities([0.6, 0.2, 0.1, 0.1], 2) == pytest.approx([0.5, 0.25, 0.125, 0.125])
    # no expert reaches one pick per token: the weights themselves (the same array: draws unchanged)
    w = np.array([0.5, 0.25, 0.125, 0.125])
    assert inclusion_probabilities(w, 2) is w
    assert top_k_inclusion([0.6, 0.2, 0.1, 0.1], 2) == pytest.approx([1.0, 0.5, 0.25, 0.25])  # picks per token


def test_eplb_replicates_the_hot_expert_and_packs_largest_first():
    # loads 6 3 2 1 and 2 extra replicas: expert 0 (6 -> 3 per replica), then the tie 3 vs 3 goes to the
    # lower id (expert 0 again: 2 per replica)
    reps = _replicate(np.array([6.0, 3.0, 2.0, 1.0]), 2)
    assert reps.tolist() == [3, 1, 1, 1]
    # pieces 2 2 2 | 3 | 2 | 1 on 2 ranks of 3 slots, largest first onto the least-loaded open rank:
    # 3 -> r0; 2 -> r1; 2 -> r1 (4); 2 -> r0 (5); 2 -> r1 (6, full); 1 -> r0 (6): 6 6 = the mean
    rank_of, final = _pack(np.array([2.0, 2.0, 2.0, 3.0, 2.0, 1.0]), 2, 3)
    assert final.tolist() == [6.0, 6.0]
    assert rank_of.tolist() == [1, 1, 0, 0, 1, 0]


def test_imbalance_is_one_at_huge_uniform_batches():
    # 10^9 tokens x top-8 over 32 ranks: 2.5e8 picks per rank, relative noise ~ 6e-5
    for redundant in (0, 32):
        im = eplb_imbalance(256, 32, 8, 10 ** 9, redundant=redundant, seed=3)
        assert im.max_over_mean == pytest.approx(1.0, abs=1e-3)
        assert im.samples == 8


def test_zipf_is_imbalanced_as_its_expected_loads_say():
    # at 10^8 tokens the sampled max/mean meets the expectation: max over ranks of the summed per-draw
    # probabilities of the rank's experts, times ep (contiguous placement, 8 experts per rank)
    im = eplb_imbalance(256, 32, 8, 10 ** 8, skew=1.0, seed=5)
    p, expert_of, rank_of, _ = eplb_placement(256, 32, 8, 0, 1.0, 5)
    expected = np.bincount(rank_of, weights=p[expert_of], minlength=32).max() * 32
    assert im.max_over_mean > 1.5
    assert im.max_over_mean == pytest.approx(expected, rel=1e-3)


def test_eplb_redundant_slots_lower_the_busiest_rank():
    # DeepSeek-V3-shaped decode: 256 experts top-8 on EP 32, 64 tokens per rank, Zipf 0.8
    none = eplb_imbalance(256, 32, 8, 32 * 64, skew=0.8, seed=0)
    some = eplb_imbalance(256, 32, 8, 32 * 64, skew=0.8, redundant=32, seed=0)
    many = eplb_imbalance(256, 32, 8, 32 * 64, skew=0.8, redundant=256, seed=0)
    assert none.max_over_mean > some.max_over_mean > many.max_over_mean > 1.0
    assert "EPLB placement of 32 redundant slot(s)" in some.describe()
    # every slot placed: 288 slots, 9 per rank
    _, expert_of, rank_of, reps = eplb_placement(256, 32, 8, 32, 0.8, 0)
    assert len(expert_of) == 288 and reps.sum() == 288
    assert np.bincount(rank_of, minlength=32).tolist() == [9] * 32


def test_eplb_imbalance_is_seeded_memoised_and_fast_at_ep_256():
    a = eplb_imbalance(896, 256, 16, 256 * 128, skew=0.5, redundant=128, seed=1)
    assert eplb_imbalance(896, 256, 16, 256 * 128, skew=0.5, redundant=128, seed=1) is a  # memoised
    assert eplb_imbalance(896, 256, 16, 256 * 128, skew=0.5, redundant=128, seed=2) != a
    eplb_imbalance.cache_clear()
    eplb_placement.cache_clear()
    t0 = time.perf_counter()
    b = eplb_imbalance(896, 256, 16, 256 * 128, skew=0.5, redundant=128, seed=1)
    assert time.perf_counter() - t0 < 0.5  # a decode point at EP 256 must answer in well under 1 s
    assert b == a  # seeded: the same answer recomputed


def test_one_rank_or_no_tokens_is_balanced():
    assert eplb_imbalance(256, 1, 8, 1000).max_over_mean == 1.0
    assert eplb_imbalance(256, 32, 8, 0).max_over_mean == 1.0
    assert ep_imbalance(256, 1, 8, 1000).max_over_mean == 1.0


def test_conditional_poisson_weights_by_hand_and_by_enumeration():
    # top-1: P(e) = w_e / sum w, so the weights are the targets themselves (scaled to sum k = 1)
    assert cps_weights([0.7, 0.2, 0.1], 1) == pytest.approx([0.7, 0.2, 0.1], rel=1e-12)
    # top-2 of 3: a set is "all but e", P ~ prod of the other two ~ 1 / w_e; P(e left out) = 1 - target
    # = .1 .4 .5 ~ 1 / w, so w ~ 10 2.5 2 (scaled to sum 2: 14.5)
    assert cps_weights([0.9, 0.6, 0.5], 2) == pytest.approx(np.array([10, 2.5, 2]) * 2 / 14.5, rel=1e-10)
    # 7 experts, top-3, one target at .995: every 3-subset enumerated with P(S) ~ prod w_e
    t = np.array([0.995, 0.8, 0.5, 0.3, 0.2, 0.15, 0.055])
    w = cps_weights(t, 3)
    subsets = list(itertools.combinations(range(7), 3))
    pw = np.array([prod(w[list(S)]) for S in subsets])
    pw /= pw.sum()
    assert [sum(p for p, S in zip(pw, subsets) if e in S) for e in range(7)] == pytest.approx(t, rel=1e-10)
    assert cps_inclusion(w, 3) == pytest.approx(t, rel=1e-11)


@pytest.mark.parametrize("E, k", [(64, 8), (256, 8), (896, 16), (64, 32), (16, 1)])
def test_conditional_poisson_weights_converge_over_the_zipf_range(E, k):
    # up to Zipf 10 (the schema's bound): the capped experts are taken out, the rest fitted to 1e-12
    for zipf in (0.3, 1.0, 1.5, 3.0, 10.0):
        q = top_k_inclusion(popularity(E, zipf, 1), k)
        free = q < 1.0
        kk = k - int((~free).sum())
        t = q[free] * kk / q[free].sum()
        assert cps_inclusion(cps_weights(t, kk), kk) == pytest.approx(t, rel=1e-11, abs=1e-14)


def test_eplb_places_by_the_capped_load_not_the_raw_popularity():
    # w = .55 .25 .1 .1, top-2: the hot expert's 1.1 picks per token are capped at 1, the other pick spreads
    # over .25 .1 .1: q = 1, 5/9, 2/9, 2/9. Two extra slots, 2 ranks of 3:
    w = np.array([0.55, 0.25, 0.1, 0.1])
    q = top_k_inclusion(w, 2)
    # by q: e0 (1 -> .5 per replica), then e1 (5/9 > .5): replicas 2 2 1 1; pieces .5 .5 .28 .28 .22 .22
    # largest first onto the least-loaded open rank: r0 r1 r0 r1 r0 r1, each rank 1 pick per token = the mean
    expert_of, rank_of, reps = place(q, 2, 2)
    assert reps.tolist() == [2, 2, 1, 1]
    assert np.bincount(rank_of, weights=q[expert_of] / reps[expert_of]) == pytest.approx([1.0, 1.0])
    # by the raw popularity (the all-to-all's old placement): e0 twice (.275 per replica > .25): 3 1 1 1;
    # pieces e1 .25 -> r0, e0 .18 -> r1, r1, r0, e2 -> r1, e3 -> r0: r0 holds 1/3 of e0 + e1 + e3 = 10/9
    expert_of, rank_of, raw_reps = place(w, 2, 2)
    assert raw_reps.tolist() == [3, 1, 1, 1]
    assert np.bincount(rank_of, weights=q[expert_of] / raw_reps[expert_of]) == pytest.approx([10 / 9, 8 / 9])
    # the all-to-all's design over the capped placement: e0 is in every set (half its picks on each rank),
    # the other pick lands on r0 with 5/9 x .5 + 2/9 = 1/2, so P(miss r0) = .5 x .5 and 1 pair per rank
    miss, mass = comm_ep._capped_design(q, 2, rank_groups(*place(q, 2, 2), 2))
    assert miss == pytest.approx([0.25, 0.25]) and mass == pytest.approx([1.0, 1.0])


LAYOUTS = [  # E, R, ep, G, topk, zipf: uncapped and capped, with and without redundant slots, uneven splits
    (256, 0, 32, 8, 8, 0.8), (256, 32, 32, 8, 8, 0.5), (256, 32, 32, 8, 8, 1.0), (256, 40, 96, 8, 8, 0.5),
    (896, 0, 256, 8, 16, 1.0), (896, 128, 256, 8, 16, 1.0), (288, 32, 256, 8, 8, 1.2), (250, 0, 16, 8, 8, 0.0)]


@pytest.mark.parametrize("E, R, ep, G, k, zipf", LAYOUTS)
def test_the_all_to_all_and_the_expert_load_see_one_placement(E, R, ep, G, k, zipf):
    # the all-to-all's expected pairs per rank are the placement's capped expected loads: the busiest rank
    # of the dispatch bytes is the step's busiest expert GPU, with the same picks per token
    p, expert_of, rank_of, reps = eplb_placement(E, ep, k, R, zipf, 0)
    expected = k * np.bincount(rank_of, weights=p[expert_of] / reps[expert_of], minlength=ep)
    rt = comm_ep.routing(E, R, ep, G, 0, k, int(round(zipf * 1000)), 0)
    assert rt.mass_rank == pytest.approx(expected, rel=1e-9)
    assert expected[int(np.argmax(rt.mass_rank))] == pytest.approx(expected.max(), rel=1e-9)  # ties: uneven E
    assert np.all(rt.hit_rank <= rt.mass_rank + 1e-12)  # a rank is hit at most as often as it gets pairs
    # at 10^8 tokens the sampled expert load meets the same expectation
    im = eplb_imbalance(E, ep, k, 10 ** 8, redundant=R, skew=zipf, seed=0)
    assert im.max_over_mean == pytest.approx(expected.max() * ep / k, rel=2e-3)


def test_the_step_layer_and_the_dispatch_call_share_the_busiest_gpu():
    # through the step's own calls: K3 (896 experts, top-16) on DP256 EP256 with 128 redundant slots and
    # Zipf 1: ep_params -> the all-to-all's routing, expert_load -> the routed experts' busiest GPU
    from k3sim.configs import load_model
    from k3sim.step import Batch, StepLayout
    from k3sim.step.layers import ep_params, expert_load

    k3 = load_model("models/kimi-k3.yaml")
    lay = StepLayout(ep=256, attention_dp=256, redundant_experts=128, routing_zipf=1.0, dispatch_dtype="fp8")
    b = Batch.decode(4096, 1024)  # 4096 x 256 tokens meet: ~6.6e4 pairs per rank, sampling noise ~0.4 %
    pr = ep_params(k3, lay, b, "dispatch")
    rt = comm_ep.routing(*(pr[n] for n in ("E", "R", "ep", "G", "nodes_max", "topk", "zipf_milli", "seed")))
    load = expert_load(k3, lay, b)
    assert load.max_over_mean == pytest.approx(float(rt.mass_rank.max()) * 256 / 16, rel=0.02)
    _, _, rank_of, _ = eplb_placement(896, 256, 16, 128, 1.0, 0)
    assert np.bincount(rank_of, minlength=256).tolist() == [4] * 256  # 1024 slots, 4 per GPU
