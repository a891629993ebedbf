"""Redundant expert slots (EPLB) in the serving memory plan: each GPU holds ceil((E + R) / ep) experts."""

from k3sim.configs import load_hardware, load_model
from k3sim.configs.parallelism import Parallelism
from k3sim.memory.plan import serve_plan


def _routed(plan) -> int:
    return next(r.bytes for r in plan.breakdown if r.component == "weights_routed_experts")


def test_redundant_slots_add_their_weights(root):
    """DeepSeek-V3 prefill unit: 256 + 32 slots on EP32 = 9 experts per GPU against 8 without redundancy,
    so the routed weights per GPU grow by 9/8 exactly (up to the ceiling of one byte)."""
    m = load_model(root / "models/deepseek-v3.yaml")
    hw = load_hardware("h200")
    base = serve_plan(m, hw, Parallelism(ep=32, dp=32), 4096)
    red = serve_plan(m, hw, Parallelism(ep=32, dp=32, redundant_experts=32), 4096)
    assert abs(_routed(red) / _routed(base) - 9 / 8) < 1e-6
