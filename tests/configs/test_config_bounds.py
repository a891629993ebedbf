"""Documented ranges (k3sim.configs.bounds) and the one layout check (k3sim.configs.check_layout)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from k3sim.configs import Cluster, Parallelism, check_layout, check_range, load_hardware, load_model
from k3sim.configs.bounds import BOUNDS, option_range
from k3sim.errors import InputError

K3 = "models/kimi-k3.yaml"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value, kind, words", [
    (True, "layers", "expected a number"),
    (math.nan, "fraction", "finite"),
    (0, "layers", "positive (at least 1)"),
    (10_001, "layers", "10,001 is outside [1, 10,000] layers"),
    (2 ** 30 + 1, "tokens", "outside [1, 1,073,741,824] tokens"),
    (1.5, "batch", "whole number"),
    (-1, "fraction", "at least 0"),
])
def test_check_range_refuses_with_option_range_and_reason(value, kind, words):
    with pytest.raises(InputError) as err:
        check_range(value, kind, "--opt", integer=kind in ("layers", "batch", "tokens"))
    assert str(err.value).startswith("--opt: ") and words in str(err.value)


def test_check_range_accepts_the_ends_and_every_shipped_config():
    for r in BOUNDS.values():
        assert r.lo <= r.hi and r.why
    assert check_range(10_000, "layers", "--x") == 10_000 and check_range(1, "layers", "--x") == 1
    from k3sim.configs.loaders import REPO_ROOT, hardware_names

    models = sorted((REPO_ROOT / "models").glob("*.yaml"))
    assert len(models) >= 3 and len(hardware_names()) >= 5  # every shipped file, not a hand-kept list
    for path in models:
        load_model(path)
    for hw in hardware_names():
        load_hardware(hw)
    # the upper ends clear the largest shipped figures by the margin their `why` claims (>= 10x)
    k3 = load_model(K3)
    assert BOUNDS["layers"].hi >= 100 * k3.num_layers and BOUNDS["experts"].hi >= 70 * k3.moe.num_routed_experts
    assert BOUNDS["tokens"].hi >= 1000 * k3.max_context_tokens


def test_option_range_callback_passes_none_and_checks_lists():
    cb = option_range("gpus", "--gpus")
    assert cb(None) is None and cb([1, 8]) == [1, 8]
    with pytest.raises(InputError, match="--gpus"):
        cb([1, 0])


@pytest.mark.parametrize("par, cluster, hw, mode, field, words", [
    (dict(tp=5), None, None, None, "tp", "tp=5 does not divide the 96 KDA heads"),
    (dict(tp=8, pp=2, ep=8, zero_stage=3), None, None, "serve", "parallelism.zero_stage", "no effect"),
    (dict(tp=8), dict(num_gpus=24, gpus_per_node=3), "h200", None, "cluster.gpus_per_node", "8-GPU NVLink"),
    (dict(tp=16), dict(num_gpus=16), "h200", None, "parallelism.tp", "NVLink domain"),
    (dict(tp=8), dict(num_gpus=8, gpus_per_node=4), None, None, "parallelism.tp", "node of 4 GPUs (cluster"),
    (dict(tp=8, dp=2), dict(num_gpus=24), None, None, "cluster.num_gpus", "not a multiple of tp*pp*cp*dp=16"),
])
def test_check_layout_refuses(par, cluster, hw, mode, field, words):
    with pytest.raises(InputError) as err:
        check_layout(load_model(K3), Parallelism(**par), cluster=None if cluster is None else Cluster(**cluster),
                     hardware=None if hw is None else load_hardware(hw), mode=mode, source="s.yaml")
    assert err.value.field == field and words in err.value.reason


def test_check_layout_accepts_real_layouts():
    m = load_model(K3)
    check_layout(m, Parallelism(tp=8, pp=2, ep=8), cluster=Cluster(num_gpus=16), hardware=load_hardware("h200"),
                 mode="serve")
    # NVL72: 4 GPUs per node, a 72-GPU NVLink domain: TP8 spans two nodes over NVLink
    check_layout(m, Parallelism(tp=8, pp=2, ep=8), cluster=Cluster(num_gpus=16, gpus_per_node=4),
                 hardware=load_hardware("gb200-nvl72"), mode="serve")
    check_layout(m, Parallelism(tp=8, pp=16, virtual_stages=2, ep=64, dp=64, zero_stage=1),
                 cluster=Cluster(num_gpus=8192), hardware=load_hardware("h200"), mode="train")


# ------------------------------------------------------------------------------------------ issue 19: sections
@pytest.mark.parametrize("cls, data, field, words", [
    ("TrainingSection", {"routing_skew": math.inf}, "routing_skew", "finite"),
    ("TrainingSection", {"routing_skew": 11.0}, "routing_skew", "less than or equal to 10"),
    ("TrainingSection", {"redundant_experts": 10 ** 9}, "redundant_experts", "less than or equal to 65536"),
    ("TrainingSection", {"seed": 10 ** 30}, "seed", "less than or equal"),
    ("TrainingSection", {"seed": True}, "seed", "booleans are not numbers"),
    ("TrainingSection", {"tp_overlap": math.nan}, "tp_overlap", "finite"),
    ("SweepSection", {"tp": [8, 8]}, "tp", "8 appears twice"),
    ("SweepSection", {"dp": []}, "dp", "is empty"),
    ("SweepSection", {"pp": [100_000]}, "pp.0", "less than or equal to 65536"),
    ("SweepSection", {"prefill_replicas": [0, 5000]}, "prefill_replicas.1", "less than or equal to 4096"),
    ("SweepSection", {"max_batch": [True]}, "max_batch.0", "booleans"),
    ("ServingConfig", {"engine": {"hash_block_tokens": 1}}, "engine.hash_block_tokens", "greater than or equal to 16"),
    ("ServingConfig", {"engine": {"physical_block_tokens": 2 ** 31}}, "engine.physical_block_tokens", "less than"),
    ("ServingConfig", {"seed": 10 ** 30}, "seed", "less than or equal"),
    ("ServingConfig", {"slo_ttft_s": math.inf}, "slo_ttft_s", "finite"),
    ("ServingConfig", {"slo_tpot_s": 0}, "slo_tpot_s", "greater than 0"),
    ("ServingConfig", {"replicas": 5000}, "replicas", "less than or equal to 4096"),
    ("ServingConfig", {"router_load_cap": 0}, "router_load_cap", "greater than or equal to 1"),
    ("ServingConfig", {"engine": {"watermark_fraction": True}}, "engine.watermark_fraction", "booleans"),
])
def test_every_number_of_the_planner_sections_is_bounded(cls, data, field, words):
    """A scenario's training:, sweep: and serving: numbers use the bounds table: .inf skew, 10^9 redundant
    slots (a hang), a 10^30 seed and a 1-token hash block were accepted."""
    from k3sim.configs import planning, serving
    from k3sim.configs.loaders import validate

    schema = getattr(planning, cls, None) or getattr(serving, cls)
    with pytest.raises(InputError) as err:
        validate(schema, data, "s.yaml")
    assert err.value.field == field and words in err.value.reason, (err.value.field, err.value.reason)


def test_the_skew_bound_is_where_the_hottest_expert_takes_almost_every_token():
    """bounds.py says: at the Zipf exponent's upper end the hottest of K3's 896 experts takes 99.9 % of the
    routed tokens, so nothing changes above it."""
    import numpy as np

    skew = BOUNDS["zipf_exponent"].hi
    experts = load_model(K3).moe.num_routed_experts
    w = 1.0 / np.arange(1, experts + 1, dtype=float) ** skew
    assert experts == 896 and w[0] / w.sum() >= 0.999


def test_a_serve_scenario_with_more_replicas_than_a_simulation_runs_is_refused(tmp_path):
    from k3sim.configs.bounds import BOUNDS as B
    from k3sim.configs.loaders import load_scenario

    hi = int(B["replicas"].hi)
    text = (ROOT / "scenarios/k3-h200-1node.yaml").read_text()
    path = tmp_path / "s.yaml"
    path.write_text(text.replace("num_gpus: 8", f"num_gpus: {8 * (hi + 1)}"))
    with pytest.raises(InputError) as err:
        load_scenario(path)
    assert err.value.field == "cluster.num_gpus" and "serving.replicas" in err.value.reason
    path.write_text(text.replace("num_gpus: 8", f"num_gpus: {8 * (hi + 1)}")
                    .replace("workload:", "serving: {replicas: 4}\nworkload:"))
    assert load_scenario(path).serving.replicas == 4  # an explicit fleet size within the bound is served


def test_redundant_slots_past_what_a_rank_can_use_are_refused_per_layout():
    """10^9 MoonEP slots hung the balancer; the step model refuses more slots than the experts a rank does not
    hold (every rank then holds every expert), for the layout at hand."""
    from k3sim.configs import Parallelism
    from k3sim.training import TrainOptions, train_step

    m, hw = load_model(K3), load_hardware("h200")
    par = Parallelism(tp=8, pp=16, virtual_stages=2, ep=64, dp=64)
    cap = 896 - 896 // 64
    with pytest.raises(InputError) as err:
        train_step(m, hw, par, seq_len=32768, options=TrainOptions(redundant_experts=cap + 1), with_memory=False)
    assert err.value.field == "training.redundant_experts" and f"at most {cap}" in err.value.reason
