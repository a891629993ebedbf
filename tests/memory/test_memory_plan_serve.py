"""Serving plans: a toy by hand, K3 on H200 at 128K, and the plan that does not fit."""

from __future__ import annotations

import math

import pytest

from memory_toys import toy_fixture, toy_gpu_fixture  # noqa: F401 (the `toy`, `toy_gpu` fixtures)

from k3sim.configs import Parallelism, load_hardware, load_model
from k3sim.errors import DoesNotFit
from k3sim.memory.layout import chunk_layers, expert_tp, rank_layers
from k3sim.memory.plan import serve_plan


def test_toy_serve_by_hand(toy, toy_gpu):
    plan = serve_plan(toy, toy_gpu, Parallelism(), 1000, prefill_chunk_tokens=10, workspace_fraction=0.1)
    weights = 12822 * 2  # all parameters, bf16, one GPU
    attn_res = 64 * 10  # 64 B/token x 10 prefill tokens
    reserve = 100_000  # 0.1 x 1e6
    per_request = 1 * 20 * 1000 + 3 * (128 + 144)  # MLA KV x context + KDA state + conv state
    assert plan.per_request_bytes_per_gpu == per_request == 20_816
    assert sum(v for k, v in plan.per_gpu_bytes.items() if k.startswith("weights_")) == weights
    assert plan.max_concurrent_requests == (1_000_000 - weights - attn_res - reserve) // per_request == 41


def test_k3_h200_tp8_pp2_ep8(root):
    m, hw = load_model(root / "models/kimi-k3.yaml"), load_hardware("h200")
    plan = serve_plan(m, hw, Parallelism(tp=8, pp=2, ep=8), 131072)
    assert plan.kda_state_bytes_per_request == 434_110_464
    assert plan.mla_kv_bytes_per_token == 27_648
    # Stage 1 holds layers 48-93: 13 MLA (48, 52, ..., 88, 92, 93) and 33 KDA, all 46 MoE.
    assert plan.worst_stage == 1
    mla_kv = 13 * 1152 * 131072  # latent KV is replicated over TP ranks
    kda = 33 * (96 * 128 * 128 * 4 + 3 * 96 * 384 * 2) // 8  # state + conv, split over TP
    assert plan.per_request_bytes_per_gpu == mla_kv + kda
    routed = math.ceil(46 * 896 * 3 * 3584 * 3072 * 17 / 32 / 8)
    assert plan.per_gpu_bytes["weights_routed_experts"] == routed  # ~90.4 GB
    used = plan.per_gpu_bytes["total"]
    assert used <= hw.hbm_bytes < used + plan.per_request_bytes_per_gpu
    assert 1 <= plan.max_concurrent_requests < 64
    # The plan is the fuller stage: stage 0 (layers 1-47, 11 MLA) takes more requests than stage 1.
    caps = [s["max_concurrent_requests"] for s in plan.stages]
    assert plan.max_concurrent_requests == caps[1] < caps[0]


def test_context_must_be_positive(toy, toy_gpu):
    """A zero-token request has no size; it used to divide by zero in an all-MLA stage."""
    from k3sim.errors import InputError

    with pytest.raises(InputError, match="must be positive") as err:
        serve_plan(toy, toy_gpu, Parallelism(), 0, source="s.yaml")
    assert err.value.field == "context_tokens" and err.value.source == "s.yaml"


def test_k3_pp1_does_not_fit(root):
    m, hw = load_model(root / "models/kimi-k3.yaml"), load_hardware("h200")
    with pytest.raises(DoesNotFit) as err:
        serve_plan(m, hw, Parallelism(tp=8, pp=1, ep=8), 131072)
    msg = str(err.value)
    # 92 x 896 x 33.03 M params x 4.25 bit / 8 GPUs = 180.8 GB of routed experts per GPU
    # GiB as every table prints, GB beside it: 180.8e9 B = 168.4 GiB; the runtime's 150,109,880,320 B = 139.8 GiB
    assert "routed experts 168.4 GiB = 180.8 GB in mxfp4" in msg and "139.8 GiB HBM of h200 (150.1 GB)" in msg
    assert "raise pp or ep" in msg and "\n" not in msg


def test_longer_context_fewer_requests(root):
    m, hw = load_model(root / "models/kimi-k3.yaml"), load_hardware("h200")
    par = Parallelism(tp=8, pp=2, ep=8)
    short = serve_plan(m, hw, par, 32768).max_concurrent_requests
    assert short > serve_plan(m, hw, par, 131072).max_concurrent_requests


def test_expert_tp_when_ep_narrower(root):
    m, hw = load_model(root / "models/kimi-k3.yaml"), load_hardware("h200")
    assert expert_tp(Parallelism(tp=8, ep=2)) == 4 and expert_tp(Parallelism(tp=8, ep=8)) == 1
    a = serve_plan(m, hw, Parallelism(tp=8, pp=4, ep=8), 8192).per_gpu_bytes["weights_routed_experts"]
    b = serve_plan(m, hw, Parallelism(tp=8, pp=4, ep=2), 8192).per_gpu_bytes["weights_routed_experts"]
    assert a == b  # EP 2 x expert-TP 4 splits the same 8 ways


def test_layer_split():
    assert [len(c) for c in chunk_layers(93, 2)] == [47, 46]
    assert chunk_layers(5, 5) == [[0], [1], [2], [3], [4]]


def test_interleaved_placement(toy):
    # 4 layers, pp 2, 2 chunks each: rank 0 holds chunks 0 and 2 (layers 0 and 2).
    assert rank_layers(toy, Parallelism(pp=2, virtual_stages=2)) == [[0, 2], [1, 3]]




def test_tied_embeddings_copy_on_last_stage(toy):
    from k3sim.memory.plan import _rank_params

    tied = toy.model_copy(update={"tie_word_embeddings": True})
    assert _rank_params(tied, [2, 3], 1, 2)["lm_head"] == 100 * 16  # own copy of the 100 x 16 table
    assert "lm_head" not in _rank_params(tied, [0, 1, 2, 3], 0, 1)  # one stage: the same tensor


@pytest.mark.parametrize("pp, v", [(1, 1), (2, 1), (3, 2), (16, 2), (31, 3)])
def test_pipeline_split_conserves_parameters(root, pp, v):
    """Every layer lands on exactly one rank, so the ranks' parameters add up to the model's."""
    from k3sim.memory.params import count_params
    from k3sim.memory.plan import _rank_params

    m = load_model(root / "models/kimi-k3.yaml")
    par = Parallelism(pp=pp, virtual_stages=v)
    ranks = rank_layers(m, par)
    assert sorted(i for layers in ranks for i in layers) == list(range(93))
    total = sum(sum(_rank_params(m, layers, r, pp).values()) for r, layers in enumerate(ranks))
    assert total == count_params(m).total_params
