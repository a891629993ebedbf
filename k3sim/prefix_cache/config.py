"""Cache configuration: policy, granularities, byte sizes, capacity, and the three consistency-rule switches.

Page model (our choice, documented in reports/prefix_cache/README.md):
- one page = one physical block of `physical_block_tokens` tokens of attention KV for every full-context
  attention layer (a block id maps to one page in each layer's buffer, as in vLLM's hybrid allocator), so
  page_bytes = physical_block_tokens x kv bytes per token (whole model; `mla_kv_bytes_per_token`, the name of
  the KDA+MLA days, now holds every full-context attention kind's KV);
- state groups: the recurrent layers are split into `num_kda_groups` groups of equal layer count, each with its
  own state slot (default ceil(recurrent layers / attention layers): 69/24 -> 3 groups of 23 for K3, the
  grouping of vLLM's hybrid KV cache manager and TokenSpeed's Flat KV); `kda_state_bytes_per_request` holds
  every recurrent kind's state and conv state (and a sliding window's KV, `engines.py`);
- a group's state slot takes ceil(group_state_bytes / page_bytes) pages of the same pool, or, with
  `state_pool_fraction` (SGLang's separate mamba pool), one slot of a pool of its own.

Policies: `coarse`, `decoupled` and `full-attention` are the configurations of the KDA+MLA study (any block
sizes); the engine policies of `engines.ENGINE_POLICIES` (`vllm-all`, `vllm-align`, `sglang-no-buffer`,
`sglang-extra-buffer`, `trtllm-periodic`, `k3`, `none`; `full-attention` is both) are built by
`engines.engine_config` with each engine's rules. `MECHANISM` names the checkpoint placement each runs
(`cache.HybridPrefixCache.schedule_prefill`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from k3sim.errors import InputError

Policy = Literal["coarse", "decoupled", "full-attention", "vllm-all", "vllm-align", "sglang-no-buffer",
                 "sglang-extra-buffer", "trtllm-periodic", "k3", "none"]
LEGACY_POLICIES: tuple[str, ...] = ("coarse", "decoupled", "full-attention")
POLICIES: tuple[str, ...] = LEGACY_POLICIES + ("vllm-all", "vllm-align", "sglang-no-buffer", "sglang-extra-buffer",
                                               "trtllm-periodic", "k3", "none")
# where each policy keeps recurrent-state checkpoints (cache.HybridPrefixCache._place):
# boundary: every physical block boundary a forward crosses, all kept (vLLM mamba_cache_mode 'all');
# decoupled: the K3 design (last hash-aligned position per forward, kept at turns and junctions);
# step-end: a forward's end when it lands on a block boundary, chunks cut to whole blocks (vLLM 'align');
# chunk-end: every forward's end (SGLang no_buffer); tracked: one position per forward on a 64-token grid, or
# the branch point (SGLang extra_buffer); periodic: every multiple of snapshot_interval_tokens (TensorRT-LLM);
# attention: no state; none: no reuse at all.
MECHANISM: dict[str, str] = {"coarse": "boundary", "vllm-all": "boundary", "decoupled": "decoupled",
                             "k3": "decoupled", "vllm-align": "step-end", "sglang-no-buffer": "chunk-end",
                             "sglang-extra-buffer": "tracked", "trtllm-periodic": "periodic",
                             "full-attention": "attention", "none": "none"}
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
    # engine policies (engines.engine_config sets them from the engine's rules)
    state_pool_fraction: float | None = None  # share of capacity in a separate state pool (SGLang); None: unified
    private_state_slots: int = 1  # state slots per group a running request holds (SGLang extra_buffer: 3)
    snapshot_interval_tokens: int = 0  # periodic: a snapshot every N tokens
    track_tokens: int = 64  # tracked: the grid of restorable positions inside a forward
    donate_final_state: bool = False  # a finished request's state stays cached (SGLang); unmatchable in a trace
    # offload tiers under the pool (`offload.py`): host DRAM, then SSD; bytes in the pool's units (per GPU with
    # tp), bandwidth the achieved one-direction bytes/s of a restore into those units; capacity 0: no tier
    host_capacity_bytes: float = 0.0
    host_bandwidth_bytes_per_s: float | None = None
    ssd_capacity_bytes: float = 0.0
    ssd_bandwidth_bytes_per_s: float | None = None

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
        legacy_state = self.policy in ("coarse", "decoupled")
        if (legacy_state or self.has_kda) and (self.num_kda_groups <= 0 or self.kda_state_bytes_per_request <= 0):
            raise InputError("a hybrid policy needs KDA groups and a positive KDA state size", field="num_kda_groups")
        self._check_engine_fields()
        if self.retention_interval_tokens < 0 or (
            self.mechanism == "decoupled" and self.retention_interval_tokens % self.hash_block_tokens
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
        self._check_offload_fields()
        if self.capacity_bytes is not None and not (math.isfinite(self.capacity_bytes) and self.capacity_bytes > 0):
            raise InputError(f"must be a finite positive number of bytes (omit for unbounded), got "
                             f"{self.capacity_bytes}", field="capacity_bytes")

    def _check_engine_fields(self) -> None:
        f = self.state_pool_fraction
        if f is not None and not (math.isfinite(f) and 0 < f < 1):
            raise InputError(f"must be a fraction in (0, 1), got {f}", field="state_pool_fraction")
        if self.private_state_slots < 1:
            raise InputError(f"must be >= 1, got {self.private_state_slots}", field="private_state_slots")
        if self.mechanism == "periodic" and self.snapshot_interval_tokens <= 0:
            raise InputError("a periodic policy needs a positive snapshot interval", field="snapshot_interval_tokens")
        if self.snapshot_interval_tokens < 0 or self.track_tokens <= 0:
            raise InputError("must be positive", field="snapshot_interval_tokens")

    def _check_offload_fields(self) -> None:
        """An offload tier: a finite capacity >= 0 (0: none) and, when it exists, a finite positive bandwidth; a
        tier under an unbounded pool would never receive anything."""
        for tier in ("host", "ssd"):
            cap, bw = getattr(self, f"{tier}_capacity_bytes"), getattr(self, f"{tier}_bandwidth_bytes_per_s")
            if not (isinstance(cap, (int, float)) and math.isfinite(cap) and 0 <= cap <= 2 ** 60):
                raise InputError(f"must be a finite number of bytes >= 0 (0: no tier), got {cap}",
                                 field=f"{tier}_capacity_bytes")
            if cap and not (bw is not None and math.isfinite(bw) and bw > 0):
                raise InputError(f"a {tier} tier needs a finite positive restore bandwidth, got {bw}",
                                 field=f"{tier}_bandwidth_bytes_per_s")
            if cap and self.capacity_bytes is None:
                raise InputError(f"a {tier} tier under an unbounded pool receives nothing (the pool never evicts): "
                                 "give the pool a capacity (--capacity-bytes)", field=f"{tier}_capacity_bytes")

    @property
    def offload_levels(self) -> list[tuple[str, float, float]]:
        """(name, capacity bytes, achieved restore bytes/s) of each offload tier present, top first."""
        return [(t, getattr(self, f"{t}_capacity_bytes"), getattr(self, f"{t}_bandwidth_bytes_per_s"))
                for t in ("host", "ssd") if getattr(self, f"{t}_capacity_bytes") > 0]

    @property
    def mechanism(self) -> str:
        return MECHANISM[self.policy]

    @property
    def reuses(self) -> bool:
        """False for `none`: nothing is looked up or registered."""
        return self.mechanism != "none"

    @property
    def has_kda(self) -> bool:
        """The policy keeps recurrent state (every policy but the attention upper bound, on a model with state)."""
        if self.policy in ("coarse", "decoupled"):
            return True
        return self.mechanism != "attention" and self.kda_state_bytes_per_request > 0

    @property
    def effective_hash_block_tokens(self) -> int:
        """`coarse` and the vLLM modes hash whole physical blocks (vLLM caches full blocks only)."""
        return self.physical_block_tokens if self.mechanism in ("boundary", "step-end") else self.hash_block_tokens

    @property
    def split_pools(self) -> bool:
        return self.state_pool_fraction is not None and self.has_kda

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
        """Pages of one group's state slot: of the unified pool, or 1 slot of the state pool when split."""
        if not self.has_kda:
            return 0
        return 1 if self.split_pools else math.ceil(self.kda_group_state_bytes / self.page_bytes)

    @property
    def state_page_bytes(self) -> int:
        """Bytes of one page of the pool states come from (the slot itself when the pools are split)."""
        return self.kda_group_state_bytes if self.split_pools else self.page_bytes

    @property
    def checkpoint_bytes(self) -> int:
        """Pool bytes one checkpoint holds: a slot per group, padded to whole pages."""
        return self.groups * self.pages_per_group_state * self.state_page_bytes

    @property
    def num_pages(self) -> int | None:
        """KV pages (all pages when the pool is unified)."""
        if self.capacity_bytes is None:
            return None
        kv = self.capacity_bytes * (1 - self.state_pool_fraction) if self.split_pools else self.capacity_bytes
        return int(kv // self.page_bytes)

    @property
    def num_state_pages(self) -> int | None:
        """Slots of the separate state pool (None: unbounded or unified)."""
        if self.capacity_bytes is None or not self.split_pools:
            return None
        return int(self.capacity_bytes * self.state_pool_fraction // self.kda_group_state_bytes)

    @property
    def private_state_pages(self) -> int:
        """State pages a running request holds of its own."""
        return self.groups * self.private_state_slots * self.pages_per_group_state

    def min_pages_one_request(self) -> int:
        """The smallest request needs one KV page and its private state slots (of the same pool unless split)."""
        return 1 + (0 if self.split_pools else self.private_state_pages)

    def check_capacity(self) -> None:
        n = self.num_pages
        if n is not None and n < self.min_pages_one_request():
            raise InputError(
                f"capacity {self.capacity_bytes:.4g} B holds {n} pages of {self.page_bytes} B; one request needs "
                f"{self.min_pages_one_request()} (1 KV page + {self.groups * self.private_state_slots} KDA state "
                "slots)", source="--capacity-bytes", field="capacity_bytes",
            )
        s = self.num_state_pages
        if s is not None and s < self.private_state_pages:
            raise InputError(
                f"capacity {self.capacity_bytes:.4g} B leaves the state pool {s} slots of "
                f"{self.kda_group_state_bytes} B; one request needs {self.private_state_pages}",
                source="--capacity-bytes", field="capacity_bytes")


def kda_groups_for(num_kda_layers: int, num_mla_layers: int) -> int:
    """KDA cache groups of equal layer count, one per page-sharing buffer: ceil(KDA layers / MLA layers)."""
    if num_kda_layers == 0:
        return 0
    return max(1, math.ceil(num_kda_layers / max(num_mla_layers, 1)))


def config_from_model(model, policy: str, hash_block_tokens: int, physical_block_tokens: int,
                      capacity_bytes: float | None = None, tp: int = 1, **switches) -> CacheConfig:
    """Sizes from a `ModelConfig` of any kinds (`engines.model_sizes`, the kinds registry): KV bytes per token
    of the full-context attention layers and, per checkpoint, every recurrent layer's state plus its short-conv
    window (a restore needs both), a sliding-window layer's window of KV with them.

    `tp` > 1 gives one GPU's pool: each kind's own split (KDA / GDN / Mamba2 heads, GQA KV heads, replicated
    when TP exceeds them), while MLA's compressed latent KV is replicated on every rank (27 KiB/token/rank for
    K3 at TP8, kvcache-ai/kvcache-blog kimi-k3-day0-support); capacity is then per GPU. The block sizes are the
    caller's: `engines.engine_config` applies an engine's rules."""
    from k3sim.prefix_cache.engines import model_sizes, state_groups

    if tp < 1:
        raise InputError(f"must be >= 1 (got {tp})", source="--tp")
    sizes = model_sizes(model, tp)
    if not sizes.kv_bytes_per_token:
        raise InputError(f"model '{model.name}' has no full-context attention layer: the paged pool's pages hold "
                         "attention KV, and a state-only model is not modelled", field="model")
    state = sizes.state_bytes_per_request
    layers = sizes.recurrent_layers + sum(k.layers for k in sizes.windowed)
    groups = switches.pop("num_kda_groups", None)
    if groups is None:
        groups = state_groups(sizes)
    elif layers and not 1 <= groups <= layers:
        raise InputError(f"must be between 1 and the model's {layers} state layers (got {groups})",
                         source="--kda-groups")
    if not state and policy in ("coarse", "decoupled"):
        raise InputError(f"model '{model.name}' has no recurrent layers: use --policy full-attention", field="policy")
    from k3sim.prefix_cache.flops import prefill_flops

    flops = prefill_flops(model)
    switches.setdefault("prefill_flop_linear", flops.linear_flop_per_token)
    switches.setdefault("prefill_flop_pair", flops.attention_flop_per_token_pair)
    return CacheConfig(policy, hash_block_tokens, physical_block_tokens, sizes.kv_bytes_per_token, state,
                       groups or 1, capacity_bytes, **switches)
