"""Request workloads for the prefix-cache simulator: Mooncake JSONL traces and seeded synthetic generators.

Every workload yields `TraceRequest`s in arrival order; `prefix_keys(request, hash_block_tokens)` turns a
request into the chained hash keys of its complete hash blocks, whatever the workload's native granularity.
"""

from k3sim.workloads.request import TraceRequest, prefix_keys
from k3sim.workloads.mooncake import MOONCAKE_BLOCK_TOKENS, TraceStats, read_mooncake, write_mooncake
from k3sim.workloads.synthetic import (
    SYNTHETIC_WORKLOADS,
    agent_loops,
    multi_turn_chat,
    rag_shared_documents,
    shared_system_prompts,
    synthetic_workload,
)

__all__ = [
    "TraceRequest",
    "prefix_keys",
    "MOONCAKE_BLOCK_TOKENS",
    "TraceStats",
    "read_mooncake",
    "write_mooncake",
    "multi_turn_chat",
    "shared_system_prompts",
    "agent_loops",
    "rag_shared_documents",
    "SYNTHETIC_WORKLOADS",
    "synthetic_workload",
]
