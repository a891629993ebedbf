"""Documented ranges (k3sim.configs.bounds) and the one layout check (k3sim.configs.check_layout)."""

from __future__ import annotations

import math

import pytest

from k3sim.configs import Cluster, Parallelism, check_layout, check_range, load_hardware, load_model
from k3sim.configs.bounds import BOUNDS, option_range
from k3sim.errors import InputError

K3 = "models/kimi-k3.yaml"


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
