"""Setting up the prefix cache: a `CacheConfig` from a model and the options as the user names them
(`make_config`), the grid of configurations a sweep replays (`grid`), and the check that a hash block fits a
Mooncake trace's ids. The replays themselves are serving loops (`k3sim.serving.replay`,
`k3sim.serving.prefix_cache_run`); this package is the cache only.
"""

from __future__ import annotations

import dataclasses
import itertools
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from k3sim.errors import InputError
from k3sim.prefix_cache.config import CacheConfig, config_from_model
from k3sim.workloads.mooncake import MOONCAKE_BLOCK_TOKENS


def check_trace_granularity(hash_block_tokens: int, source: str = "--hash-block") -> None:
    """A hash block must be a whole number of the trace's hash-id blocks."""
    if hash_block_tokens % MOONCAKE_BLOCK_TOKENS:
        raise InputError(
            f"{hash_block_tokens} is not a multiple of the trace's {MOONCAKE_BLOCK_TOKENS}-token hash ids "
            "(a Mooncake id does not say where inside its block two prompts diverge)", source=source)


# the CLI option behind each CacheConfig field, so that a bad value is named as the user typed it
OPTIONS = {"policy": "--policy", "hash_block_tokens": "--hash-block", "physical_block_tokens": "--physical-block",
           "capacity_bytes": "--capacity-bytes", "num_kda_groups": "--kda-groups",
           "retention_interval_tokens": "--retention-interval", "eviction": "--eviction",
           "eviction_alpha": "--eviction-alpha"}
SWEEP_OPTIONS = {**OPTIONS, "policy": "--policies", "hash_block_tokens": "--hash-blocks",
                 "physical_block_tokens": "--physical-blocks", "capacity_bytes": "--capacities"}


@contextmanager
def named_options(options: dict[str, str]):
    """Re-raise a CacheConfig `InputError` (which names only its field) with the CLI option of that field."""
    try:
        yield
    except InputError as err:
        if err.source is None and err.field in options:
            raise type(err)(err.reason, source=options[err.field], field=err.field) from None
        raise


def make_config(model_path: str | Path, policy: str, hash_block_tokens: int, physical_block_tokens: int,
                capacity_bytes: float | None, num_kda_groups: int | None = None,
                retention_interval_tokens: int = 0, tp: int = 1, *, eviction: str = "lru",
                eviction_alpha: float | None = None) -> CacheConfig:
    """The cache of `model_path`'s model under these options; a refused value names its CLI option."""
    from k3sim.configs import load_model

    model = load_model(str(model_path))
    kw: dict = {"num_kda_groups": num_kda_groups} if num_kda_groups is not None else {}
    if retention_interval_tokens:
        kw["retention_interval_tokens"] = retention_interval_tokens
    if eviction_alpha is not None:
        if eviction != "flop-aware":
            raise InputError("applies to --eviction flop-aware only", source="--eviction-alpha")
        kw["eviction_alpha"] = eviction_alpha
    kw["eviction"] = eviction
    with named_options(OPTIONS):
        return config_from_model(model, policy, hash_block_tokens, physical_block_tokens, capacity_bytes, tp=tp,
                                 **kw)


def grid(
    base: CacheConfig,
    policies: Sequence[str],
    hash_blocks: Sequence[int],
    physical_blocks: Sequence[int],
    capacities: Sequence[float | None],
) -> list[CacheConfig]:
    """Valid configurations only: a hash block must divide the physical block; `coarse` ignores the hash block
    (it hashes whole physical blocks), `full-attention` needs no KDA state."""
    out: list[CacheConfig] = []
    seen = set()
    for pol, hb, pb, cap in itertools.product(policies, hash_blocks, physical_blocks, capacities):
        if pol == "coarse":
            hb = pb
        if pb % hb:
            continue
        key = (pol, hb, pb, cap)
        if key in seen:
            continue
        seen.add(key)
        out.append(dataclasses.replace(base, policy=pol, hash_block_tokens=hb, physical_block_tokens=pb,
                                       capacity_bytes=cap))
    return out
