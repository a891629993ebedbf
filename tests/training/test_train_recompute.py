"""The training step under `training.recompute` (issue 22 item 3): hand-set layer costs with hand-set module
seconds, so the recompute the step adds is worked out on paper."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from fakes import fake_kernel_time  # noqa: E402
from memory_toys import toy_model  # noqa: E402

from k3sim.configs import load_hardware  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.errors import InputError  # noqa: E402
from k3sim.step.training import LayerCost  # noqa: E402
from k3sim.training import TrainOptions, train_step  # noqa: E402

H200 = load_hardware("h200")
# forward seconds of each module in a layer (part of its 1 s forward): norms 0.1 everywhere, KDA's core 0.3,
# MLA's up-projections 0.2 and attention core 0.4, the MoE SwiGLUs 0.05
MODULES = {"kda": {"norms": 0.1, "kda_core": 0.3}, "mla": {"norms": 0.1, "mla_up_proj": 0.2, "attention_core": 0.4}}


def costs(model, hw, *, tp=1, ep=1, cp=1, tokens=0, seq_len=0, kernel_time=None, glue=None, precision="bf16"):
    out = []
    for i, k in enumerate(model.layer_kinds):
        mods = dict(MODULES[k], **({"moe_act": 0.05} if model.ffn_kinds[i] == "moe" else {}))
        out.append(LayerCost(i, k, 1.0, 1.0, 0.5, 0.0, 0.0, module_forward_s=mods))
    return out + [LayerCost(-1, "embedding", 0.0, 0.0, 0.0, 0.0, 0.0),
                  LayerCost(model.num_layers, "lm_head", 0.0, 0.0, 0.0, 0.0, 0.0)]


def step(checkpointing=False, **opts):
    return train_step(toy_model(), H200, Parallelism(), seq_len=64, num_micro_batches=2,
                      activation_checkpointing=checkpointing, kernel_time=fake_kernel_time(), layer_costs=costs,
                      options=TrainOptions(use_pipeline_engine=False, **opts))


def test_selective_recompute_adds_the_chosen_modules_forward():
    # per micro-batch: 4 layers x (1 + 1 + 0.5) = 10 s; 2 micro-batches
    assert step().step_time_s == pytest.approx(20.0)
    assert step(checkpointing=True).step_time_s == pytest.approx(2 * (10 + 4))           # full: every forward
    # DeepSeek-V3's recipe (the default modules): 4 norms x 0.1 + the MLA layer's up-projections 0.2
    sel = step(recompute="selective")
    assert sel.step_time_s == pytest.approx(2 * (10 + 0.6)) and sel.stages[0]["recompute_s"] == pytest.approx(0.6)
    # every module: 4 x 0.1 + 0.2 + 0.4 + 3 KDA cores x 0.3 + 3 MoE layers x 0.05
    every = step(recompute="selective",
                 recompute_modules=("norms", "mla_up_proj", "attention_core", "moe_act", "kda_core"))
    assert every.step_time_s == pytest.approx(2 * (10 + 0.4 + 0.2 + 0.4 + 0.9 + 0.15))


def test_the_scenario_field_wins_over_the_workload_checkpointing():
    # recompute: none with activation_checkpointing true (the workload's default) runs no recompute, and the
    # memory plan is the no-recompute one
    r = step(checkpointing=True, recompute="none")
    assert r.step_time_s == pytest.approx(20.0) and r.memory.recompute == "none"
    assert step(checkpointing=False, recompute="full").step_time_s == pytest.approx(28.0)


def test_memory_plan_follows_the_step():
    r = step(recompute="selective", precision="fp8")
    assert r.memory.recompute == "selective" and r.memory.recompute_modules == ("norms", "mla_up_proj")
    assert r.memory.precision == "fp8" and "routed_in" in r.memory.fp8_tensors


def test_hfu_counts_the_recomputed_modules_flop_only():
    none, sel = step(), step(recompute="selective")
    full = step(checkpointing=True)
    # the toy's one MLA layer has no q compression: mla_up_proj re-runs kv_b only, kv_lora 8 x 2 heads x (nope 4
    # + v 4) multiply-adds = 128, 256 FLOP per token; norms are elementwise (not counted); 2 x 64 tokens a step
    assert sel.hardware_flop_per_step - none.hardware_flop_per_step == pytest.approx(256 * 128)
    assert full.hardware_flop_per_step > sel.hardware_flop_per_step
    assert sel.model_flop_per_step == none.model_flop_per_step      # MFU never counts recompute


def test_bad_recompute_modules_are_refused_before_any_cost():
    with pytest.raises(InputError, match="set training.recompute: selective") as err:
        step(recompute_modules=("norms",))
    assert err.value.field == "training.recompute_modules"
    from k3sim.configs import ModelConfig

    dense = ModelConfig(name="dense-mla", hidden_size=16, num_layers=2, vocab_size=100, dense_ffn_width=32,
                        mla=dict(num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4))
    with pytest.raises(InputError, match="MoE layers") as err:
        train_step(dense, H200, Parallelism(), seq_len=64, kernel_time=fake_kernel_time(), layer_costs=costs,
                   options=TrainOptions(recompute="selective", recompute_modules=("moe_act",)))
    assert err.value.field == "training.recompute_modules"
