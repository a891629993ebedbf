"""Speculative decoding with MTP drafts: what verifying n drafts costs, and how a recurrent state rolls back.

A verify step feeds n + 1 tokens per sequence (the last accepted token and n drafts). Softmax-attention
layers (MLA, GQA, SWA) just append KV and truncate on rejection; a recurrent layer's state (KDA, GDN,
Mamba2, Mamba, lightning) has already advanced through the rejected tokens, so it must be restored
(MISSION sec. 1). Two schemes, priced per kind by `k3sim.decode.rollback`:

- snapshot: the verify writes a copy of the state (and of the short-conv window) after every verified
  position, and rollback points the sequence at the accepted one. State writes grow with n. This is what
  the engines run for Mamba2 and Gated DeltaNet: SGLang's and TensorRT-LLM's Mamba pools keep per-draft-token
  "intermediate" SSM states and conv windows (`intermediate_ssm_state_cache`, `intermediate_conv_window`;
  TensorRT-LLM `MambaCacheManager._update_speculative_mamba_states` copies the accepted one back), and
  vLLM's GDN verify writes the state of every position into its own slot (`fused_recurrent_gated_delta_rule`
  with a per-token `ssm_state_indices` row and `num_accepted_tokens`, vllm/model_executor/models/qwen3_next.py).
- replay (K3, as ReplaySSM): only the drafts' projected inputs (the recurrence's inputs: a few KB per token
  and layer) are cached; the next step's kernel loads the persisted state, replays the accepted tokens on
  chip, persists that state once, then runs the new tokens without persisting. One state read and one
  state write per step whatever n is, over a + n + 1 tokens (a accepted last step).

Verify latency against n is therefore a model output: sub-linear for replay (fixed state traffic, the
per-token serial step grows), above it for snapshots.

Every model verifies the same way: n + 1 tokens per sequence through every layer (`Batch.tokens_per_decode`;
MLA folds them into its head axis, as FlashMLA folds seqlen_q). What differs is rollback: softmax layers
truncate their KV on rejection at no cost; only recurrent layers pay snapshot or replay.

Acceptance: each draft is accepted with probability `acceptance` given all earlier ones were (the usual
chain model); the bonus token from the verify is always kept, so a step yields
E = sum_{i=0}^{n} a^i = (1 - a^{n+1}) / (1 - a) tokens (n + 1 at a = 1): Leviathan, Kalman and Matias,
"Fast Inference from Transformers via Speculative Decoding" (arXiv 2211.17192, eq. 1; there with i.i.d.
per-token acceptance alpha, which gives the same sum as a per-position conditional acceptance). DeepSeek-V3
reports 85-90 % acceptance of its one MTP draft (arXiv 2412.19437 sec. 5.4.3: 1.8x tokens per second).
`accepted_tokens_per_step` is the one formula; decode and serving both read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROLLBACKS = ("snapshot", "replay")


def accepted_tokens_per_step(mtp: int, acceptance: float) -> float:
    """Expected tokens a sequence advances per verification step with `mtp` drafts, each accepted with
    probability `acceptance` given the earlier ones were: 1 + a + a^2 + ... + a^mtp = (1 - a^(mtp+1)) / (1 - a)
    (arXiv 2211.17192 eq. 1); 1 with no drafts, mtp + 1 at a = 1."""
    if isinstance(mtp, bool) or int(mtp) != mtp or mtp < 0 or not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"mtp must be an integer >= 0 and acceptance in [0, 1], got {mtp!r}, {acceptance!r}")
    mtp = int(mtp)
    return float(mtp + 1) if acceptance == 1.0 else (1.0 - acceptance ** (mtp + 1)) / (1.0 - acceptance)


expected_tokens_per_step = accepted_tokens_per_step  # the earlier name, kept: one formula under two names


@dataclass(frozen=True)
class SpecConfig:
    depth: int  # n draft tokens per step
    acceptance: float  # per-draft acceptance probability
    rollback: str = "replay"

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("MTP depth must be >= 1")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError("acceptance must be in [0, 1]")
        if self.rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {', '.join(ROLLBACKS)}")

    @property
    def tokens_per_step(self) -> float:
        return accepted_tokens_per_step(self.depth, self.acceptance)

    def recurrent_tokens_per_sequence(self) -> int:
        """Tokens a recurrent layer's verify walks per sequence: n + 1, plus the replayed accepted tokens of
        the previous step (rounded up) under replay. The same for every recurrent kind."""
        if self.rollback == "snapshot":
            return self.depth + 1
        return self.depth + 1 + max(0, math.ceil(self.tokens_per_step - 1.0))

    def kda_tokens_per_sequence(self) -> int:
        """The earlier name of `recurrent_tokens_per_sequence` (one rule under two names)."""
        return self.recurrent_tokens_per_sequence()

    def extra_state_writes(self) -> int:
        """State copies written per sequence and layer beyond the one a plain step writes."""
        return self.depth if self.rollback == "snapshot" else 0
