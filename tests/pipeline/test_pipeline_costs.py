"""Model-derived stage costs: layer split, embedding / LM head placement, P2P links, AttnRes hops."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.pipeline.costs import attn_res_hops, committed_blocks, model_stage_costs

from pipeline_toys import fake_kernel_time, fake_layer_costs, toy_gpu, toy_model


def costs(p, v, **kw):
    return model_stage_costs(toy_model(), toy_gpu(), p, v, layer_costs=fake_layer_costs,
                             kernel_time=fake_kernel_time, **kw)


def test_layers_split_with_embedding_first_and_head_last():
    c = costs(2, 2, tp=1, recompute=False)     # 8 layers -> 4 chunks of 2
    assert c.chunk_layers == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert c.costs.forward_s == (2.25, 2.0, 2.0, 2.5)
    assert c.costs.backward_input_s == (4.5, 4.0, 4.0, 4.5)
    assert c.costs.backward_weight_s == (2.0, 2.0, 2.0, 2.5)
    assert c.stage_forward_s == pytest.approx((2.25 + 2 + 2 + 2.5) / 2)


def test_recompute_adds_the_forward_to_the_backward():
    a, b = costs(2, 1, recompute=False), costs(2, 1, recompute=True)
    assert [y - x for x, y in zip(a.costs.backward_input_s, b.costs.backward_input_s)] == list(a.costs.forward_s)


def test_attn_res_hops_hand_worked():
    # 4 chunks of 2 layers, blocks of 2: after each chunk 1 + done // 2 = 2, 3, 4 representatives exist
    resend, cached = attn_res_hops([[0, 1], [2, 3], [4, 5], [6, 7]], 2, 2)
    assert resend == [2, 3, 4]
    # hop into stage 2 lands on rank 0, which saw stage 0 (2 blocks): carries 3 - 2 = 1; into stage 3 on
    # rank 1, which saw stage 1 (3 blocks): 4 - 3 = 1; into stage 1 the rank has seen nothing: 2
    assert cached == [2, 1, 1]
    assert committed_blocks(12, 12) == 2 and committed_blocks(5, None) == 0


def test_k3_shape_one_block_per_stage_carries_at_most_p_minus_1():
    # torchtitan's example: 4 ranks, 2 virtual stages, one block opened per stage -> from the second
    # virtual stage on a hop carries at most P - 1 = 3 blocks (the whole stack would be 4 to 7; we also
    # count the embedding representative, so 5 to 8 here)
    chunks = [list(range(4 * s, 4 * s + 4)) for s in range(8)]
    resend, cached = attn_res_hops(chunks, 4, 4)
    assert resend == [2, 3, 4, 5, 6, 7, 8]
    assert cached == [2, 3, 4, 3, 3, 3, 3]


def test_hop_bytes_and_saved_bytes():
    c = costs(2, 2)
    # hidden 1000 B + carried blocks x 100 B: cached [2, 1, 1]
    assert c.hop_bytes[:3] == [1200.0, 1100.0, 1100.0]
    assert c.attn_res.saved_bytes == pytest.approx(100 * ((2 + 3 + 4) - (2 + 1 + 1)))
    full = costs(2, 2, attn_res_cache=False)
    assert full.hop_bytes[:3] == [1200.0, 1300.0, 1400.0]


def test_p2p_time_same_node_vs_across_nodes():
    same = costs(2, 1, tp=1)            # 2 GPUs, one node of 8; hop after 4 layers: 1000 + 3 x 100 B
    assert same.hop_cross_node[0] is False
    # (the collective model interpolates between 2^(k/8)-byte grid points: within 1e-3 of the exact line)
    assert same.costs.send_forward_s[0] == pytest.approx(1e-6 + 1300 / 1e9, rel=1e-3)
    assert same.costs.send_backward_s[1] == same.costs.send_forward_s[0]
    cross = costs(2, 1, tp=8)           # a stage fills a node: every hop leaves it
    assert cross.hop_cross_node[0] is True
    # the collective model's cross-node send: latency + bytes over the toy NIC (1e8 B/s)
    assert cross.costs.send_forward_s[0] == pytest.approx(1e-6 + 1300 / 1e8)


def test_more_chunks_than_layers_is_bad_input():
    with pytest.raises(InputError, match="exceeds the 8 layers"):
        costs(3, 3)
