"""Hybrid KDA+MLA paged prefix cache (MISSION.md section 5): the cache only.

`CacheConfig` (policy, hash and physical block sizes, byte sizes, capacity) sets up a `HybridPrefixCache` on a
`BlockPool`; `setup.make_config` builds one from a model and the options, `setup.grid` a sweep's
configurations. The loops that serve requests through it are serving's: `k3sim.serving.replay.replay` (the
single-replica replay `k3sim prefix-cache` runs, returning a `ReplayResult`) and `k3sim.serving.engine`.
"""

from k3sim.prefix_cache.cache import CacheStats, HybridPrefixCache
from k3sim.prefix_cache.config import POLICIES, CacheConfig, config_from_model, kda_groups_for
from k3sim.prefix_cache.pool import BlockPool

__all__ = [
    "POLICIES", "BlockPool", "CacheConfig", "CacheStats", "HybridPrefixCache", "config_from_model",
    "kda_groups_for",
]
