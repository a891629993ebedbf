"""Every shipped model through the step model: a decode and a prefill step on the H200 at a TP its layers allow."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.configs.kinds import MIXERS
from k3sim.step import Batch, StepLayout, forward_step

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "models").glob("*.yaml"))
HW = load_hardware("h200")


def widest_tp(model) -> int:
    """The largest TP of one node that every mixer kind's TP rules allow."""
    return next(t for t in (8, 4, 2, 1)
                if all(MIXERS[k].tp_problem(model.section(k), t) is None for k in model.mixer_kinds))


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_every_model_prices_a_decode_and_a_prefill_step(path):
    model = load_model(path)
    tp = widest_tp(model)
    ep = tp if model.moe is not None and model.moe.num_routed_experts % tp == 0 else 1
    layout = StepLayout(tp=tp, ep=ep)
    mixers = {k for layer in model.layers for k in layer.mixers}
    for batch in (Batch.decode(32, 4096), Batch(prefill=((2048, 1024),))):
        res = forward_step(model, HW, layout, batch)
        assert math.isfinite(res.seconds) and res.seconds > 0
        assert all(math.isfinite(r.seconds) and r.seconds >= 0 for r in res.rows)
        names = {r.component for r in res.rows}
        # every mixer kind the model holds shows its core kernel (SWA's rows are GQA's)
        core = "recurrent" if batch.num_decode else "chunk_prefill"
        for kind in mixers:
            want = (f"gqa_{'decode' if batch.num_decode else 'prefill'}_attention" if kind in ("gqa", "swa")
                    else f"mla_{'decode' if batch.num_decode else 'prefill'}_attention" if kind == "mla"
                    else f"{kind}_{core}")
            assert want in names, (model.name, kind, want)
