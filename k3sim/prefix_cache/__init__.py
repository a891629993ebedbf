"""Hybrid paged prefix cache (MISSION.md section 5 and the engines' own policies): the cache only.

`CacheConfig` (policy, hash and physical block sizes, byte sizes, capacity) sets up a `HybridPrefixCache` on a
`BlockPool`; `setup.make_config` builds one from a model and the options, `setup.grid` a sweep's
configurations; `engines` holds the engine policies (vLLM all / align, SGLang no / extra buffer, TensorRT-LLM
periodic snapshots, the K3 design, the attention upper bound, no reuse), each with its block-size rule,
checkpoint placement and memory cap, for any model of the kinds registry (`engines.engine_config`). The loops
that serve requests through it are serving's: `k3sim.serving.replay.replay` (the single-replica replay
`k3sim prefix-cache` runs, returning a `ReplayResult`), `k3sim.serving.engines_report` and
`k3sim.serving.engine`.
"""

from k3sim.prefix_cache.cache import CacheStats, HybridPrefixCache
from k3sim.prefix_cache.config import POLICIES, CacheConfig, config_from_model, kda_groups_for
from k3sim.prefix_cache.engines import ENGINE_POLICIES, ENGINES, block_rule, check_policy, engine_config
from k3sim.prefix_cache.pool import BlockPool

__all__ = [
    "ENGINES", "ENGINE_POLICIES", "POLICIES", "BlockPool", "CacheConfig", "CacheStats", "HybridPrefixCache",
    "block_rule", "check_policy", "config_from_model", "engine_config", "kda_groups_for",
]
