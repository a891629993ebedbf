"""Shipped scenarios load, resolve their model and hardware, and divide the model."""

from __future__ import annotations

import pytest

from k3sim.configs import bytes_per_element, resolve_scenario


@pytest.mark.parametrize("name, gpus_per_replica", [("default", 8 * 2), ("k3-h200-train-32k", 8 * 16 * 64)])
def test_shipped_scenarios_resolve(root, name, gpus_per_replica):
    scenario, model, hw = resolve_scenario(root / f"scenarios/{name}.yaml")
    assert model.name == "kimi-k3" and hw.name == "h200"
    assert scenario.cluster.num_gpus % scenario.parallelism.gpus == 0
    assert scenario.replicas * scenario.parallelism.gpus == scenario.cluster.num_gpus
    # tp x pp x cp x dp by hand; each shipped cluster holds exactly one replica.
    assert (scenario.parallelism.gpus, scenario.replicas) == (gpus_per_replica, 1)


def test_replicas_count(root):
    """32 GPUs hold two TP8 x PP2 replicas; ep folds into a stage and adds no GPUs."""
    scenario, _, _ = resolve_scenario(root / "scenarios/default.yaml")
    bigger = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"num_gpus": 32})})
    assert bigger.replicas == 2


def test_default_is_k3_serve_tp8_pp2_ep8_128k(root):
    scenario, _, _ = resolve_scenario(root / "scenarios/default.yaml")
    p, w = scenario.parallelism, scenario.workload
    assert (p.tp, p.pp, p.ep, w.mode, w.context_tokens) == (8, 2, 8, "serve", 131072)


def test_bytes_per_element():
    assert bytes_per_element("fp32") == 4 and bytes_per_element("BF16") == 2
    assert bytes_per_element("fp8") == 1
    assert bytes_per_element("mxfp4") == 17 / 32  # 16 B of E2M1 + 1 B E8M0 per 32 values
    assert bytes_per_element("mxfp8") == 33 / 32
    assert bytes_per_element("nvfp4") == 9 / 16  # 8 B of E2M1 + 1 B E4M3 per 16 values
