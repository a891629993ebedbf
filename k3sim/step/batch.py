"""The token work of one engine step: decoding sequences and prefill chunks, per attention-DP rank."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    """decode_contexts: the context length (tokens already cached) of each decoding sequence;
    prefill: (chunk_tokens, cached_prefix_tokens) of each prefill chunk in the step;
    tokens_per_decode: tokens each decoding sequence feeds this step (1; n+1 when verifying n MTP drafts).
    """

    decode_contexts: tuple[int, ...] = ()
    prefill: tuple[tuple[int, int], ...] = ()
    tokens_per_decode: int = 1

    @property
    def num_decode(self) -> int:
        return len(self.decode_contexts)

    @property
    def decode_tokens(self) -> int:
        return self.num_decode * self.tokens_per_decode

    @property
    def prefill_tokens(self) -> int:
        return sum(c for c, _ in self.prefill)

    @property
    def tokens(self) -> int:
        """Tokens through the dense parts (projections, experts) this step."""
        return self.decode_tokens + self.prefill_tokens

    @property
    def sequences(self) -> int:
        return self.num_decode + len(self.prefill)

    @property
    def mean_decode_context(self) -> float:
        return sum(self.decode_contexts) / self.num_decode if self.num_decode else 0.0

    @staticmethod
    def decode(batch: int, context: int, tokens_per_decode: int = 1) -> "Batch":
        return Batch(decode_contexts=(context,) * batch, tokens_per_decode=tokens_per_decode)
