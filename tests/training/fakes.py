"""A kernel clock with one constant per op and per-layer costs chosen by hand, so step times can be
worked out on paper."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace


@dataclass
class FakeLayerCost:
    layer: int
    kind: str
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    activation_bytes: float = 0.0
    attn_res_block_bytes: float = 0.0


def fake_layer_costs(f=1.0, bi=1.0, bw=0.5, emb=0.0, head=0.0):
    def costs(model, hw, *, tp=1, ep=1, cp=1, tokens=0, seq_len=0, kernel_time=None):
        out = [FakeLayerCost(i, k, f, bi, bw) for i, k in enumerate(model.layer_kinds)]
        out.append(FakeLayerCost(-1, "embedding", emb, 0.0, 0.0))
        out.append(FakeLayerCost(model.num_layers, "lm_head", head, head, 0.0))
        return out
    return costs


def fake_kernel_time(times: dict[str, float] | None = None, default: float = 0.0):
    """Every op takes `times[op]` seconds (default `default`): collectives are constants per call."""
    times = times or {}

    def kt(op, params, hardware=None, **kw):
        return SimpleNamespace(seconds=times.get(op, default), source="fake", detail="")
    return kt
