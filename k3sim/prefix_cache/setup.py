"""Setting up the prefix cache: a `CacheConfig` from a model and the options as the user names them
(`make_config`: the study policies with the blocks given, the engine policies through their own rules,
`engines.engine_config`), the grid of configurations a sweep replays (`grid`), and the check that a hash block
fits a Mooncake trace's ids. The replays themselves are serving loops (`k3sim.serving.replay`,
`k3sim.serving.prefix_cache_run`); this package is the cache only.
"""

from __future__ import annotations

import dataclasses
import itertools
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from k3sim.errors import InputError
from k3sim.prefix_cache.config import LEGACY_POLICIES, POLICIES, CacheConfig, config_from_model
from k3sim.workloads.mooncake import MOONCAKE_BLOCK_TOKENS

# the policies whose blocks an engine's rule sets (the rest take --hash-block / --physical-block as given)
ENGINE_ONLY = ("vllm-all", "vllm-align", "sglang-no-buffer", "sglang-extra-buffer", "trtllm-periodic", "k3", "none")
DEFAULT_PHYSICAL_BLOCK = 6144  # coarse / decoupled without --physical-block (the K3 study's largest page)


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
           "eviction_alpha": "--eviction-alpha", "snapshot_interval_tokens": "--snapshot-interval",
           "host_capacity_bytes": "--host-pool-bytes", "ssd_capacity_bytes": "--ssd-pool-bytes",
           "ssd_bandwidth_bytes_per_s": "--ssd-bytes-per-s", "host_bandwidth_bytes_per_s": "--step-scenario"}
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


def make_config(model_path: str | Path, policy: str, hash_block_tokens: int, physical_block_tokens: int | None,
                capacity_bytes: float | None, num_kda_groups: int | None = None,
                retention_interval_tokens: int = 0, tp: int = 1, *, eviction: str = "lru",
                eviction_alpha: float | None = None, snapshot_interval_tokens: int | None = None,
                model=None) -> CacheConfig:
    """The cache of `model_path`'s model (or `model`, already loaded) under these options; a refused value
    names its CLI option. `physical_block_tokens` None: the policy's rule (6144 for coarse and decoupled, the
    hash block for full-attention)."""
    from k3sim.configs import load_model

    model = model if model is not None else load_model(str(model_path))
    kw: dict = {"num_kda_groups": num_kda_groups} if num_kda_groups is not None else {}
    if retention_interval_tokens:
        kw["retention_interval_tokens"] = retention_interval_tokens
    if eviction_alpha is not None:
        if eviction != "flop-aware":
            raise InputError("applies to --eviction flop-aware only", source="--eviction-alpha")
        kw["eviction_alpha"] = eviction_alpha
    kw["eviction"] = eviction
    with named_options(OPTIONS):
        if policy in LEGACY_POLICIES or policy not in POLICIES:  # an unknown one: CacheConfig names it
            if snapshot_interval_tokens is not None:
                raise InputError("applies to --policy trtllm-periodic only", source="--snapshot-interval")
            # the upper bound restores every hash block: its page is the hash block unless one is given
            pb = physical_block_tokens or (hash_block_tokens if policy == "full-attention" else DEFAULT_PHYSICAL_BLOCK)
            return config_from_model(model, policy, hash_block_tokens, pb, capacity_bytes, tp=tp, **kw)
        return engine_from_options(model, policy, hash_block_tokens, physical_block_tokens, capacity_bytes, tp,
                                   snapshot_interval_tokens, kw)


def engine_from_options(model, policy: str, hash_block: int, physical_block: int | None,
                        capacity_bytes: float | None, tp: int, snapshot_interval: int | None,
                        kw: dict) -> CacheConfig:
    """An engine policy's cache, refusing the options its rules set (named as the user typed them)."""
    from k3sim.prefix_cache.engines import TRTLLM_SNAPSHOT_INTERVAL, check_policy, engine_config

    check_policy(model, policy)
    if policy.startswith("vllm-"):
        for opt, given in (("--physical-block", physical_block is not None),
                           ("--hash-block", hash_block != MOONCAKE_BLOCK_TOKENS)):
            if given:
                raise InputError(f"{policy} sets its block by vLLM's page-size rule (hash block = page): remove "
                                 f"{opt}, or use --policy k3 / decoupled to choose blocks", source=opt)
    if kw.get("num_kda_groups") is not None and policy.startswith(("sglang-", "trtllm-")):
        raise InputError(f"{policy} keeps a request's state as one allocation (no state groups): remove "
                         "--kda-groups", source="--kda-groups")
    if snapshot_interval is not None and policy != "trtllm-periodic":
        raise InputError("applies to --policy trtllm-periodic only", source="--snapshot-interval")
    if kw.get("retention_interval_tokens") and policy != "k3":
        raise InputError("keeps K3-design checkpoints: applies to --policy k3 / decoupled only",
                         source="--retention-interval")
    if physical_block is not None and physical_block % hash_block:
        raise InputError(f"hash block {hash_block} does not divide physical block {physical_block}",
                         source="--physical-block")
    return engine_config(model, policy, tp=tp, capacity_bytes=capacity_bytes, hash_block=hash_block,
                         physical_block=physical_block,
                         snapshot_interval=snapshot_interval or TRTLLM_SNAPSHOT_INTERVAL, **kw)


def grid(
    base: CacheConfig,
    policies: Sequence[str],
    hash_blocks: Sequence[int],
    physical_blocks: Sequence[int],
    capacities: Sequence[float | None],
    engine=None,
) -> list[CacheConfig]:
    """Valid configurations only: a hash block must divide the physical block; `coarse` ignores the hash block
    (it hashes whole physical blocks), `full-attention` needs no KDA state. An engine policy's blocks are its
    rule's (`engine(policy, hash_block, capacity)` builds it: the vLLM modes take neither grid block, the others
    the hash blocks; `k3` also the physical blocks)."""
    out: list[CacheConfig] = []
    seen = set()
    for pol, hb, pb, cap in itertools.product(policies, hash_blocks, physical_blocks, capacities):
        if pol in ENGINE_ONLY:
            if pol == "k3" and pb % hb:
                continue
            if engine is None:
                raise InputError(f"{pol} needs the model to apply its rules", field="policy")
            cfg = engine(pol, hb, pb if pol == "k3" else None, cap)
            key = (pol, cfg.hash_block_tokens, cfg.physical_block_tokens, cap)
            if key not in seen and not cfg.physical_block_tokens % cfg.hash_block_tokens:
                seen.add(key)
                out.append(cfg)
            continue
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
