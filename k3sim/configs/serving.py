"""The scenario's `serving:` section: replicas, engine settings, router, prefill/decode disaggregation, SLOs.

Every default below is either a vLLM / SGLang default (named with where it lives) or a modelling choice
(labelled as such). A scenario without a `serving:` section serves with these defaults on the scenario's own
layout; `k3sim.serving.fleet.build_fleet` turns the section into replicas.
"""

from __future__ import annotations

import math
from typing import Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Annotated

from k3sim.configs.bounds import BOUNDS, _finite, bounded_float, bounded_int
from k3sim.configs.parallelism import Parallelism

_STRICT = ConfigDict(extra="forbid", frozen=True)
# Every number of the section in its documented range (k3sim/configs/bounds.py): one simulated engine per
# replica ("replicas"), batch limits as "batch", budgets and chunks as "tokens", cache blocks as "block_tokens"
# (a 1-token hash block is refused: seconds and GBs per request, for no modelled effect).
MAX_REPLICAS = int(BOUNDS["replicas"].hi)
Replicas = bounded_int("replicas")
Tokens = bounded_int("tokens")
BlockTokens = bounded_int("block_tokens")
Seconds = bounded_float("seconds", gt=0)

SCHEDULERS = ("vllm", "sarathi")
ROUTERS = ("round-robin", "least-loaded", "prefix-aware")
CACHE_POLICIES = ("coarse", "decoupled", "full-attention")


class EngineConfig(BaseModel):
    """One replica's continuous-batching engine."""

    model_config = _STRICT
    # vLLM `max_num_seqs` default 256 (vllm/engine/arg_utils.py, V0 and the V1 default for most GPUs)
    max_batch: bounded_int("batch") = Field(256, description="most requests running at once (vLLM max_num_seqs)")
    # vLLM V1 `max_num_batched_tokens` 8192 for the OpenAI server on large-memory GPUs (same source as
    # memory/plan.py serve_plan's prefill chunk)
    token_budget: Tokens = Field(8192, description="tokens per engine step (decodes + prefill chunks)")
    chunk_tokens: Optional[Tokens] = Field(
        None, description="most prefill tokens of one request per step (None: the token budget)")
    scheduler: Literal["vllm", "sarathi"] = Field(
        "vllm", description="vllm: decodes first, then prefill chunks up to the budget; sarathi: stall-free, "
                            "the budget shrinks so a step with prefill stays within the TPOT SLO")
    cache_policy: Literal["coarse", "decoupled", "full-attention"] = "decoupled"
    hash_block_tokens: BlockTokens = Field(512, description="prefix-cache hash block (Mooncake trace ids: 512)")
    physical_block_tokens: Optional[BlockTokens] = Field(
        None, description="page size in tokens; None: the smallest multiple of the hash block whose page holds "
                          "one KDA group state per GPU (vLLM's hybrid allocator sizes attention pages to the "
                          "mamba state the same way)")
    pool_bytes: Union[float, Literal["unbounded"], None] = Field(
        None, description="per-GPU pool for MLA KV pages and KDA state slots; None: what the memory planner "
                          "leaves free after weights, AttnRes blocks and workspace")
    # an offload tier under the pool (k3sim.prefix_cache.offload): pinned host DRAM per GPU; 0 = none. DGX H200: 2 TB
    # of system memory for 8 GPUs (NVIDIA DGX H200 datasheet), 256 GB per GPU; GB200: 480 GB of LPDDR5X per Grace,
    # two GPUs each (NVIDIA GB200 NVL72 page)
    host_pool_bytes: Annotated[float, BeforeValidator(_finite)] = Field(
        0.0, ge=0, le=2 ** 60, allow_inf_nan=False,
        description="per-GPU host-memory tier under the pool for evicted KV pages and state checkpoints "
                    "(bytes; 0: none); restores are priced at the profile's host link")
    # vLLM V0 BlockSpaceManager watermark=0.01: admission keeps 1 % of the pool free to avoid instant preemption
    watermark_fraction: Annotated[float, BeforeValidator(_finite)] = Field(0.01, ge=0, lt=1, allow_inf_nan=False)
    reserve_output: bool = Field(False, description="reserve pages for the whole output at admission (no "
                                                    "preemption); vLLM does not")
    # on: what engines do (vLLM V1 max_concurrent_batches = pp, V0 virtual engines, SGLang pp micro-batches;
    # k3sim.serving.run._pp_engines cites them); with attention DP it stays off, noted in the result
    pp_microbatches: bool = Field(True, description="with pp > 1, keep pp batches in flight: the replica runs "
                                                    "pp engines, each with 1/pp of the pool and its own prefix "
                                                    "cache (vLLM V0's virtual engines); off: one batch at a time")

    @field_validator("pool_bytes")
    @classmethod
    def _pool(cls, v):
        if isinstance(v, float) and not (math.isfinite(v) and 0 < v <= 2 ** 60):
            raise ValueError(f"must be a finite positive number of bytes or 'unbounded', got {v}")
        return v


class PoolConfig(BaseModel):
    """One pool of a disaggregated fleet: how many replicas and each one's layout."""

    model_config = _STRICT
    replicas: Replicas
    parallelism: Optional[Parallelism] = Field(None, description="None: the scenario's layout")


class DisaggregationConfig(BaseModel):
    model_config = _STRICT
    prefill: PoolConfig
    decode: PoolConfig


class ServingConfig(BaseModel):
    """The `serving:` section of a scenario."""

    model_config = _STRICT
    replicas: Optional[Replicas] = Field(None, description="None: cluster GPUs / GPUs per replica")
    engine: EngineConfig = EngineConfig()
    router: Literal["round-robin", "least-loaded", "prefix-aware"] = "least-loaded"
    # SGLang router `balance_abs_threshold` 32 (sgl-router): past this imbalance it routes to the least loaded
    router_load_cap: bounded_int("load_cap") = Field(32, description="prefix-aware: most extra requests in "
                                                                     "system a replica may have over the least "
                                                                     "loaded one (refused with another router)")
    disaggregation: Optional[DisaggregationConfig] = None
    # modelling choices (interactive chat): first token within 2 s, at least 10 tokens/s per user
    # MTP speculative decoding (DeepSeek-V3 sec. 2.2, K3's MTP module): drafts per step and the per-draft
    # acceptance rate (no default: a modelling input the user owns; DeepSeek-V3 reports 85-90 % for the
    # second token, arXiv 2412.19437 sec. 5.4.3)
    mtp: bounded_int("decode_tokens", lo=0) = Field(0, description="MTP draft tokens per decode step (0 off)")
    acceptance: Optional[bounded_float("fraction")] = Field(None, description="per-draft acceptance rate")
    slo_ttft_s: Seconds = 2.0
    slo_tpot_s: Seconds = 0.1
    seed: bounded_int("seed") = 0

    @model_validator(mode="after")
    def _mtp(self) -> "ServingConfig":
        if self.mtp and self.acceptance is None:
            raise ValueError(f"mtp={self.mtp} needs an acceptance rate (serving.acceptance in [0, 1])")
        if not self.mtp and self.acceptance is not None:
            raise ValueError("acceptance has no effect without mtp >= 1 (serving.mtp); remove it or set mtp")
        return self

    @model_validator(mode="after")
    def _split(self) -> "ServingConfig":
        d = self.disaggregation
        if d is not None and self.replicas is not None and d.prefill.replicas + d.decode.replicas != self.replicas:
            raise ValueError(f"disaggregation {d.prefill.replicas}:{d.decode.replicas} does not add up to "
                             f"replicas={self.replicas}")
        return self
