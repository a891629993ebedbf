"""Decode: time per output token, tokens/s per GPU and what bounds a decode step, for every layer kind;
speculative decoding with MTP drafts (snapshot vs replay rollback of every recurrent kind's state,
`k3sim.decode.rollback`; attention kinds truncate their KV). See DEVELOPING.md (Contracts > Decode)."""

from k3sim.decode.model import DecodeResult, decode_step, max_batch, mtp_draft_seconds
from k3sim.decode.mtp import SpecConfig, accepted_tokens_per_step, expected_tokens_per_step

__all__ = ["DecodeResult", "SpecConfig", "accepted_tokens_per_step", "decode_step", "expected_tokens_per_step",
           "max_batch", "mtp_draft_seconds"]
