"""One MLA head-dim rule (issue 20, item 2; `k3sim.configs.mla`): the step model's MLA prefill attention and
the CP model's MLA attention price the same layer at the same head dim and so the same time (the CP model
used the FLOP-equivalent 160 where the step model used 192 for K3)."""

from __future__ import annotations

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.configs.mla import mla_attention_head_dims
from k3sim.cp import geometry_from_model
from k3sim.cp.layers import allgather_kv_layer
from k3sim.cp.model import layer_inputs
from k3sim.step.batch import Batch
from k3sim.step.calls import Timer
from k3sim.step.layers import mla_calls
from k3sim.step.layout import StepLayout

MODELS = ["models/kimi-k3.yaml", "models/kimi-linear-48b.yaml"]


def test_the_rule_for_deepseek_v3_style_mla():
    """QK^T at qk_nope + qk_rope = 192, PV at v = 128: a single-head-dim kernel runs at 192 (V padded); the
    useful FLOP equal one SDPA call's at (192 + 128) / 2 = 160."""
    d = mla_attention_head_dims(load_model("models/kimi-k3.yaml").mla)
    assert (d.qk, d.v, d.kernel_head_dim, d.flop_equivalent_head_dim) == (192, 128, 192, 160)


@pytest.mark.parametrize("model_path", MODELS)
@pytest.mark.parametrize("tokens,tp", [(4096, 1), (16384, 4), (65536, 8)])
def test_step_and_cp_models_price_one_mla_layer_alike(model_path, tokens, tp):
    """One MLA layer's causal attention over `tokens` on one rank: the step model's `mla_prefill_attention`
    call and the CP model's attention row at one rank (all-gather KV at P = 1: no other rank's keys) agree
    within 1 %, at the head dim both read from the one rule."""
    model, hw = load_model(model_path), load_hardware("h200")
    if model.mla.num_heads % tp:
        pytest.skip(f"TP={tp} does not divide the MLA heads")
    call = next(c for c in mla_calls(model, StepLayout(tp=tp), Batch(prefill=((tokens, 0),)))
                if c.component == "mla_prefill_attention")
    g = geometry_from_model(model, tp=tp)
    assert call.params["D"] == g.mla_sdpa_head_dim == mla_attention_head_dims(model.mla).kernel_head_dim
    step_s = Timer(hw).row(call, 0).seconds
    cp = allgather_kv_layer(layer_inputs(g, hw, tokens, 1))
    cp_s = next(r["seconds"] for r in cp.fwd.rows if r["component"].startswith("attention"))
    assert cp_s == pytest.approx(step_s, rel=0.01)
