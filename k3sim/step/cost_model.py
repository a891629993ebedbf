"""`StepCostModel`: the step time a simulator asks for thousands of times, memoised.

A serving engine's steps differ in the number of decoding sequences, their summed context and the prefill
chunks they carry. The step model depends on the decode contexts only through their mean (MLA attention
streams the mean context's KV per sequence; KDA state is context-free), so the key is (decode count,
mean context bucketed to 1/64 of an octave (1.1 %), prefill chunks with their prefixes bucketed likewise).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import Timer
from k3sim.step.forward import StepResult, forward_step
from k3sim.step.layout import StepLayout

BUCKETS_PER_OCTAVE = 64  # modelling choice: 1.1 % context resolution; step time is smooth in context


def bucket(x: float) -> int:
    """Round up to the next of 64 geometric buckets per octave (exact below 64 tokens)."""
    if x <= 64:
        return int(math.ceil(x))
    e = math.ceil(math.log2(x) * BUCKETS_PER_OCTAVE) / BUCKETS_PER_OCTAVE
    return int(round(2 ** e))


class StepCostModel:
    def __init__(self, model: ModelConfig, hw: Any, layout: StepLayout, kernel_time: Callable | None = None):
        self.model, self.hw, self.layout = model, hw, layout.for_hardware(hw)
        self.timer = Timer(hw, kernel_time, self.layout.convention)
        self._memo: dict[tuple, float] = {}

    def batch(self, num_decode: int, decode_context_sum: float,
              prefill: Sequence[tuple[int, int]] = (), tokens_per_decode: int = 1) -> Batch:
        ctx = bucket(decode_context_sum / num_decode) if num_decode else 0
        pre = tuple((int(c), bucket(p) if p else 0) for c, p in prefill)
        return Batch((ctx,) * num_decode, pre, tokens_per_decode)

    def step_seconds(self, num_decode: int = 0, decode_context_sum: float = 0.0,
                     prefill: Sequence[tuple[int, int]] = (), tokens_per_decode: int = 1) -> float:
        """Seconds of one engine step (one token's path through all PP stages)."""
        b = self.batch(num_decode, decode_context_sum, prefill, tokens_per_decode)
        key = (b.num_decode, b.decode_contexts[:1], b.prefill, tokens_per_decode)
        hit = self._memo.get(key)
        if hit is None:
            if not b.tokens:
                return 0.0
            hit = self._memo[key] = forward_step(self.model, self.hw, self.layout, b, timer=self.timer).seconds
        return hit

    def breakdown(self, num_decode: int = 0, decode_context_sum: float = 0.0,
                  prefill: Sequence[tuple[int, int]] = (), tokens_per_decode: int = 1) -> StepResult:
        b = self.batch(num_decode, decode_context_sum, prefill, tokens_per_decode)
        return forward_step(self.model, self.hw, self.layout, b, timer=self.timer)
