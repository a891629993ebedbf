"""Hybrid KDA+MLA paged prefix-cache simulator (MISSION.md section 5).

`CacheConfig` (policy, hash and physical block sizes, byte sizes, capacity) -> `replay(requests, cfg)` runs the
simpy serving loop over a `HybridPrefixCache` on a `BlockPool` and returns a `ReplayResult`; `sweep` runs a
grid of configurations on several processes and returns a DataFrame.
"""

from k3sim.prefix_cache.cache import CacheStats, HybridPrefixCache
from k3sim.prefix_cache.config import POLICIES, CacheConfig, config_from_model, kda_groups_for
from k3sim.prefix_cache.pool import BlockPool
from k3sim.prefix_cache.serving import ReplayResult, SchedulerConfig, StepCost, replay

__all__ = [
    "POLICIES", "BlockPool", "CacheConfig", "CacheStats", "HybridPrefixCache", "ReplayResult",
    "SchedulerConfig", "StepCost", "config_from_model", "kda_groups_for", "replay",
]
