"""MTP rollback per layer kind: what restoring a recurrent state after a rejected draft costs, per GPU.

Every recurrent kind of the registry (`k3sim.configs.kinds.MIXERS[kind].recurrent`: KDA, GDN, Mamba2, Mamba,
lightning) pays one of the two schemes of `k3sim.decode.mtp`; attention kinds (MLA, GQA, SWA) truncate their
KV cache and pay nothing. Per sequence and layer, on one TP rank (`tp` shards as the memory model shards):

- snapshot: the verify keeps a copy of the layer's state (`MixerKind.state_bytes(cfg, tp)`) and of its
  short-conv window (`conv_state_bytes`) per verified position: n copies of each beyond the one a plain step
  persists (`snapshot_bytes_per_sequence`; SGLang / TensorRT-LLM `intermediate_ssm_state_cache` and
  `intermediate_conv_window`, vLLM's per-token state slots: `k3sim.decode.mtp`). Priced as HBM write
  traffic (a write-only stream of X bytes moves what a copy, read + write, of X / 2 bytes moves), less the
  states the verify's own recurrent calls already persist: a one-token op walked as n + 1 sequential calls
  writes every position's state itself, so a one-token kind's snapshot adds only its conv windows
  (`kind_rollback`).
- replay: the verify writes the recurrence's projected inputs of its n + 1 tokens and the next step reads
  them back (2 (n + 1) x `projected_input_elements` x the activation dtype), and the recurrence walks the
  previous step's accepted tokens again (`SpecConfig.recurrent_tokens_per_sequence`). The conv window rolls
  back by reading it at the accepted offset (vLLM's `causal_conv1d_update` with `num_accepted_tokens` keeps
  (kernel - 1) + n inputs), which the conv update's own row covers; no copy is priced for it.

Projected inputs per token (what the recurrence reads; the output gate z is applied after it and is not
cached), per rank:
- KDA: q, k and the per-channel decay g (heads x d_k each), v (heads x d_v), beta (one per head).
- GDN (HF Qwen3NextGatedDeltaNet): q, k (key heads x d_k each), v (value heads x d_v), beta and the decay g
  (one per value head each).
- Mamba2 (HF NemotronHMamba2Mixer): x (heads x head_dim), B and C (groups x d_state each; a single group is
  held whole by every rank), dt (one per head).
- Mamba (HF JambaMambaMixer): x and dt (d_inner each, after dt_proj), B and C (d_state each, from the
  row-parallel x_proj: whole on every rank).
- lightning (HF MiniMaxLightningAttention): q, k, v (heads x head_dim each); its decay is a fixed slope per
  head, not an input.

Re-running the accepted tokens is priced with the kind's own recurrent decode call, the step model's
component `<kind>_recurrent` (`k3sim.step.layers.layer_calls`), at the right token count: an op with a
token axis (`recurrent_kda_decode` has T: fla's fused_recurrent loops over the tokens in-kernel, the state
read and written once) is called at T tokens; a one-token op (`recurrent_gdn_decode`, `mamba2_decode`, and
whatever op the step borrows for Mamba and lightning) walks T tokens as T sequential calls at the batch's
B rows. Not B x T rows: the T tokens of one sequence are a chain (token t + 1 reads the state token t wrote),
so they cannot be T independent rows of one launch, which would read T states in parallel and price a small,
latency-bound batch at one launch for T dependent steps. T sequential calls is what an engine holding only
the single-step kernel runs (the step model prices the n + 1-token verify of these kinds the same way), and
an upper bound of a fused multi-token kernel (which keeps the state on chip between tokens); on the H200
registry the multi-token KDA kernel at B = 64, 16 heads grows 4.1x from T = 1 to 8 (46 -> 188 us) where 8
sequential calls grow 8x. So replay of a one-token kind is priced high, and above its snapshot: without a
fused multi-token kernel every walked token persists the state anyway, and replay only adds work.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from k3sim.configs.dtypes import bytes_per_element
from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import ModelConfig
from k3sim.decode.mtp import SpecConfig
from k3sim.step import Batch, StepLayout
from k3sim.step.calls import Call, StepComponent, Timer


def _kda_inputs(cfg: Any, tp: int) -> int:
    h = cfg.num_heads // tp
    return h * (3 * cfg.head_dim_k + cfg.head_dim_v + 1)


def _gdn_inputs(cfg: Any, tp: int) -> int:
    hk, hv = cfg.num_key_heads // tp, cfg.num_value_heads // tp
    return 2 * hk * cfg.head_dim_k + hv * cfg.head_dim_v + 2 * hv


def _mamba2_inputs(cfg: Any, tp: int) -> int:
    h = cfg.num_heads // tp
    groups = MIXERS["mamba2"].tp_rules(cfg)[1].per_rank(tp)
    return h * cfg.head_dim + 2 * groups * cfg.state_size + h


def _mamba_inputs(cfg: Any, tp: int) -> int:
    return 2 * (cfg.inner_size // tp) + 2 * cfg.state_size


def _lightning_inputs(cfg: Any, tp: int) -> int:
    return 3 * (cfg.num_heads // tp) * cfg.head_dim


# Elements of the recurrence's inputs per token and layer on one rank, per recurrent kind (module docstring).
PROJECTED_INPUTS: dict[str, Callable[[Any, int], int]] = {
    "kda": _kda_inputs, "gdn": _gdn_inputs, "mamba2": _mamba2_inputs, "mamba": _mamba_inputs,
    "lightning": _lightning_inputs}


def projected_input_elements(kind: str, cfg: Any, tp: int = 1) -> int:
    """Elements of the projected inputs one token feeds one `kind` layer's recurrence on one TP rank."""
    try:
        return PROJECTED_INPUTS[kind](cfg, tp)
    except KeyError:
        raise ValueError(f"no projected-input widths for recurrent kind {kind!r}: add it to "
                         "k3sim.decode.rollback.PROJECTED_INPUTS") from None


def projection_cache_bytes_per_token(model: ModelConfig, kind: str, tp: int = 1) -> int:
    """Bytes of one token's projected inputs of one `kind` layer on one rank, in the activation dtype."""
    elements = projected_input_elements(kind, model.section(kind), tp)
    return int(round(elements * bytes_per_element(model.activation_dtype)))


def snapshot_bytes_per_sequence(model: ModelConfig, kind: str, tp: int, depth: int) -> tuple[int, int]:
    """(state, conv-window) bytes the snapshot scheme writes beyond a plain step, per sequence and `kind`
    layer on one rank: `depth` extra copies of each."""
    mk, cfg = MIXERS[kind], model.section(kind)
    return depth * mk.state_bytes(cfg, tp), depth * mk.conv_state_bytes(cfg, tp)


def replay_cache_bytes_per_sequence(model: ModelConfig, kind: str, tp: int, depth: int) -> int:
    """Bytes of the replay scheme's projected-input cache per sequence and `kind` layer on one rank: the
    n + 1 verified tokens' inputs written in the verify and read back in the next step's replay."""
    return 2 * (depth + 1) * projection_cache_bytes_per_token(model, kind, tp)


def recurrent_kinds(model: ModelConfig) -> tuple[str, ...]:
    """The model's mixer kinds that keep a recurrent state (registry order)."""
    return tuple(k for k in model.mixer_kinds if MIXERS[k].recurrent)


def recurrent_call(model: ModelConfig, kind: str, layout: StepLayout, num_decode: int, tokens: int,
                   expert_kernel: str) -> Call:
    """The `kind` recurrent decode call for `num_decode` sequences walking `tokens` tokens each: the step's
    own `<kind>_recurrent` call at one token per sequence, with T = `tokens` where its op has a token axis,
    else `tokens` sequential calls (module docstring says why not B x T rows)."""
    from k3sim.kernels.ops import OPS
    from k3sim.step.layers import layer_calls

    layer = next(ly.index for ly in model.layers if kind in ly.mixers)
    want = f"{kind}_recurrent"
    calls = [c for c in layer_calls(model, layer, layout, Batch.decode(num_decode, 1), expert_kernel)
             if c.component == want]
    if len(calls) != 1:
        raise ValueError(f"the step model's layer {layer} has {len(calls)} {want!r} calls, expected one")
    call = calls[0]
    if call.op in OPS and "T" in OPS[call.op].params:
        return replace(call, params={**call.params, "T": tokens})
    return replace(call, count=call.count * tokens)


@dataclass
class KindRollback:
    """One mixer kind's rollback in a decode step, per GPU (every stage's layers of the kind summed)."""

    kind: str
    layers: int
    scheme: str  # "snapshot" | "replay" | "kv-truncate"
    state_bytes_per_sequence: int = 0  # one layer, one rank
    conv_state_bytes_per_sequence: int = 0
    state_copies_in_verify_per_sequence: int = 0  # states the verify's recurrent call itself persists
    state_copies_added_per_sequence: int = 0  # snapshot: the further state copies priced (n + 1 less those)
    snapshot_bytes_per_step: float = 0.0  # added state + conv-window writes, every layer of the kind
    projection_cache_bytes_per_token: int = 0  # one layer, one rank
    projection_cache_bytes_per_step: float = 0.0  # written + read, every layer of the kind
    recurrent_tokens_per_sequence: int | None = None  # tokens the recurrence walks per sequence (replay adds)
    replay_seconds_per_step: float = 0.0  # the accepted tokens walked again, every layer of the kind
    seconds_per_step: float = 0.0  # everything this kind's rollback adds to the step

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _copy_call(component: str, nbytes: float) -> Call:
    # a write-only stream of X bytes moves what a copy (read + write) of X / 2 bytes moves
    return Call(component, "hbm_copy", {"bytes": max(1, int(nbytes / 2))}, proxy_bytes=nbytes)


def _stage_counts(model: ModelConfig, layout: StepLayout, kind: str) -> list[int]:
    layers = model.layers
    return [sum(kind in layers[i].mixers for i in ls) for ls in layout.stage_layers(model.num_layers)]


def _add(rows: list[StepComponent], stage_s: list[float], per_layer: StepComponent, counts: list[int],
         component: str) -> float:
    """Add one layer's row `per_layer` for every layer of each stage; returns the seconds added."""
    total = 0.0
    for s, n in enumerate(counts):
        if n:
            stage_s[s] += n * per_layer.seconds
            total += n * per_layer.seconds
            rows.append(StepComponent(component, per_layer.op, n * per_layer.bytes, n * per_layer.flop,
                                      n * per_layer.seconds, per_layer.source, s, n))
    return total


def _replay_delta(model: ModelConfig, kind: str, layout: StepLayout, batch: int, verify: int, walked: int,
                  expert_kernel: str, timer: Timer) -> StepComponent:
    """One layer's extra recurrent work of replay: the call at `walked` tokens less the call at `verify`."""
    more = timer.row(recurrent_call(model, kind, layout, batch, walked, expert_kernel), 0)
    base = timer.row(recurrent_call(model, kind, layout, batch, verify, expert_kernel), 0)
    return StepComponent(f"{kind}_replay_accepted", more.op, more.bytes - base.bytes, more.flop - base.flop,
                         more.seconds - base.seconds, more.source)


def kind_rollback(model: ModelConfig, kind: str, layout: StepLayout, batch: int, spec: SpecConfig,
                  expert_kernel: str, timer: Timer, stage_s: list[float], rows: list[StepComponent]) -> KindRollback:
    """Price one recurrent kind's rollback for `batch` sequences, adding its rows and seconds to the stages.

    Snapshot keeps n + 1 states per sequence (one per verified position); the verify's own recurrent call
    already persists `count` of them (a fused multi-token call, KDA's: one; a one-token op walked as n + 1
    sequential calls: every one, each in-place update written to its position's slot, as vLLM's per-token
    `ssm_state_indices`), so only the rest are added as copies. The conv window is updated once per verify
    (`conv1d_update`), so its n copies are always added."""
    tp, n = layout.tp, spec.depth
    counts = _stage_counts(model, layout, kind)
    mk, cfg = MIXERS[kind], model.section(kind)
    out = KindRollback(kind, sum(counts), spec.rollback, mk.state_bytes(cfg, tp), mk.conv_state_bytes(cfg, tp),
                       recurrent_tokens_per_sequence=spec.recurrent_tokens_per_sequence())
    persisted = int(recurrent_call(model, kind, layout, batch, n + 1, expert_kernel).count)
    out.state_copies_in_verify_per_sequence = persisted
    if spec.rollback == "snapshot":
        out.state_copies_added_per_sequence = max(0, n + 1 - persisted)
        state = out.state_copies_added_per_sequence * out.state_bytes_per_sequence
        conv = n * out.conv_state_bytes_per_sequence
        for component, nbytes in ((f"{kind}_state_snapshots", state), (f"{kind}_conv_state_snapshots", conv)):
            if nbytes > 0:
                out.seconds_per_step += _add(rows, stage_s, timer.row(_copy_call(component, batch * nbytes), 0),
                                             counts, component)
                out.snapshot_bytes_per_step += batch * nbytes * out.layers
        return out
    out.projection_cache_bytes_per_token = projection_cache_bytes_per_token(model, kind, tp)
    cache = batch * replay_cache_bytes_per_sequence(model, kind, tp, n)
    comp = f"{kind}_projection_cache"
    out.seconds_per_step += _add(rows, stage_s, timer.row(_copy_call(comp, cache), 0), counts, comp)
    out.projection_cache_bytes_per_step = cache * out.layers
    walked = out.recurrent_tokens_per_sequence
    if walked != n + 1:
        delta = _replay_delta(model, kind, layout, batch, n + 1, walked, expert_kernel, timer)
        out.replay_seconds_per_step = _add(rows, stage_s, delta, counts, delta.component)
        out.seconds_per_step += out.replay_seconds_per_step
    return out


def rollback(model: ModelConfig, layout: StepLayout, batch: int, spec: SpecConfig, expert_kernel: str,
             timer: Timer, stage_s: list[float], rows: list[StepComponent]) -> list[KindRollback]:
    """Every mixer kind's rollback (registry order): recurrent kinds priced by `kind_rollback`, attention
    kinds listed as "kv-truncate" at no cost."""
    out = []
    for kind in model.mixer_kinds:
        if MIXERS[kind].recurrent:
            out.append(kind_rollback(model, kind, layout, batch, spec, expert_kernel, timer, stage_s, rows))
        else:
            out.append(KindRollback(kind, model.num_layers_with(kind), "kv-truncate"))
    return out
