"""decode_step: throughput bookkeeping, memory cap, expert accounting."""

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.configs.parallel import Parallelism
from k3sim.decode import decode_step
from k3sim.memory.plan import serve_plan
from k3sim.step import StepLayout

HW = load_hardware("h200")
K3 = load_model("models/kimi-k3.yaml")


def test_pp_keeps_micro_batches_in_flight():
    lay = StepLayout(tp=8, pp=2, ep=8)
    r = decode_step(K3, HW, lay, 32, 32768)
    cycle = max(r.step_s, 2 * max(r.stage_seconds))
    assert r.tpot_s == pytest.approx(cycle)
    assert r.tokens_per_s == pytest.approx(32 * 2 / cycle)
    assert r.tokens_per_s_per_gpu == pytest.approx(r.tokens_per_s / 16)


def test_memory_cap_is_the_planners_concurrency_over_pp():
    lay = StepLayout(tp=8, pp=2, ep=8)
    r = decode_step(K3, HW, lay, 8, 131072)
    plan = serve_plan(K3, HW, Parallelism(tp=8, pp=2, ep=8), 131072)
    assert r.max_batch_by_memory == plan.max_concurrent_requests // 2


def test_k3_on_one_node_has_no_memory_cap_answer():
    r = decode_step(K3, HW, StepLayout(tp=8, pp=1, ep=8), 1, 4096)
    assert r.max_batch_by_memory is None  # routed experts alone exceed HBM


def test_distinct_experts_reported_per_layer_and_rank():
    r = decode_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), 64, 4096)
    assert r.expected_distinct_experts_per_layer == pytest.approx(613.2, abs=0.5)
    assert r.expected_distinct_experts_per_rank == pytest.approx(613.2 / 8, abs=0.1)
    assert r.router_fusion["fused_s"] < r.router_fusion["unfused_s"]


def test_expert_kernel_table_lists_every_registered_kernel():
    r = decode_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), 8, 4096)
    assert "grouped_bf16" in r.expert_kernels and r.expert_kernels["grouped_bf16"] > 0
    assert r.expert_kernel in r.expert_kernels
