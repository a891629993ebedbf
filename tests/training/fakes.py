"""A kernel clock with one constant per op and per-layer costs chosen by hand, so step times can be
worked out on paper."""

from __future__ import annotations

from types import SimpleNamespace

from k3sim.step.training import LayerCost


def fake_layer_costs(f=1.0, bi=1.0, bw=0.5, emb=0.0, head=0.0):
    """`training_layer_costs`' signature and result type, with costs chosen by hand (`glue` and `precision` are
    ignored)."""
    def costs(model, hw, *, tp=1, ep=1, cp=1, tokens=0, seq_len=0, kernel_time=None, glue=None, precision="bf16"):
        out = [LayerCost(i, k, f, bi, bw, 0.0, 0.0) for i, k in enumerate(model.layer_kinds)]
        out.append(LayerCost(-1, "embedding", emb, 0.0, 0.0, 0.0, 0.0))
        out.append(LayerCost(model.num_layers, "lm_head", head, head, 0.0, 0.0, 0.0))
        return out
    return costs


def fake_kernel_time(times: dict[str, float] | None = None, default: float = 0.0):
    """Every op takes `times[op]` seconds (default `default`): collectives are constants per call."""
    times = times or {}

    def kt(op, params, hardware=None, **kw):
        return SimpleNamespace(seconds=times.get(op, default), source="fake", detail="")
    return kt
