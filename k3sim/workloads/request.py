"""One request of a workload, and its chained prefix keys at a chosen hash-block size."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from k3sim.errors import InputError


@dataclass(slots=True)
class TraceRequest:
    """A request as the cache sees it.

    Exactly one of `block_ids` / `tokens` carries the prompt's content:
    - `block_ids`: chained ids of `block_tokens`-token blocks (Mooncake: 512); equal id at index i means equal
      first (i+1)*block_tokens tokens. The last id may cover a partial block.
    - `tokens`: token ids (synthetic generators), so any hash-block size can be studied.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_ids: Sequence[int] | None = None
    block_tokens: int = 512
    tokens: Sequence[int] | None = None
    session_id: int | None = None
    line: int | None = None  # source line number (traces), for error messages


def _chain_token_blocks(tokens: Sequence[int], hash_block_tokens: int) -> list[int]:
    """Chained 64-bit keys over complete hash blocks: key_j = H(key_{j-1}, tokens of block j).

    blake2b (not Python's salted hash) so keys agree across the processes of a sweep.
    """
    import numpy as np

    arr = np.asarray(tokens, dtype=np.int64)
    raw = arr.tobytes()
    step = hash_block_tokens * 8
    keys: list[int] = []
    parent = b"k3sim-root"
    for j in range(len(arr) // hash_block_tokens):
        h = hashlib.blake2b(parent, digest_size=8)
        h.update(raw[j * step:(j + 1) * step])
        parent = h.digest()
        keys.append(int.from_bytes(parent, "little"))
    return keys


def prefix_keys(request: TraceRequest, hash_block_tokens: int) -> list[int]:
    """Chained keys of the request's complete hash blocks (len = input_tokens // hash_block_tokens).

    Block-id traces can only be coarsened: a hash block must be a multiple of the trace's block size (a 512-token
    Mooncake id does not say where inside the block two prompts diverge, so a finer key would be invented).
    The key of hash block j is the id of its last trace block, which by chaining identifies the whole prefix.
    """
    if request.tokens is not None:
        return _chain_token_blocks(request.tokens, hash_block_tokens)
    ids = request.block_ids or ()
    unit = request.block_tokens
    if hash_block_tokens % unit:
        raise InputError(
            f"hash block {hash_block_tokens} tokens is not a multiple of the trace's {unit}-token hash ids; "
            f"use a multiple of {unit} or a token-level workload",
            field="hash_block_tokens",
        )
    m = hash_block_tokens // unit
    n_full = request.input_tokens // hash_block_tokens
    if m == 1:
        return list(ids[:n_full])
    return [ids[(j + 1) * m - 1] for j in range(n_full)]
