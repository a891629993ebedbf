"""`training_layer_costs`: forward and backward compute time of every layer for one micro-batch, per GPU.

The forward is the same call list a prefill step launches (`step.layers`, prefix 0: the kv_b GEMM then
expands the sequence's own latent into K/V, as training does), so training and serving share one layer
model. The backward of each call comes from measurements where the profile has them and from the
forward's shapes otherwise:
- GEMM (M, N, K): input gradient dX = dY W^T is the GEMM (M, K, N); weight gradient dW = X^T dY is the
  GEMM (K, N, M) (each predicted at its own shape).
- the chunked linear-attention and state-space kernels (KDA, GDN, Mamba2: `chunk_kda_fwd`, `chunk_gdn_fwd`,
  `mamba2_chunk_fwd`, and whatever op a kind borrows from them) and causal attention (`sdpa_causal_fwd`): the
  measured forward+backward op of the same name + `_bwd` minus the measured forward (`backward_op`);
- GQA / SWA attention (`gqa_prefill_fwd`): FlashAttention's backward over the query heads, as the causal SDPA
  pair at {T, H = Hq, D} (forward+backward minus forward; with GQA the backward still runs every query head's
  dQ, dK, dV products, accumulating dK, dV over the group: MHA's compute, modelling choice), times the share of
  the causal pairs a sliding window keeps;
- grouped expert GEMMs: input gradient at the transposed shape; weight gradient at the forward's (same
  FLOP and weight bytes), both from the grouped-GEMM data.
- small elementwise kernels (norms, activations, conv, router): twice the forward (modelling choice:
  the backward reads the gradient and the saved input and writes one gradient, about twice the bytes).
- kernels the profile has not measured (MoE permute/combine, short conv, gated norm): their HBM-copy
  proxy, for the glue families (all but the gated norm, `glue.is_glue`) times the glue calibration's factors (`step.glue`: forward ~10x, backward ~6x, fitted on a
  profiled whole training step; `GlueCalibration.proxy()` for the bytes-only model).
Collectives are left out: the training step model places TP / EP / CP / DP communication itself.
Costs are compute per GPU; activation recompute is the caller's choice (add the forward once more, or only
the modules it recomputes: `LayerCost.module_forward_s`, per `k3sim.step.modules.module_of`).

Precision (`training.precision`). bf16: every linear layer is a bf16 GEMM, whatever format a serving
checkpoint stores (training keeps bf16 weights; DeepSeek-V3's FP8 checkpoint would otherwise price its
projections as FP8 GEMMs here). fp8: DeepSeek-V3's mixed-precision framework (arXiv 2412.19437 sec. 3.3.1-3.3.3):
- the three GEMMs of each linear layer (forward Y = X W, dgrad dX = dY W^T at (M, K, N), wgrad dW = X^T dY at
  (K, N, M)) run as op `gemm_fp8_block` (e4m3 X with 1x128 fp32 scales, e4m3 W in 128x128 blocks, fp32
  promotion, bf16 out; sec. 3.3.2); where the registry lacks it or the profile never measured it, the measured
  row-wise scaled `gemm_fp8` stands in (`fp8_ops()` says which, and the step's assumption row repeats it);
- the quantisation kernels they need (sec. 3.3.2: activations in 1x128 tiles for the forward, 128x1 tiles for the
  wgrad's contraction over tokens): the forward quantises each GEMM input once (`fp8_quant_128`; GEMMs that
  read the same normalised sublayer input share one quantisation, `_input_of`); the backward quantises the
  output gradient dY for the dgrad (`fp8_quant_128`) and, for the wgrad, dY and the input X along the token axis
  (`fp8_quant_128_t`, the transposed 128x1 tiles; `fp8_quant_128` at the same bytes where it is not registered).
  Each is its own launch, not fused into the norm, SwiGLU or backward kernel before it (modelling choice: an upper
  bound on what quantisation costs a fused stack). Left out: casting the bf16 weights to 128x128-block e4m3 (and
  its transpose for the dgrad), done once per weight per optimizer step and cached over the micro-batches
  (Transformer Engine's `is_first_microbatch`), so a per-micro-batch cost would overcount it; and the routed
  experts' input is quantised here after the permute, on the (token, expert) rows, where DeepSeek-V3 quantises
  it once per token before the FP8 dispatch (sec. 3.3.3; over by the local top-k when that exceeds 1);
- routed experts: `moe_grouped_fp8` (row-wise scaled, measured at deployed shapes) for the forward, the dgrad at
  the transposed shape and the wgrad at the forward's, each times the block / row-wise ratio of the dense GEMMs at
  the same (rows, N, K) (`gemm_fp8_block` over `gemm_fp8`, both predicted; 1 where `gemm_fp8_block` is absent).
  torch has no block-scaled grouped GEMM on sm90 (the 20261202-1gpu-deployed README), so the grouped op is
  measured row-wise and the dense pair carries the block-scaling overhead over;
- stay in bf16 / fp32, as DeepSeek-V3 keeps them in their original precision for their sensitivity to
  low-precision arithmetic (sec. 3.3.1): the embedding, the output head (LM head), the MoE router / gating
  GEMM (so the fused latent-down + router GEMM splits into an FP8 latent down and a bf16 router), the
  normalisations, the attention cores (MLA's causal attention, KDA's chunk kernels and short conv) and the
  elementwise kernels; also every GEMM with N or K under one 128-wide scaling group (KDA's beta projection,
  one output per head: modelling choice, a block-scaled kernel pads it to a whole group and gains nothing), and
  every linear whose FP8 GEMMs and quantisations are predicted slower than its bf16 GEMMs (`_fp8_or_bf16`, per
  layer and shape with each shared input's quantisation paid once, `fp8_linears`; named per layer in
  `LayerCost.bf16_linears` and in the step's assumption row, `precision_assumption`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from k3sim.configs.model import ModelConfig
from k3sim.kernels.ops import COLLECTIVE_OPS, OPS, window_pairs
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call, Timer
from k3sim.step.glue import FUSED_GLUE_OPS, GlueCalibration, is_glue, load_glue
from k3sim.step.layers import embedding_calls, layer_calls, layer_signature, lm_head_calls
from k3sim.step.layout import StepLayout
from k3sim.step.modules import module_of

COLLECTIVES = COLLECTIVE_OPS  # the registry's collective kind: costed by the training step model, not here
SMALL_OP_BACKWARD_FACTOR = 2.0  # modelling choice, see the module docstring
PRECISIONS = ("bf16", "fp8")  # configs.planning.PRECISIONS

FP8_GROUP = 128  # channels per fp32 scale (DeepSeek-V3's 1x128 tiles; kernels.ops_decode.FP8_GROUP)
FP8_BLOCK_GEMM, FP8_ROWWISE_GEMM = "gemm_fp8_block", "gemm_fp8"
FP8_QUANT, FP8_QUANT_T = "fp8_quant_128", "fp8_quant_128_t"
FP8_GROUPED = "moe_grouped_fp8"
# GEMMs that stay bf16 under fp8 (DeepSeek-V3 sec. 3.3.1: output head, MoE gating modules)
HIGH_PRECISION_GEMMS = {"lm_head": "output head", "moe_router": "MoE gating",
                        "moe_latent_down+router": "MoE gating (fused with the latent down-projection)"}
# GEMMs of a layer that read the same tensor, the normalised input of their sublayer: the forward quantises it
# once, the wgrad transposes it once. `shared_inputs` finds them in a layer's calls (the GEMMs right after a
# pre-norm); these read it after another kernel ran (KDA's gates and beta after the short conv, the output
# gates after the core), which the calls alone do not show.
_PRE_NORM_INPUT = {"attn_norm": "attention input", "ffn_norm": "ffn input"}
_SHARED_INPUT = {**{c: "attention input" for c in ("kda_qkv_proj", "kda_decay_gate", "kda_decay_gate_a",
                                                   "kda_beta_proj", "kda_out_gate", "kda_out_gate_a",
                                                   "mla_q_proj", "mla_qkv_a_proj", "mla_out_gate",
                                                   "lightning_out_gate")},
                 **{c: "ffn input" for c in ("dense_gate_up", "dense_up", "moe_latent_down", "shared_experts_gate_up",
                                             "shared_experts_up")}}
# forward ops priced by a measured fwd+bwd op of another name: GQA / SWA prefill by the causal SDPA pair
GQA_PREFILL, SDPA_CAUSAL = "gqa_prefill_fwd", "sdpa_causal_fwd"


@dataclass(frozen=True)
class LayerCost:
    layer: int  # 0-based; -1 embedding, num_layers LM head
    kind: str  # "embedding" | the layer's mixer kinds (`ModelConfig.layer_kinds`: "kda", "gdn+...", "none") | "lm_head"
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    activation_bytes: float  # hidden state one GPU sends to the next stage for this micro-batch
    attn_res_block_bytes: float  # one AttnRes block representative for these tokens, per GPU
    # forward seconds of each recompute module present in the layer (`k3sim.step.modules`), part of forward_s
    module_forward_s: dict[str, float] = field(default_factory=dict, hash=False)
    # under fp8: the layer's linears kept in bf16 because their FP8 path is predicted slower at these shapes
    # (`fp8_linears`; the embedding, LM head and router are bf16 by rule and not listed)
    bf16_linears: tuple[str, ...] = ()

    @property
    def backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s


@dataclass(frozen=True)
class Fp8Ops:
    """The registry ops that price FP8 training and what stands in for a missing one."""

    gemm: str        # gemm_fp8_block, or gemm_fp8 (row-wise) standing in
    quant_t: str     # fp8_quant_128_t, or fp8_quant_128 at the same bytes
    notes: tuple[str, ...]

    @property
    def block(self) -> bool:
        return self.gemm == FP8_BLOCK_GEMM


PROBE_GEMM = {"M": 4096, "N": 4096, "K": 4096}  # any in-range shape: asks whether the profile measured an op
PROBE_QUANT = {"T": 4096, "D": 4096}


def _measured(timer: Timer, op: str, probe: dict) -> bool:
    """The profile answers `op` from measurements (its own or a source profile's), not the datasheet roofline
    the predictor falls back to for an op the profile never measured (a lower bound, `k3sim.predict`)."""
    return not timer.time(op, probe)[1].startswith("datasheet")


def fp8_ops(timer: Timer | None = None) -> Fp8Ops:
    """Which ops price the FP8 GEMMs and quantisations: the block-scaled ones where the registry has them and
    (given a `timer`) the profile measured them, else the measured stand-ins, said in `notes`. A registered but
    unmeasured block op would pit the datasheet roofline (a lower bound) against measured bf16 GEMMs."""
    from k3sim.kernels.ops import OPS

    notes = []

    def pick(op: str, fallback: str, probe: dict) -> str | None:
        if op not in OPS:
            return None
        if timer is not None and not _measured(timer, op, probe) and _measured(timer, fallback, probe):
            return None
        return op

    gemm = pick(FP8_BLOCK_GEMM, FP8_ROWWISE_GEMM, PROBE_GEMM) or FP8_ROWWISE_GEMM
    if gemm != FP8_BLOCK_GEMM:
        notes.append("the row-wise scaled gemm_fp8 stands in for the block-scaled GEMM (gemm_fp8_block is not "
                     "measured on this profile or not in the registry; the H200's cuBLAS blockwise _scaled_mm ran "
                     "slower than row-wise at five expert shapes, hardware_profiles/measured/h200/"
                     "20261202-1gpu-deployed/gemm_fp8_scaling.csv), and routed experts keep the row-wise grouped time")
    quant_t = pick(FP8_QUANT_T, FP8_QUANT, PROBE_QUANT) or FP8_QUANT
    if quant_t != FP8_QUANT_T:
        notes.append("the wgrad's transposed 128x1 quantisation is priced as fp8_quant_128 at the same bytes "
                     "(fp8_quant_128_t is not measured on this profile or not in the registry)")
    return Fp8Ops(gemm, quant_t, tuple(notes))


def precision_assumption(precision: str, hw: Any = None, kernel_time: Callable | None = None,
                         layer_costs: list[LayerCost] | None = None) -> list[dict]:
    """The step's assumption row for the GEMM precision on `hw` (none under bf16, the convention). Given the
    step's `layer_costs`, it names the linears kept in bf16 at their shapes (`LayerCost.bf16_linears`), so a
    reader sees which projections the FP8 figure does not speed up."""
    if precision != "fp8":
        return []
    ops = fp8_ops(None if hw is None else Timer(hw, kernel_time))
    kept = sorted({c for lc in layer_costs or () for c in lc.bf16_linears})
    slower = (f"these linears, whose FP8 path is predicted slower at this layout's shapes: {', '.join(kept)}"
              if kept else "any linear FP8 would make slower")
    what = (f"FP8 training: forward, dgrad and wgrad of every linear layer as {ops.gemm} plus fp8_quant_128 of "
            f"each GEMM input and output gradient and {ops.quant_t} of the wgrad operands; routed experts "
            f"{FP8_GROUPED}{' x the dense block / row-wise ratio' if ops.block else ''}; in bf16: embedding, LM "
            f"head, router, norms, attention cores and {slower}")
    return [{"assumption": what, "source": "DeepSeek-V3 arXiv 2412.19437 sec. 3.3; k3sim.step.training"
                                           + "".join(f"; {n}" for n in ops.notes)}]


def _call_costs(timer: Timer, call: Call, glue: GlueCalibration | None = None) -> tuple[float, float, float]:
    """(forward, backward input, backward weight) seconds of one call."""
    if call.op in COLLECTIVES:
        return 0.0, 0.0, 0.0
    if glue is not None and glue.fused and call.op in FUSED_GLUE_OPS:  # measured fused kernels (step.glue)
        return glue.fused_costs(timer, call)
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
    bwd = backward_op(call)
    if bwd is not None:
        op, q, share = bwd
        if op == call.op + "_bwd":
            return fwd, max(0.0, timer.time(op, q)[0] * call.count - fwd), 0.0
        both, alone = timer.time(op, q)[0], timer.time(op[:-len("_bwd")], q)[0]
        return fwd, max(0.0, both - alone) * share * call.count, 0.0
    if call.op.startswith("moe_grouped"):
        bi = timer.time(call.op, {**p, "K": p["N"], "N": p["K"]})[0]
        return fwd, bi * call.count, fwd
    return fwd, SMALL_OP_BACKWARD_FACTOR * fwd, 0.0


def backward_op(call: Call) -> tuple[str, dict, float] | None:
    """The measured forward+backward op that prices a core kernel's backward, its params and the share of it the
    call runs (1 but for a sliding window): `<op>_bwd` of a linear-attention, state-space or attention forward
    in the registry (`chunk_kda_fwd` -> `chunk_kda_fwd_bwd`, `chunk_gdn_fwd` -> `chunk_gdn_fwd_bwd`,
    `mamba2_chunk_fwd` -> `mamba2_chunk_fwd_bwd`, `sdpa_causal_fwd` -> `sdpa_causal_fwd_bwd`); GQA / SWA prefill
    (`gqa_prefill_fwd` {T, Hq, Hkv, D, window}) -> `sdpa_causal_fwd_bwd` at {T, H = Hq, D} (the module
    docstring), times the window's share of the causal pairs (`kernels.ops.window_pairs`). None for other ops."""
    p = call.params
    if call.op == GQA_PREFILL:
        T = p["T"]
        share = window_pairs(T, p["window"]) / window_pairs(T, T)
        return SDPA_CAUSAL + "_bwd", {"T": T, "H": p["Hq"], "D": p["D"]}, share
    spec = OPS.get(call.op + "_bwd")
    if spec is not None and spec.family in ("kda", "attention"):
        return call.op + "_bwd", dict(p), 1.0
    return None


def _input_of(component: str) -> str:
    """The tensor a GEMM reads after another kernel ran (`_SHARED_INPUT`), else its own (`shared_inputs` finds
    the GEMMs that read a pre-norm's output right after it)."""
    return _SHARED_INPUT.get(component, component)


def shared_inputs(calls: list[Call], hidden: int) -> list[str]:
    """The tensor each of a layer's `calls` reads, as a key shared by the GEMMs that read the same one: the GEMMs
    with K = hidden in the run of GEMMs right after a hidden-wide norm read its output (the sublayer's normalised
    input: "attention input" after attn_norm, "ffn input" after ffn_norm), the `_SHARED_INPUT` readers theirs,
    every other call its own component. Derived from the calls, so a mixer kind's input projections (GDN's
    in_proj, GQA's qkv, MoE's router and shared experts) need no list."""
    out, norm = [], None
    for c in calls:
        if c.op == "rmsnorm" and c.params.get("D") == hidden:
            norm = _PRE_NORM_INPUT.get(c.component, c.component)
        elif not c.op.startswith("gemm_") or c.params.get("K") != hidden:
            norm = None
        out.append(_SHARED_INPUT.get(c.component) or (norm if norm and c.op.startswith("gemm_") else c.component))
    return out


def fp8_eligible(call: Call) -> bool:
    """A linear layer's GEMM that may run in FP8 under `precision: fp8` (see the module docstring; it does where
    `_fp8_or_bf16` finds FP8 faster)."""
    if not call.op.startswith("gemm_") or call.component in HIGH_PRECISION_GEMMS:
        return False
    p = call.params
    return min(p["M"], p["N"], p["K"]) >= FP8_GROUP


def _quants(timer: Timer, ops: Fp8Ops, rows: int, n: int, k: int, first_read: bool) -> tuple[float, float, float]:
    """Quantisation seconds of one FP8 linear layer of `rows` tokens, input width k, output width n:
    forward X (1x128, once per input tensor), dgrad dY (1x128), wgrad dY and X (128x1, X once per tensor)."""
    q = lambda op, T, D: timer.time(op, {"T": T, "D": D})[0]  # noqa: E731
    x_f = q(FP8_QUANT, rows, k) if first_read else 0.0
    x_t = q(ops.quant_t, rows, k) if first_read else 0.0
    return x_f, q(FP8_QUANT, rows, n), q(ops.quant_t, rows, n) + x_t


def block_over_rowwise(timer: Timer, ops: Fp8Ops, m: int, n: int, k: int) -> float:
    """Block-scaled over row-wise FP8 GEMM time at one dense shape (both predicted), 1 without gemm_fp8_block:
    what block scaling adds to the row-wise grouped expert GEMMs."""
    if not ops.block:
        return 1.0
    p = {"M": m, "N": n, "K": k}
    return timer.time(FP8_BLOCK_GEMM, p)[0] / timer.time(FP8_ROWWISE_GEMM, p)[0]


def fp8_call_costs(timer: Timer, call: Call, ops: Fp8Ops, seen: set[str],
                   key: str | None = None) -> tuple[float, float, float]:
    """(forward, dgrad, wgrad) seconds of one FP8 linear layer (a dense GEMM call that `fp8_eligible` takes, or a
    grouped expert GEMM), its quantisations included; `seen`: the input tensors of this layer already
    quantised (updated); `key`: the tensor it reads (`shared_inputs`; None: `_input_of` its component)."""
    p, key = call.params, key or _input_of(call.component)
    first = key not in seen
    seen.add(key)
    if call.op.startswith("moe_grouped"):
        rows, n, k = p["B"] * p["topk"], p["N"], p["K"]
        t = lambda q: timer.time(FP8_GROUPED, q)[0]  # noqa: E731
        r_f, r_d = block_over_rowwise(timer, ops, rows, n, k), block_over_rowwise(timer, ops, rows, k, n)
        f = t(dict(p)) * r_f
        g = (f, t({**p, "K": n, "N": k}) * r_d, f)  # wgrad at the forward's shape, as in bf16
    else:
        rows, n, k = p["M"], p["N"], p["K"]
        t = lambda m_, n_, k_: timer.time(ops.gemm, {"M": m_, "N": n_, "K": k_})[0]  # noqa: E731
        g = (t(rows, n, k), t(rows, k, n), t(k, n, rows))
    qs = _quants(timer, ops, rows, n, k, first)
    return tuple((a + b) * call.count for a, b in zip(g, qs))


def call_forward(timer: Timer, call: Call, precision: str = "bf16") -> tuple[float, str]:
    """Forward seconds of one call under `precision` and what priced it ("op source"): the training step's
    routed-expert compute (`TrainingContext.expert_compute`), which EP imbalance and the EP fold stretch. A grouped
    expert GEMM under fp8 is `fp8_call_costs`' forward (its input quantisation included) where `_fp8_or_bf16`
    keeps it FP8; everything else is the call's own row."""
    if precision == "fp8" and call.op == "moe_grouped_bf16":  # its input is its own: decided alone
        ops = fp8_ops(timer)
        parts, fp8 = _fp8_or_bf16(timer, call, ops, set(), None)
        if fp8:
            return parts[0], f"{FP8_GROUPED} + {FP8_QUANT} (fp8 training)"
    row = timer.row(call, 0)
    return row.seconds, f"{row.op} {row.source}"


def _fp8_or_bf16(timer: Timer, call: Call, ops: Fp8Ops, seen: set[str],
                 glue: GlueCalibration | None, key: str | None = None) -> tuple[tuple[float, float, float], bool]:
    """(forward, dgrad, wgrad) seconds of a linear layer that may run in FP8, and whether it does: FP8 (its GEMMs
    and quantisations, `fp8_call_costs`) unless that is predicted slower than its bf16 GEMMs, which a stack then
    keeps (modelling choice, as Transformer Engine recipes leave modules out of fp8_autocast: the H200's
    measured cuBLAS block-scaled kernel pads K to a multiple of 512, so a 128-wide contraction takes about 3x its
    bf16 GEMM, hardware_profiles/measured/h200/20261202-1gpu-train-fp8*). `seen` gains the input only under FP8;
    `key`: the tensor the call reads (`fp8_call_costs`)."""
    trial = set(seen)
    fp8 = fp8_call_costs(timer, call, ops, trial, key)
    bf16 = _call_costs(timer, _as_bf16(call), glue)
    if sum(fp8) < sum(bf16):
        seen |= trial
        return fp8, True
    return bf16, False


def _as_bf16(call: Call) -> Call:
    """A linear layer's GEMM in bf16 (a serving checkpoint's fp8 weights do not make training's GEMMs fp8)."""
    return replace(call, op="gemm_bf16") if call.op.startswith("gemm_") else call


def training_head_calls(model: ModelConfig, layout: StepLayout, batch: Batch) -> list[Call]:
    """Final norm and LM head as training runs them: logits (and the loss) for every token, not one per
    sequence as a prefill step; no sampling."""
    head = [c for c in lm_head_calls(model, layout, batch) if c.component != "sampling"]
    return [Call(c.component, c.op, {**c.params, "M": batch.tokens}) if c.component == "lm_head" else c
            for c in head]


def fp8_candidate(call: Call) -> bool:
    """A call `precision: fp8` may run in FP8: a dense linear `fp8_eligible` takes, or a grouped expert GEMM."""
    return fp8_eligible(call) or call.op == "moe_grouped_bf16"


def fp8_linears(timer: Timer, calls: list[Call], ops: Fp8Ops, glue: GlueCalibration | None,
                keys: list[str] | None = None) -> set[int]:
    """Indices of the `calls` (one layer's) that run in FP8 (`_fp8_or_bf16`), decided so that a shared input's
    quantisation is paid once and by no reader in particular: first each candidate alone (its input quantised
    for it), then every other reader of an input some FP8 reader quantises anyway, with that quantisation free.
    Deciding in call order would charge the whole shared quantisation to the first reader (K3's latent
    down-projection, N = 448, before the shared experts' gate/up) and keep it bf16 although the shared experts
    quantise the same tensor. An input that no reader would quantise alone stays bf16 for all of them
    (modelling choice: readers that pay off only jointly are not searched for). `keys`: the tensor each call
    reads (`shared_inputs`; None: `_input_of` each component)."""
    keys = keys or [_input_of(c.component) for c in calls]
    cands = [i for i, c in enumerate(calls) if fp8_candidate(c)]
    alone = {i for i in cands if _fp8_or_bf16(timer, calls[i], ops, set(), glue, keys[i])[1]}
    quantised = {keys[i] for i in alone}
    joined = {i for i in cands if i not in alone and keys[i] in quantised
              and _fp8_or_bf16(timer, calls[i], ops, {keys[i]}, glue, keys[i])[1]}
    return alone | joined


def _sum(timer: Timer, calls: list[Call], glue: GlueCalibration | None, precision: str = "bf16",
         hidden: int | None = None) -> tuple[tuple[float, float, float], dict[str, float], tuple[str, ...]]:
    """(forward, backward input, backward weight) seconds of a call list, the forward seconds of each
    recompute module among them, and (fp8) the linears kept in bf16 because FP8 is predicted slower at their
    shapes (`fp8_linears`). `hidden`: the model width, to find the GEMMs sharing a pre-norm's output
    (`shared_inputs`); None: by component (`_input_of`)."""
    f = bi = bw = 0.0
    modules: dict[str, float] = {}
    ops = fp8_ops(timer) if precision == "fp8" else None
    keys = shared_inputs(calls, hidden) if hidden else [_input_of(c.component) for c in calls]
    fp8 = fp8_linears(timer, calls, ops, glue, keys) if ops is not None else set()
    seen: set[str] = set()
    for i, c in enumerate(calls):
        if i in fp8:
            a, b, w = fp8_call_costs(timer, c, ops, seen, keys[i])
        else:
            a, b, w = _call_costs(timer, _as_bf16(c), glue)
        f, bi, bw = f + a, bi + b, bw + w
        mod = module_of(c.component)
        if mod is not None:
            modules[mod] = modules.get(mod, 0.0) + a
    kept = tuple(c.component for i, c in enumerate(calls) if ops is not None and fp8_candidate(c) and i not in fp8)
    return (f, bi, bw), modules, kept


def training_layer_costs(model: ModelConfig, hw: Any, *, tp: int = 1, ep: int = 1, cp: int = 1,
                         tokens: int, seq_len: int, kernel_time: Callable | None = None,
                         expert_kernel: str = "grouped_bf16", glue: GlueCalibration | None = None,
                         precision: str = "bf16") -> list[LayerCost]:
    """Per-layer compute of one micro-batch of `tokens` tokens in sequences of `seq_len`, on one GPU of
    a TP x EP (x CP) stage. Under CP each GPU holds seq_len / cp tokens of each sequence (the CP
    exchange itself is the CP model's). Routed experts in grouped GEMMs, bf16 or (precision fp8) FP8
    (`expert_kernel` to change the bf16 kernel). `glue`: None = the profile's glue calibration. `precision`:
    "bf16" or "fp8" (the module docstring); the caller checks that the profile has FP8."""
    if tokens < 1 or seq_len < 1 or tokens % seq_len:
        raise ValueError(f"tokens={tokens} must be a positive multiple of seq_len={seq_len}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    # under fp8 the router stays bf16, so it cannot share the latent down-projection's FP8 GEMM
    layout = StepLayout(tp=tp, ep=ep, expert_kernel=expert_kernel, fuse_router=precision == "bf16")
    timer = Timer(hw, kernel_time, "graph")
    glue = load_glue(hw) if glue is None else glue
    local = max(1, seq_len // cp)
    batch = Batch(prefill=((local, 0),) * (tokens // seq_len))
    d = model.hidden_size
    act = batch.tokens * d * BF16 / tp  # sequence-parallel shard of the hidden state
    emb = _sum(timer, embedding_calls(model, batch), glue, precision)
    out = [LayerCost(-1, "embedding", *emb[0], act, 0.0, emb[1], emb[2])]
    memo: dict[tuple, tuple[tuple[float, float, float], dict[str, float], tuple[str, ...]]] = {}
    blk = act if model.attn_res_block_size else 0.0
    for i in range(model.num_layers):
        sig = layer_signature(model, i)
        if sig not in memo:
            memo[sig] = _sum(timer, layer_calls(model, i, layout, batch, expert_kernel), glue, precision, d)
        costs, mods, kept = memo[sig]
        out.append(LayerCost(i, model.layer_kinds[i], *costs, act, blk, dict(mods), kept))
    head = _sum(timer, training_head_calls(model, layout, batch), glue, precision)
    out.append(LayerCost(model.num_layers, "lm_head", *head[0], 0.0, 0.0, head[1], head[2]))
    return out
