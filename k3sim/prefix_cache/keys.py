"""Prefix keys at an engine's block size, including blocks that are not a multiple of a trace's hash-id block.

vLLM inflates its attention block to 1,056 or 4,128 tokens for hybrid models (`engines.vllm_block_tokens`); a
Mooncake trace names 512-token blocks. The key of an engine block k (its first (k+1) x B tokens) is then the
trace id of the first 512-token block that ends at or after (k+1) x B: two prompts with that id share at least
(k+1) x B tokens, so a match is never invented (it may be missed when two prompts diverge between the block end
and that id's end: the trace does not say where inside a 512-token block they part). A block whose proving id
would be the prompt's partial last id has no key (the trace holds complete 512-token blocks only). Several
engine blocks can be proved by one id (B < 512): each key is tagged with its block index, so keys stay distinct.
Multiples of the trace block, and token-level workloads, are `workloads.request.prefix_keys`'s.
"""

from __future__ import annotations

from k3sim.workloads.request import TraceRequest, prefix_keys

_INDEX_BITS = 24  # block index inside a tagged key (a prompt of 2^24 blocks is beyond every bound)


def block_keys(request: TraceRequest, block_tokens: int) -> list[int]:
    """Chained keys of the request's complete `block_tokens`-token blocks that the trace can prove."""
    unit = request.block_tokens
    if request.tokens is not None or block_tokens % unit == 0:
        return prefix_keys(request, block_tokens)
    ids = request.block_ids or ()
    full_ids = min(len(ids), request.input_tokens // unit)
    keys: list[int] = []
    for k in range(request.input_tokens // block_tokens):
        j = -(-(k + 1) * block_tokens // unit) - 1  # the first trace block ending at or after the block's end
        if j >= full_ids:
            break
        keys.append((ids[j] << _INDEX_BITS) | k)
    return keys
