"""Prefix caching the way each serving engine does it, for any model of the kinds registry.

An engine policy is three rules: the block size (how many tokens one KV page holds, and where a page-size
unification inflates it), the checkpoint placement (the token positions at which a recurrent-state snapshot
is kept, so where a later request can resume), and the memory cap (which pool the snapshots come out of).
`ENGINES` states each with its primary source; `engine_config` turns a model and a policy into the
`CacheConfig` the cache and the replay run (`HybridPrefixCache` implements the mechanisms, `cache.MECHANISM`).

Sizes come from the kinds registry (`configs.kinds.MIXERS[k].state_bytes(cfg, tp)` + `conv_state_bytes`,
`kv_bytes_per_token`, `window_tokens`): every recurrent kind has a state page, every full-context attention
kind KV pages; a sliding-window layer's KV is capped by its window and is held like a state (what an SWA layer
needs to resume at a boundary is the window before it: a fixed size; our modelling choice, no shipped model
has one). Per layer and per TP rank (vLLM's page-size rule is per layer and rank), whole model for the pool.

A Mooncake trace names 512-token blocks only: an engine whose block is not a multiple of 512 tokens is
matched conservatively (`keys.block_keys`), and a snapshot is found only where the trace proves the prefix
up to it is shared (inside a complete 512-token block of both prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from k3sim.errors import InputError

ENGINE_POLICIES: tuple[str, ...] = ("vllm-all", "vllm-align", "sglang-no-buffer", "sglang-extra-buffer",
                                    "trtllm-periodic", "k3", "full-attention", "none")

# vLLM: the attention backend's kernel block (a page is a whole number of them). FlashAttention / FlashInfer
# take multiples of 16 tokens, the MLA backends 64 (vllm/model_executor/models/config.py at 1936cf38,
# HybridAttentionMambaModelConfig: "FlashAttention (FA) requires block size to be multiple of 16", "Other MLA
# backends: kernel_block_size 64 alignment"; vllm/platforms/interface.py update_block_size_for_backend takes
# the backend's smallest supported kernel block).
VLLM_ALIGN_GQA, VLLM_ALIGN_MLA = 16, 64
# vLLM's chunk size of the "all" mode rule: HF config `mamba_chunk_size` or `chunk_size`, else 2048
# (vllm/config/model.py ModelConfig.get_mamba_chunk_size). Our model files do not carry the key, so the
# configs that set it are listed here with their source.
VLLM_DEFAULT_CHUNK = 2048
VLLM_CHUNK_TOKENS: dict[str, tuple[int, str]] = {
    "nemotron-h-56b": (128, "nvidia/Nemotron-H-56B-Base-8K config.json chunk_size"),
    "granite-4.0-h-small": (256, "ibm-granite granitemoehybrid config.json mamba_chunk_size"),
}
# SGLang: the mamba pool's share of the memory left for caches, r / (1 + r) with r = --mamba-full-memory-ratio
# 0.9 (python/sglang/srt/server_args.py default; model_runner splits total_rest_memory * r / (1 + r));
# extra_buffer tracks states at FLA-chunk (64-token) positions, one per forward, with two ping-pong slots per
# request (python/sglang/srt/mem_cache/mamba_radix_cache.py, FLA_CHUNK_SIZE; sglang PR #14792).
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9
SGLANG_TRACK_TOKENS = 64
SGLANG_EXTRA_SLOTS = 2
# TensorRT-LLM: KvCacheConfig.tokens_per_block 32 (tensorrt_llm/llmapi/llm_args.py); the Kimi K3 example sets
# MambaStateConfig(periodic_snapshot_interval=256) (examples/kimi_k3/quick_start_kimi_k3.py: "unified-pool
# hybrid cache manager with KDA recurrent-state snapshots"; snapshots are off by default).
TRTLLM_TOKENS_PER_BLOCK = 32
TRTLLM_SNAPSHOT_INTERVAL = 256
# The K3 design's physical pages (the `decoupled` policy's 1,024-6,144-token pages, MISSION.md section 5).
K3_PAGES = (1024, 2048, 4096, 6144)


@dataclass(frozen=True)
class Engine:
    """One engine policy as the report states it: its rules in words and where they come from."""

    name: str
    engine: str
    block_rule: str
    checkpoints: str
    memory: str
    source: str
    needs_state: bool = True  # places recurrent-state checkpoints: meaningless without a recurrent layer
    refused_kinds: tuple[tuple[str, str], ...] = ()  # (kind, why) the engine refuses this mode for


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("vllm-all", "vLLM", "attention block raised until one layer's KV page holds one layer's state, "
           "rounded to lcm(mamba chunk, kernel block): chunk x ceil(ceil(state / KV per token) / chunk)",
           "a state at every block boundary a forward crosses, all cached (mamba_cache_mode 'all')",
           "one unified block pool; the state page padded to the KV page (mamba_page_size_padded)",
           "vllm/platforms/interface.py update_block_size_for_backend; vllm/config/cache.py mamba_cache_mode",
           refused_kinds=(("gdn", "vLLM refuses mamba_cache_mode 'all' for Gated DeltaNet models "
                                  "(qwen3_next.py / qwen3_5.py: 'use --mamba-cache-mode=align')"),)),
    Engine("vllm-align", "vLLM", "the smallest multiple of the kernel block whose KV page holds one layer's "
           "state: kernel x ceil(state / (kernel x KV per token))",
           "a state only at the end of a scheduler step landing on a block boundary; prefill chunks are cut to "
           "whole blocks and at the prompt's last block boundary (mamba_cache_mode 'align')",
           "one unified block pool; a request holds its running state and its latest aligned state",
           "vllm/platforms/interface.py; vllm/config/cache.py; scheduler _mamba_block_aligned_split (PR #30877)"),
    Engine("sglang-no-buffer", "SGLang", "no unification: KV in token pages (page size 1), states in their own "
           "pool", "a snapshot forked at every prefill chunk end (the prompt end included) and the request's "
           "state donated at its end (MambaRadixCache V1)",
           "separate pools: states get r / (1 + r) of the memory, r = --mamba-full-memory-ratio 0.9",
           "python/sglang/srt/mem_cache/mamba_radix_cache.py; server_args.py"),
    Engine("sglang-extra-buffer", "SGLang", "no unification: page size > 1 allowed, states tracked at 64-token "
           "(FLA chunk) positions", "one tracked snapshot per forward at its deepest 64-aligned position, or at "
           "the branch point where the request leaves the cached radix path (mamba_branching_seqlen)",
           "separate pools (ratio 0.9) and two extra ping-pong state slots per running request",
           "python/sglang/srt/mem_cache/mamba_radix_cache.py; sglang PR #14792"),
    Engine("trtllm-periodic", "TensorRT-LLM", "no inflation: KV blocks of tokens_per_block 32; a snapshot is its "
           "own allocation", "a snapshot every N tokens (MambaStateConfig.periodic_snapshot_interval)",
           "one unified pool for KV blocks and snapshots (KV cache manager V2)",
           "tensorrt_llm/llmapi/llm_args.py KvCacheConfig, MambaStateConfig; examples/kimi_k3/quick_start_kimi_k3.py"),
    Engine("k3", "k3sim (K3 design)", "512-token hashes inside the smallest of the 1,024-6,144-token pages that "
           "holds one state group", "one per forward at its last hash-aligned position (recycled when "
           "superseded), kept at the prompt end and where a request leaves a cached KV chain",
           "one unified pool; a state group per page", "MISSION.md section 5; k3sim.prefix_cache (decoupled)"),
    Engine("full-attention", "upper bound", "hash block = page: every hash block restorable",
           "no state to restore: the KV match is the hit", "KV pages only", "-", needs_state=False),
    Engine("none", "baseline", "pages of the hash block", "no reuse: every prompt prefilled whole",
           "running requests' KV and state only", "-", needs_state=False),
)}


@dataclass(frozen=True)
class KindSize:
    """One mixer kind of a model at one TP rank: its layers and per-layer bytes."""

    kind: str
    layers: int
    state_bytes: int       # recurrent state + short-conv state per request (0 for attention)
    kv_bytes_per_token: int
    window_tokens: int | None


@dataclass(frozen=True)
class HybridSizes:
    """The sizes the engines' rules read, per layer and TP rank, from the kinds registry."""

    model: str
    tp: int
    kinds: tuple[KindSize, ...]
    uses_mla: bool

    @property
    def recurrent(self) -> tuple[KindSize, ...]:
        return tuple(k for k in self.kinds if k.state_bytes)

    @property
    def attention(self) -> tuple[KindSize, ...]:
        """Full-context attention kinds (their KV grows with the context)."""
        return tuple(k for k in self.kinds if k.kv_bytes_per_token and k.window_tokens is None)

    @property
    def windowed(self) -> tuple[KindSize, ...]:
        return tuple(k for k in self.kinds if k.kv_bytes_per_token and k.window_tokens is not None)

    @property
    def recurrent_layers(self) -> int:
        return sum(k.layers for k in self.recurrent)

    @property
    def attention_layers(self) -> int:
        return sum(k.layers for k in self.attention)

    @property
    def state_bytes_per_request(self) -> int:
        """Whole model: every recurrent layer's state and conv state, plus each window layer's window of KV."""
        return (sum(k.layers * k.state_bytes for k in self.recurrent)
                + sum(k.layers * k.kv_bytes_per_token * k.window_tokens for k in self.windowed))

    @property
    def kv_bytes_per_token(self) -> int:
        """Whole model: the full-context attention layers' KV of one token."""
        return sum(k.layers * k.kv_bytes_per_token for k in self.attention)

    @property
    def layer_state_bytes(self) -> int:
        """The largest one-layer state (vLLM's mamba page: conv + ssm state of one layer)."""
        return max((k.state_bytes for k in self.recurrent), default=0)

    @property
    def layer_kv_bytes_per_token(self) -> int:
        """The smallest one-layer KV of a token over the attention kinds (the page the state must fit)."""
        return min((k.kv_bytes_per_token for k in self.kinds if k.kv_bytes_per_token), default=0)


def model_sizes(model: Any, tp: int = 1) -> HybridSizes:
    """Per-kind, per-layer sizes of `model` on one of `tp` ranks (`configs.kinds` registry)."""
    from k3sim.configs.kinds import MIXERS

    kinds = []
    for name in model.mixer_kinds:
        k, cfg = MIXERS[name], model.section(name)
        state = k.state_bytes(cfg, tp) + k.conv_state_bytes(cfg, tp) if k.recurrent else 0
        kinds.append(KindSize(name, model.num_layers_with(name), state, k.kv_bytes_per_token(cfg, tp),
                              k.window_tokens(cfg)))
    return HybridSizes(model.name, tp, tuple(kinds), "mla" in model.mixer_kinds)


def vllm_block_tokens(sizes: HybridSizes, mode: str, chunk_tokens: int = VLLM_DEFAULT_CHUNK) -> int:
    """vLLM's attention block for a hybrid model (vllm/platforms/interface.py update_block_size_for_backend):
    tokens_per_state = ceil(state page / KV page of one token), per layer and rank; mode 'all' rounds up to a
    multiple of lcm(mamba chunk, kernel block), 'align' (and prefix caching off) to the kernel block."""
    state, kv = sizes.layer_state_bytes, sizes.layer_kv_bytes_per_token
    if not state or not kv:
        raise InputError(f"model '{sizes.model}' has no recurrent and attention layers to unify", field="policy")
    align = VLLM_ALIGN_MLA if sizes.uses_mla else VLLM_ALIGN_GQA
    if mode == "all":
        chunk = math.lcm(chunk_tokens, align)
        return chunk * math.ceil(math.ceil(state / kv) / chunk)
    return align * math.ceil(state / (align * kv))


def vllm_chunk_tokens(model_name: str) -> tuple[int, str]:
    """The mamba chunk size vLLM's 'all' rule reads (HF config key), with its source."""
    return VLLM_CHUNK_TOKENS.get(model_name, (VLLM_DEFAULT_CHUNK, "vLLM default (the config has no chunk_size)"))


def state_groups(sizes: HybridSizes) -> int:
    """State groups of equal layer count, one per page-sharing buffer: ceil(state layers / attention layers)
    (vLLM's hybrid allocator groups; 69 KDA / 24 MLA -> 3 for K3)."""
    layers = sizes.recurrent_layers + sum(k.layers for k in sizes.windowed)
    if not layers:
        return 0
    return max(1, math.ceil(layers / max(sizes.attention_layers, 1)))


def k3_block_tokens(sizes: HybridSizes, groups: int | None = None) -> int:
    """The K3 design's page: the smallest of `K3_PAGES` whose page (all attention layers' KV) holds one state
    group; the largest when none does (a slot then takes several pages). K3 at tp 1: 6144."""
    g = groups or state_groups(sizes)
    if not g or not sizes.kv_bytes_per_token:
        return K3_PAGES[0]
    need = math.ceil(sizes.state_bytes_per_request / g) / sizes.kv_bytes_per_token
    return next((p for p in K3_PAGES if p >= need), K3_PAGES[-1])


@dataclass(frozen=True)
class BlockRule:
    """What one engine's rule gives for one model: the KV page, the hash grid and the snapshot granularity."""

    policy: str
    page_tokens: int        # KV page the engine allocates
    hash_tokens: int        # grid the simulated lookup matches on
    snapshot_tokens: int    # finest spacing of restorable positions (0: no state)
    simulated_page_tokens: int  # page the replay allocates (the engine's, or the hash block where it is finer)
    note: str = ""


def block_rule(model: Any, policy: str, *, tp: int = 1, hash_block: int = 512, physical_block: int | None = None,
               snapshot_interval: int = TRTLLM_SNAPSHOT_INTERVAL, groups: int | None = None) -> BlockRule:
    """The block sizes `policy`'s rule gives for `model` at `tp` (see `ENGINES`)."""
    sizes = model_sizes(model, tp)
    has_state = bool(sizes.state_bytes_per_request)
    if policy in ("vllm-all", "vllm-align"):
        mode = policy.removeprefix("vllm-")
        chunk, src = vllm_chunk_tokens(sizes.model)
        b = vllm_block_tokens(sizes, mode, chunk)
        note = f"chunk {chunk} ({src})" if mode == "all" else f"kernel block {VLLM_ALIGN_MLA if sizes.uses_mla else VLLM_ALIGN_GQA}"
        return BlockRule(policy, b, b, b, b, note)
    if policy == "k3":
        pb = physical_block or k3_block_tokens(sizes, groups)
        return BlockRule(policy, pb, hash_block, hash_block if has_state else 0, pb)
    pb = physical_block or hash_block
    if policy == "sglang-no-buffer":
        return BlockRule(policy, 1, hash_block, 1, pb, "token pages; snapshots at chunk ends")
    if policy == "sglang-extra-buffer":
        return BlockRule(policy, 1, hash_block, SGLANG_TRACK_TOKENS, pb, "states tracked at 64-token positions")
    if policy == "trtllm-periodic":
        return BlockRule(policy, TRTLLM_TOKENS_PER_BLOCK, hash_block, snapshot_interval, pb)
    return BlockRule(policy, pb, hash_block, 0, pb)


def check_policy(model: Any, policy: str, source: str = "--policy") -> None:
    """Refuse, in one line naming `source`, an engine policy the model's kinds cannot use: a state policy on a
    model without a recurrent layer, a mode the engine refuses for one of its kinds, a model with no
    attention layer (the paged pool has no KV page)."""
    if policy not in ENGINE_POLICIES:
        raise InputError(f"unknown policy '{policy}' (choose {', '.join(ENGINE_POLICIES)})", source=source)
    eng = ENGINES[policy]
    sizes = model_sizes(model, 1)
    if not sizes.attention and not sizes.windowed:
        raise InputError(f"model '{model.name}' has no attention layer: the paged pool's pages hold attention "
                         "KV, and a state-only model is not modelled", source=source)
    if eng.needs_state and not sizes.recurrent:
        raise InputError(f"{policy} places recurrent-state checkpoints and model '{model.name}' has no recurrent "
                         "layer: use full-attention (the engines' plain prefix caching) or none", source=source)
    for kind, why in eng.refused_kinds:
        if kind in model.mixer_kinds:
            raise InputError(f"{policy} on model '{model.name}': {why}; use vllm-align", source=source)


def engine_config(model: Any, policy: str, *, tp: int = 1, capacity_bytes: float | None = None,
                  hash_block: int = 512, physical_block: int | None = None,
                  snapshot_interval: int = TRTLLM_SNAPSHOT_INTERVAL, num_kda_groups: int | None = None,
                  **switches):
    """The `CacheConfig` of `policy` as its engine runs it on `model` (the rules in `ENGINES`):

    - vllm-all / vllm-align: hash block = page = the rule's block (vLLM caches full blocks only); state groups
      ceil(recurrent / attention layers), one group's padded state per page.
    - sglang-*: pages of the hash block (SGLang's KV page is one token: a finer page would change memory by
      less than one hash block per request, and cost the replay time); one state slot per request in a pool
      of its own, r / (1 + r) of the capacity; extra_buffer holds 1 + 2 slots per running request; a
      finished request's state is donated to the cache.
    - trtllm-periodic: pages of the hash block (TensorRT-LLM's are 32 tokens, same reason), one unified pool,
      a snapshot = the whole state (one group, as many pages as it takes), every `snapshot_interval` tokens.
    - k3: `decoupled` with the K3 page rule (`k3_block_tokens`) unless `physical_block` is given.
    - full-attention / none: pages of the hash block; none keeps nothing.
    """
    from k3sim.prefix_cache.config import config_from_model

    check_policy(model, policy)
    rule = block_rule(model, policy, tp=tp, hash_block=hash_block, physical_block=physical_block,
                      snapshot_interval=snapshot_interval, groups=num_kda_groups)
    kw: dict = dict(switches)
    if num_kda_groups is not None:
        kw["num_kda_groups"] = num_kda_groups
    hb, pb = hash_block, rule.simulated_page_tokens
    if policy.startswith("vllm-"):
        hb = pb = rule.page_tokens
    elif policy.startswith("sglang-"):
        r = SGLANG_MAMBA_FULL_MEMORY_RATIO
        kw.update(num_kda_groups=1, state_pool_fraction=r / (1 + r), donate_final_state=True,
                  track_tokens=SGLANG_TRACK_TOKENS)
        if policy == "sglang-extra-buffer":
            kw["private_state_slots"] = 1 + SGLANG_EXTRA_SLOTS
    elif policy == "trtllm-periodic":
        kw.update(num_kda_groups=1, snapshot_interval_tokens=snapshot_interval)
    return config_from_model(model, policy, hb, pb, capacity_bytes, tp=tp, **kw)
