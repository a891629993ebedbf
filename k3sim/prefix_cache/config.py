"""Cache configuration: policy, granularities, byte sizes, capacity, and the three consistency-rule switches.

Page model (our choice, documented in reports/prefix_cache/README.md):
- one page = one physical block of `physical_block_tokens` tokens of MLA KV for every MLA layer
  (a block id maps to one page in each layer's buffer, as in vLLM's hybrid allocator), so
  page_bytes = physical_block_tokens x mla_kv_bytes_per_token (whole model);
- KDA cache groups: the KDA layers are split into `num_kda_groups` groups of equal layer count, each with its own
  recurrent-state slot (default ceil(num_kda_layers / num_mla_layers): 69/24 -> 3 groups of 23 layers, the
  grouping of vLLM's hybrid KV cache manager and TokenSpeed's Flat KV for K3);
- a group's state slot takes ceil(group_state_bytes / page_bytes) pages of the same pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from k3sim.errors import InputError

Policy = Literal["coarse", "decoupled", "full-attention"]
POLICIES: tuple[str, ...] = ("coarse", "decoupled", "full-attention")
# lru: evict the free cached page (or KDA slot) released longest ago. flop-aware: Marconi's utility
# (MLSys 2025, section 4.2), recency + alpha x FLOP saved per byte, both min-max normalised over the
# oldest `eviction_window` free cached entries; the lowest utility goes first.
EVICTIONS: tuple[str, ...] = ("lru", "flop-aware")


@dataclass(frozen=True)
class CacheConfig:
    policy: str
    hash_block_tokens: int
    physical_block_tokens: int
    mla_kv_bytes_per_token: int  # whole model, all MLA layers
    kda_state_bytes_per_request: int  # whole model, all KDA layers
    num_kda_groups: int = 3
    capacity_bytes: float | None = None  # None: unbounded
    # The three consistency rules of MISSION.md section 5 (switch off only to show the failure each prevents).
    pin_before_allocate: bool = True  # rule 1
    fence_unlanded: bool = True  # rule 2
    invalidate_siblings: bool = True  # rule 3
    junction_checkpoints: bool = True  # decoupled: keep a checkpoint where a request leaves a cached MLA chain
    retention_interval_tokens: int = 0  # decoupled: also end chunks at, and keep, every multiple of this (0: off)
    eviction: str = "lru"
    # flop-aware defaults are modelling choices (Marconi tunes alpha per workload): equal weights, a window
    # wide enough to hold many chain ends, small enough that one eviction stays cheap
    eviction_alpha: float = 1.0  # flop-aware: weight of FLOP efficiency against recency
    eviction_window: int = 64  # flop-aware: oldest free cached entries compared per eviction
    # prefill FLOP of a t-token prefix = linear x t + pair x t (t + 1) (flops.PrefillFlops; 0: not known)
    prefill_flop_linear: float = 0.0
    prefill_flop_pair: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InputError(f"unknown policy '{self.policy}' (choose {', '.join(POLICIES)})", field="policy")
        for name in ("hash_block_tokens", "physical_block_tokens", "mla_kv_bytes_per_token"):
            if getattr(self, name) <= 0:
                raise InputError(f"must be positive, got {getattr(self, name)}", field=name)
        if self.physical_block_tokens % self.hash_block_tokens:
            raise InputError(
                f"hash block {self.hash_block_tokens} does not divide physical block {self.physical_block_tokens}",
                field="hash_block_tokens",
            )
        if self.has_kda and (self.num_kda_groups <= 0 or self.kda_state_bytes_per_request <= 0):
            raise InputError("a hybrid policy needs KDA groups and a positive KDA state size", field="num_kda_groups")
        if self.retention_interval_tokens < 0 or (
            self.policy == "decoupled" and self.retention_interval_tokens % self.hash_block_tokens
        ):
            raise InputError("must be a non-negative multiple of the hash block", field="retention_interval_tokens")
        if self.eviction not in EVICTIONS:
            raise InputError(f"unknown eviction '{self.eviction}' (choose {', '.join(EVICTIONS)})", field="eviction")
        if not (math.isfinite(self.eviction_alpha) and self.eviction_alpha >= 0):
            raise InputError(f"must be a finite number >= 0, got {self.eviction_alpha}", field="eviction_alpha")
        if self.eviction_window < 1:
            raise InputError(f"must be >= 1, got {self.eviction_window}", field="eviction_window")
        if self.eviction == "flop-aware" and not self.prefill_flop_linear > 0:
            raise InputError("flop-aware eviction needs the model's prefill FLOP per token", field="eviction")
        if self.capacity_bytes is not None and not (math.isfinite(self.capacity_bytes) and self.capacity_bytes > 0):
            raise InputError(f"must be a finite positive number of bytes (omit for unbounded), got "
                             f"{self.capacity_bytes}", field="capacity_bytes")

    @property
    def has_kda(self) -> bool:
        return self.policy != "full-attention"

    @property
    def effective_hash_block_tokens(self) -> int:
        """`coarse` hashes whole physical blocks: one shared block size is the point of that baseline."""
        return self.physical_block_tokens if self.policy == "coarse" else self.hash_block_tokens

    @property
    def page_bytes(self) -> int:
        return self.physical_block_tokens * self.mla_kv_bytes_per_token

    @property
    def groups(self) -> int:
        return self.num_kda_groups if self.has_kda else 0

    @property
    def kda_group_state_bytes(self) -> int:
        return math.ceil(self.kda_state_bytes_per_request / self.num_kda_groups) if self.has_kda else 0

    @property
    def pages_per_group_state(self) -> int:
        return math.ceil(self.kda_group_state_bytes / self.page_bytes) if self.has_kda else 0

    @property
    def num_pages(self) -> int | None:
        return None if self.capacity_bytes is None else int(self.capacity_bytes // self.page_bytes)

    def min_pages_one_request(self) -> int:
        """The smallest request needs one KV page and one private state slot per KDA group."""
        return 1 + self.groups * self.pages_per_group_state

    def check_capacity(self) -> None:
        n = self.num_pages
        if n is not None and n < self.min_pages_one_request():
            raise InputError(
                f"capacity {self.capacity_bytes:.4g} B holds {n} pages of {self.page_bytes} B; one request needs "
                f"{self.min_pages_one_request()} (1 KV page + {self.groups} KDA state slots)",
                source="--capacity-bytes", field="capacity_bytes",
            )


def kda_groups_for(num_kda_layers: int, num_mla_layers: int) -> int:
    """KDA cache groups of equal layer count, one per page-sharing buffer: ceil(KDA layers / MLA layers)."""
    if num_kda_layers == 0:
        return 0
    return max(1, math.ceil(num_kda_layers / max(num_mla_layers, 1)))


def config_from_model(model, policy: str, hash_block_tokens: int, physical_block_tokens: int,
                      capacity_bytes: float | None = None, tp: int = 1, **switches) -> CacheConfig:
    """Sizes from a `ModelConfig`: MLA KV bytes per token (all MLA layers) and, per checkpoint, the KDA recurrent
    state plus the short-conv window of every KDA layer (a restore needs both).

    `tp` > 1 gives one GPU's pool: KDA heads (state and conv channels) are split over the TP ranks, while MLA's
    compressed latent KV is replicated on every rank (27 KiB/token/rank for K3 at TP8, kvcache-ai/kvcache-blog
    kimi-k3-day0-support); capacity is then per GPU. A mixer kind the cache does not model yet is refused in one
    line (`configs.model.MODELLED_MIXERS`)."""
    from k3sim.configs.model import MODELLED_MIXERS

    if hasattr(model, "require_kinds"):
        model.require_kinds(MODELLED_MIXERS, "the hybrid prefix cache (k3sim prefix-cache)", field="model")
    from k3sim.memory.sizes import (
        conv_state_bytes_per_request,
        kda_state_bytes_per_request,
        mla_kv_bytes_per_token,
    )

    if tp < 1:
        raise InputError(f"must be >= 1 (got {tp})", source="--tp")
    kda = kda_state_bytes_per_request(model) + conv_state_bytes_per_request(model) if model.num_kda_layers else 0
    kda = math.ceil(kda / tp)
    groups = switches.pop("num_kda_groups", None)
    if groups is None:
        groups = kda_groups_for(model.num_kda_layers, model.num_mla_layers)
    elif model.num_kda_layers and not 1 <= groups <= model.num_kda_layers:
        raise InputError(f"must be between 1 and the model's {model.num_kda_layers} KDA layers (got {groups})",
                         source="--kda-groups")
    if not model.num_kda_layers and policy != "full-attention":
        raise InputError(f"model '{model.name}' has no KDA layers: use --policy full-attention", field="policy")
    from k3sim.prefix_cache.flops import prefill_flops

    flops = prefill_flops(model)
    switches.setdefault("prefill_flop_linear", flops.linear_flop_per_token)
    switches.setdefault("prefill_flop_pair", flops.attention_flop_per_token_pair)
    return CacheConfig(policy, hash_block_tokens, physical_block_tokens, mla_kv_bytes_per_token(model), kda,
                       groups or 1, capacity_bytes, **switches)
