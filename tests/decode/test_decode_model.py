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
    # Hand-worked: only the KDA decode kernel costs time (1 ms per layer). K3's 93 layers split 47 / 46 over
    # two stages; MLA layers (1-based) 4, 8, ..., 44 are 11 of the first 47 and 48, ..., 88, 92, 93 are 13
    # of the last 46, so the stages take 36 and 33 ms. Two micro-batches in flight: a sequence gets a token
    # every max(36 + 33, 2 x 36) = 72 ms; the replica emits 32 x 2 tokens per 72 ms over 16 GPUs.
    from dataclasses import dataclass

    @dataclass
    class KT:
        seconds: float
        source: str = "fake"
        detail: str = ""

    def kda_only(op, params, hardware=None):
        return KT(1e-3 if op == "recurrent_kda_decode" else 0.0)

    r = decode_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), 32, 32768, kernel_time=kda_only, memory_cap=False)
    assert r.stage_seconds == pytest.approx([0.036, 0.033])
    assert r.tpot_s == pytest.approx(0.072)
    assert r.tokens_per_s == pytest.approx(64 / 0.072)
    assert r.tokens_per_s_per_gpu == pytest.approx(64 / 0.072 / 16)


def test_memory_cap_is_the_planners_concurrency_over_pp():
    lay = StepLayout(tp=8, pp=2, ep=8)
    r = decode_step(K3, HW, lay, 8, 131072)
    plan = serve_plan(K3, HW, Parallelism(tp=8, pp=2, ep=8), 131072)
    assert r.max_batch_by_memory == plan.max_concurrent_requests // 2


def test_k3_on_one_node_has_no_memory_cap_answer_and_no_batch_fits():
    from k3sim.decode.sweep import sweep_table

    r = decode_step(K3, HW, StepLayout(tp=8, pp=1, ep=8), 1, 4096)
    assert r.max_batch_by_memory is None  # routed experts alone exceed HBM
    assert not sweep_table([r], HW)["fits_memory"].any()


def test_distinct_experts_reported_per_layer_and_rank():
    r = decode_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), 64, 4096)
    assert r.expected_distinct_experts_per_layer == pytest.approx(613.2, abs=0.5)
    assert r.expected_distinct_experts_per_rank == pytest.approx(613.2 / 8, abs=0.1)
    assert r.router_fusion["fused_s"] < r.router_fusion["unfused_s"]


def test_expert_kernel_table_lists_every_registered_kernel():
    r = decode_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), 8, 4096)
    assert "grouped_bf16" in r.expert_kernels and r.expert_kernels["grouped_bf16"] > 0
    assert r.expert_kernel in r.expert_kernels


def test_expert_kernel_and_router_tables_count_every_moe_layer_of_the_step():
    from dataclasses import dataclass

    @dataclass
    class KT:
        seconds: float
        source: str = "fake"
        detail: str = ""

    def one_us(op, params, hardware=None):
        return KT(1e-6)

    r = decode_step(K3, HW, StepLayout(tp=8, pp=2, ep=8), 8, 4096, kernel_time=one_us, memory_cap=False)
    assert r.expert_kernels["mxfp4_token"] == pytest.approx(92 * 1e-6)  # one op per MoE layer, 92 layers
    assert r.expert_kernels["grouped_fp8"] == pytest.approx(92 * 1e-6)
    assert r.router_fusion == pytest.approx({"fused_s": 92e-6, "unfused_s": 2 * 92e-6})


def test_attention_dp_throughput_counts_every_rank_and_node():
    # Hand-worked: only MLA decode attention costs (1 ms per layer): DeepSeek-V3's 61 layers on one stage
    # make a 61 ms step; 256 DP ranks x 64 sequences get a token each per step over 256 GPUs, so a GPU emits
    # 64 / 0.061 tokens/s and a node of 8 GPUs 8 x that.
    from dataclasses import dataclass

    @dataclass
    class KT:
        seconds: float
        source: str = "fake"
        detail: str = ""

    def mla_only(op, params, hardware=None, convention="graph"):
        return KT(1e-3 if op == "mla_decode" else 0.0)

    ds = load_model("models/deepseek-v3.yaml")
    lay = StepLayout(tp=1, pp=1, ep=256, attention_dp=256, ep_kernel="low_latency")
    r = decode_step(ds, HW, lay, 64, 4096, kernel_time=mla_only, memory_cap=False)
    assert r.step_s == pytest.approx(0.061) and r.tpot_s == pytest.approx(0.061)
    assert r.tokens_per_s == pytest.approx(256 * 64 / 0.061)
    assert r.tokens_per_s_per_gpu == pytest.approx(64 / 0.061)
    assert r.tokens_per_s_per_node == pytest.approx(8 * 64 / 0.061)
    assert r.ep_kernel_used == "low_latency" and r.layout.dispatch_dtype == "fp8"  # auto resolved on the H200
    # the busiest of 256 EP ranks carries more than the mean (seeded routing draw); a TP-only layout has none
    assert r.expert_load_max_over_mean > 1.0
    assert decode_step(ds, HW, StepLayout(tp=8, pp=1, ep=8), 8, 4096, kernel_time=mla_only,
                       memory_cap=False).expert_load_max_over_mean == 1.0
