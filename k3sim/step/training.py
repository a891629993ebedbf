"""`training_layer_costs`: forward and backward compute time of every layer for one micro-batch, per GPU.

The forward is the same call list a prefill step launches (`step.layers`, prefix 0: the kv_b GEMM then
expands the sequence's own latent into K/V, as training does), so training and serving share one layer
model. The backward of each call comes from measurements where the profile has them and from the
forward's shapes otherwise:
- GEMM (M, N, K): input gradient dX = dY W^T is the GEMM (M, K, N); weight gradient dW = X^T dY is the
  GEMM (K, N, M) (each predicted at its own shape).
- chunked KDA and causal attention: the measured forward+backward op minus the measured forward.
- grouped expert GEMMs: input gradient at the transposed shape; weight gradient at the forward's (same
  FLOP and weight bytes), both from the grouped-GEMM data.
- small elementwise kernels (norms, activations, conv, router): twice the forward (modelling choice:
  the backward reads the gradient and the saved input and writes one gradient, about twice the bytes).
- kernels the profile has not measured (MoE permute/combine, short conv, gated norm): their HBM-copy
  proxy, for the glue families (all but the gated norm, `glue.is_glue`) times the glue calibration's factors (`step.glue`: forward ~10x, backward ~6x, fitted on a
  profiled whole training step; `GlueCalibration.proxy()` for the bytes-only model).
Collectives are left out: the training step model places TP / EP / CP / DP communication itself.
Costs are compute per GPU; activation recompute is the caller's choice (add the forward once more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from k3sim.configs.model import ModelConfig
from k3sim.kernels.ops import COLLECTIVE_OPS
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call, Timer
from k3sim.step.glue import GlueCalibration, is_glue, load_glue
from k3sim.step.layers import embedding_calls, layer_calls, layer_signature, lm_head_calls
from k3sim.step.layout import StepLayout

COLLECTIVES = COLLECTIVE_OPS  # the registry's collective kind: costed by the training step model, not here
SMALL_OP_BACKWARD_FACTOR = 2.0  # modelling choice, see the module docstring


@dataclass(frozen=True)
class LayerCost:
    layer: int  # 0-based; -1 embedding, num_layers LM head
    kind: str  # "embedding" | "kda" | "mla" | "lm_head"
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    activation_bytes: float  # hidden state one GPU sends to the next stage for this micro-batch
    attn_res_block_bytes: float  # one AttnRes block representative for these tokens, per GPU

    @property
    def backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s


def _call_costs(timer: Timer, call: Call, glue: GlueCalibration | None = None) -> tuple[float, float, float]:
    """(forward, backward input, backward weight) seconds of one call."""
    if call.op in COLLECTIVES:
        return 0.0, 0.0, 0.0
    row = timer.row(call, 0)
    fwd = row.seconds
    if row.source.startswith("proxy"):
        g = glue if glue is not None and is_glue(call.op) else GlueCalibration.proxy()
        return g.fwd * fwd, g.bwd * SMALL_OP_BACKWARD_FACTOR * fwd, 0.0
    p = call.params
    if call.op.startswith("gemm_"):
        bi = timer.time(call.op, {"M": p["M"], "N": p["K"], "K": p["N"]})[0]
        bw = timer.time(call.op, {"M": p["K"], "N": p["N"], "K": p["M"]})[0]
        return fwd, bi * call.count, bw * call.count
    if call.op in ("chunk_kda_fwd", "sdpa_causal_fwd"):
        both = timer.time(call.op + "_bwd", dict(p))[0]
        return fwd, max(0.0, both * call.count - fwd), 0.0
    if call.op.startswith("moe_grouped"):
        bi = timer.time(call.op, {**p, "K": p["N"], "N": p["K"]})[0]
        return fwd, bi * call.count, fwd
    return fwd, SMALL_OP_BACKWARD_FACTOR * fwd, 0.0


def training_head_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> list[Call]:
    """Final norm and LM head as training runs them: logits (and the loss) for every token, not one per
    sequence as a prefill step; no sampling."""
    head = [c for c in lm_head_calls(model, layout, batch) if c.component != "sampling"]
    return [Call(c.component, c.op, {**c.params, "M": batch.tokens}) if c.component == "lm_head" else c
            for c in head]


def _sum(timer: Timer, calls: list[Call], glue: GlueCalibration | None) -> tuple[float, float, float]:
    f = bi = bw = 0.0
    for c in calls:
        a, b, w = _call_costs(timer, c, glue)
        f, bi, bw = f + a, bi + b, bw + w
    return f, bi, bw


def training_layer_costs(model: ModelConfig, hw: Any, *, tp: int = 1, ep: int = 1, cp: int = 1,
                         tokens: int, seq_len: int, kernel_time: Callable | None = None,
                         expert_kernel: str = "grouped_bf16", glue: GlueCalibration | None = None) -> list[LayerCost]:
    """Per-layer compute of one micro-batch of `tokens` tokens in sequences of `seq_len`, on one GPU of
    a TP x EP (x CP) stage. Under CP each GPU holds seq_len / cp tokens of each sequence (the CP
    exchange itself is the CP model's). Routed experts in bf16 grouped GEMMs (training keeps bf16
    master weights; `expert_kernel` to change). `glue`: None = the profile's glue calibration."""
    if tokens < 1 or seq_len < 1 or tokens % seq_len:
        raise ValueError(f"tokens={tokens} must be a positive multiple of seq_len={seq_len}")
    layout = StepLayout(tp=tp, ep=ep, expert_kernel=expert_kernel)
    timer = Timer(hw, kernel_time, "graph")
    glue = load_glue(hw) if glue is None else glue
    local = max(1, seq_len // cp)
    batch = Batch(prefill=((local, 0),) * (tokens // seq_len))
    d = model.hidden_size
    act = batch.tokens * d * BF16 / tp  # sequence-parallel shard of the hidden state
    out = [LayerCost(-1, "embedding", *_sum(timer, embedding_calls(model, batch), glue), act, 0.0)]
    memo: dict[tuple, tuple[float, float, float]] = {}
    blk = act if model.attn_res_block_size else 0.0
    for i in range(model.num_layers):
        sig = layer_signature(model, i)
        if sig not in memo:
            memo[sig] = _sum(timer, layer_calls(model, i, layout, batch, expert_kernel), glue)
        out.append(LayerCost(i, model.layer_kinds[i], *memo[sig], act, blk))
    head = training_head_calls(model, layout, batch)
    out.append(LayerCost(model.num_layers, "lm_head", *_sum(timer, head, glue), 0.0, 0.0))
    return out
