"""Predictions for the whole-step measurements (`k3sim/calibration/wholestep/`), made before they run.

Two predictions per point, both from the one kernel predictor under the CUDA-graph convention:
- `model`: the step model itself (`forward_step` machinery over the measured configuration's layers:
  the same layout, down-projections whole on the rank as the measured model builds them, collectives
  left out because one GPU runs one rank's compute);
- `manifest`: the sum of per-kernel predictions over the exact kernel list the measured model launches
  (`wholestep.spec.sequence`), so a miss of the whole step against this sum is a composition effect
  (back-to-back kernels in one graph vs kernels timed alone), not a wrong kernel list.
Kernels the profile has not measured (implementation glue: conv update, sigmoid, split copies, MoE
permute/combine, KV-cache writes) stream their bytes through the HBM-copy fit and say `proxy` in source.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call, Timer
from k3sim.step.layers import embedding_calls, layer_calls, lm_head_calls
from k3sim.step.layout import StepLayout

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def _nb(*xs) -> float:
    return float(math.prod(xs))


def manifest_call(op: str, p: dict) -> Call:
    """One manifest entry as a predictor call (registry op) or an HBM proxy with the bytes it moves."""
    p = dict(p)
    if op == "silu_mul":
        T = p["T"]
        if isinstance(T, str):  # "N x topk" rows of the routed experts
            a, _, b = T.partition("x")
            T = math.ceil(float(a) * float(b))
        return Call(op, op, {"T": int(T), "N": int(p.get("N", p.get("D")))}, proxy_bytes=3 * _nb(T, p.get("N", p.get("D"))) * BF16)
    if op == "bmm_bf16":  # per-head batched product: a GEMM of equal FLOP and weight bytes
        return Call(op, "gemm_bf16", {"M": p["M"], "N": p["N"] * p["batch"], "K": p["K"]})
    if op == "sdpa_prefix_causal_fwd":
        c, kv = p["Tq"], p["Tkv"]
        side = max(1, math.ceil(math.sqrt(c * (2 * (kv - c) + c))))
        return Call(op, "sdpa_causal_fwd", {"T": side, "H": p["H"], "D": p["D"]})
    if op in ("sdpa_causal_fwd", "sdpa_causal_fwd_bwd") and "B" in p:
        return Call(op, op, {"T": p["T"], "H": p["H"], "D": p["D"]}, count=p["B"])
    if op == "moe_mxfp4_decode" and not float(p["topk"]).is_integer():
        pairs = p["B"] * p["topk"]
        p = {**p, "B": max(1, math.ceil(pairs)), "topk": 1}
    if op == "moe_grouped_bf16" and not float(p["topk"]).is_integer():
        pairs = p["B"] * p["topk"]
        p = {**p, "B": max(1, math.ceil(pairs)), "topk": 1}
    proxy = {
        "conv1d_update": lambda: 2 * _nb(p.get("B", 1), p.get("D", 1), p.get("W", 1)) * BF16,
        "causal_conv1d_fwd": lambda: 2 * _nb(p.get("B", 1), p.get("T", 1), p.get("D", 1)) * BF16,
        "sigmoid": lambda: 2 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "split_copy": lambda: 2 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "sigmoid_mul": lambda: 3 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "gated_rmsnorm": lambda: 3 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "kv_cache_write": lambda: 2 * _nb(p.get("T", 1), p.get("D", 1)) * BF16,
        "moe_permute": lambda: 2 * _nb(p.get("T", 1), p.get("topk", 1), p.get("D", 1)) * BF16,
        "moe_combine": lambda: 2 * _nb(p.get("T", 1), p.get("topk", 1), p.get("D", 1)) * BF16,
    }.get(op, lambda: 0.0)()
    return Call(op, op, {k: int(v) for k, v in p.items()}, proxy_bytes=proxy)


def manifest_prediction(seq: list[dict], hw: Any, kernel_time: Callable | None = None) -> tuple[float, dict]:
    """Sum of per-kernel predictions over a kernel list; also the seconds by op and by source kind."""
    from k3sim.kernels.ops import OPS

    timer = Timer(hw, kernel_time, "graph")
    total, by_op, by_src = 0.0, {}, {}
    for e in seq:
        c = manifest_call(e["op"], e["params"])
        if c.op in OPS:
            try:
                r = timer.row(c, 0)
            except Exception:  # params outside the registry's shape: stream its bytes instead
                r = timer.row(Call(c.component, "unregistered:" + c.op, {}, proxy_bytes=c.proxy_bytes), 0)
        else:
            r = timer.row(c, 0)
        total += r.seconds
        by_op[e["op"]] = by_op.get(e["op"], 0.0) + r.seconds
        kind = "proxy" if r.source.startswith("proxy") else r.source
        by_src[kind] = by_src.get(kind, 0.0) + r.seconds
    return total, {"by_op": by_op, "by_source": by_src}


def model_prediction(model, hw: Any, *, tp: int, ep: int, layers: list[int], embed_head: bool, batch: Batch,
                     expert_kernel: str, kernel_time: Callable | None = None) -> float:
    """The step model over `layers` (0-based) of `model` as one rank computes them (no collectives)."""
    from k3sim.step.forward import _eval_calls

    lay = StepLayout(tp=tp, ep=ep, expert_kernel=expert_kernel, replicated_down_proj=True)
    timer = Timer(hw, kernel_time, "graph")
    calls = embedding_calls(model, batch) if embed_head else []
    for i in layers:
        calls += layer_calls(model, i, lay, batch, expert_kernel)
    if embed_head:
        calls += [c for c in lm_head_calls(model, lay, batch) if c.component != "sampling"]
    calls = [c for c in calls if c.op not in COLLECTIVES]
    return sum(r.seconds for r in _eval_calls(timer, calls, 0) if not r.hidden)
