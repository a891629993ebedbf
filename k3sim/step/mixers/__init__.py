"""The sequence mixers of a step: one call builder per mixer kind (`k3sim.configs.kinds.MIXERS`), one module each.

`MIXER_CALLS[kind]` is the kind's `MixerCalls` (its body of calls, core components, per-chunk and
context-dependent components, borrowed kernels); `mixer_calls` builds a layer's whole mixer sublayer from the
layer's mixer kinds: the input RMSNorm, each mixer's body (several run in parallel on the same normed input, as
Falcon-H1's attention + Mamba2, their outputs summed), the residual add and, under TP, one all-reduce per
mixer's row-parallel output projection (vLLM reduces each RowParallelLinear's output; Falcon-H1's two branches
are two). A new kind is one module here with its `CALLS`, listed in `_BUILDERS`
(tests/step/test_mixers.py checks that every registered kind has one).
"""

from __future__ import annotations

from typing import Iterator, Sequence

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import Call
from k3sim.step.layout import StepLayout
from k3sim.step.mixers import gdn, gqa, kda, lightning, mamba, mamba2, mla
from k3sim.step.mixers.common import MixerCalls, residual, rmsnorm, tp_all_reduce

_BUILDERS = (kda.CALLS, mla.CALLS, gdn.CALLS, mamba2.CALLS, mamba.CALLS, lightning.CALLS, gqa.GQA_CALLS,
             gqa.SWA_CALLS)
MIXER_CALLS: dict[str, MixerCalls] = {b.kind: b for b in _BUILDERS}


def _union(attr: str) -> tuple[str, ...]:
    out: list[str] = []
    for b in _BUILDERS:
        out += [c for c in getattr(b, attr) if c not in out]
    return tuple(out)


# Components the serving fast path re-times per prefill chunk, and those that grow with the decode context
# (`serving.stepcost`; CONTRACTS: `step.layers.PER_CHUNK` / `DECODE_CONTEXT`).
PER_CHUNK = _union("per_chunk")
DECODE_CONTEXT = _union("decode_context")
# Every kind's core components (recurrent step, chunked prefill, attention) with the limiter's category.
CORE_CATEGORY: dict[str, str] = {c: cat for b in _BUILDERS for c, cat in b.core.items()}
CORE = tuple(CORE_CATEGORY)
# The measured op a kind without its own kernel borrows, per component (the step labels those rows with it).
PROXY_NOTES: dict[str, str] = {c: note for b in _BUILDERS for c, note in b.proxies.items()}


def mixer_calls(model: ModelConfig, kinds: Sequence[str], layout: StepLayout, batch: Batch) -> Iterator[Call]:
    """The mixer sublayer of a layer whose mixers are `kinds` (none: nothing), for `batch` on one GPU of
    `layout`: input norm, each mixer's body, the sum of parallel mixers' outputs, residual, TP all-reduces."""
    if not kinds:
        return
    M, d, t = batch.tokens, model.hidden_size, layout.tp
    yield rmsnorm("attn_norm", M, d)
    for kind in kinds:
        yield from MIXER_CALLS[kind].body(model, layout, batch)
    for _ in kinds[1:]:
        yield residual("mixer_sum", M, d)
    yield residual("attn_residual", M, d)
    if t > 1:
        for _ in kinds:
            yield tp_all_reduce(M, d, t)
