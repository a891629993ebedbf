"""Seeded synthetic workloads with token-level prompts, so any hash-block size can be studied.

Each generator returns requests sorted by arrival. Token ids are random draws, so two prompts share a prefix
exactly where the generator made them share content. Shapes follow the reuse taxonomy of Marconi (MLSys'25,
section 4.1): input-only sharing (system prompts, RAG documents) and input+output sharing (chat, agents).
Output tokens of a turn reappear in the next turn's prompt, as in real chat history.

Every default size, rate, think time, Zipf exponent and the lognormal sigma below is a modelling choice (no
measured source): plausible shapes, kept fixed so the seeded workloads (and the reports built on them) stay
the same.
"""

from __future__ import annotations

import numpy as np

from k3sim.workloads.request import TraceRequest

# Token ids are uniform draws: only equality between prompts matters, so any vocabulary far larger than a hash
# block's worth of collisions works. Close to K3's 163,840 (models/kimi-k3.yaml vocab_size); kept at 160,000 so
# the seeded workloads (and the reports built on them) stay the same.
VOCAB = 160_000


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, VOCAB, size=max(int(n), 0), dtype=np.int64)


def _length(rng: np.random.Generator, mean: float, lo: int = 1) -> int:
    """Lognormal length with the given mean (sigma 0.6): heavy right tail like real prompts."""
    sigma = 0.6
    return max(lo, int(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma)))


def _arrivals(rng: np.random.Generator, rate_per_s: float, n: int) -> np.ndarray:
    """Poisson arrival times (s) of n events at `rate_per_s`."""
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))


def _zipf_pick(rng: np.random.Generator, a: float, n: int) -> int:
    """An index in [0, n) with Zipf(a) popularity (the tail folded onto the last index)."""
    return min(int(rng.zipf(a)) - 1, n - 1)


def _sorted(reqs: list[TraceRequest]) -> list[TraceRequest]:
    reqs.sort(key=lambda r: r.arrival_s)
    return reqs


def _sessions(
    rng: np.random.Generator, n_sessions: int, turns: int, rate_per_s: float, think_s: float,
    prefix: np.ndarray, user_mean: float, output_mean: float,
) -> list[TraceRequest]:
    reqs: list[TraceRequest] = []
    start = _arrivals(rng, rate_per_s, n_sessions)
    for sid in range(n_sessions):
        history = prefix.copy()
        t = float(start[sid])
        for _ in range(turns):
            prompt = np.concatenate([history, _tokens(rng, _length(rng, user_mean))])
            out = _tokens(rng, _length(rng, output_mean))
            reqs.append(TraceRequest(t, len(prompt), len(out), tokens=prompt, session_id=sid))
            history = np.concatenate([prompt, out])
            t += float(rng.exponential(think_s))
    return reqs


def multi_turn_chat(
    n_sessions: int = 200, turns: int = 5, *, seed: int = 0, rate_per_s: float = 1.0, think_s: float = 30.0,
    system_tokens: int = 600, user_mean_tokens: float = 400, output_mean_tokens: float = 300,
) -> list[TraceRequest]:
    """Chat sessions: turn t's prompt is the whole history (system + user/assistant turns) plus a new message."""
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_tokens)
    return _sorted(_sessions(rng, n_sessions, turns, rate_per_s, think_s, system, user_mean_tokens, output_mean_tokens))


def shared_system_prompts(
    n_requests: int = 1000, *, seed: int = 0, n_prompts: int = 8, zipf_a: float = 1.3, rate_per_s: float = 4.0,
    system_mean_tokens: float = 1500, user_mean_tokens: float = 300, output_mean_tokens: float = 200,
) -> list[TraceRequest]:
    """Single-turn requests behind one of a few system prompts chosen with Zipf popularity (input-only sharing)."""
    rng = np.random.default_rng(seed)
    prompts = [_tokens(rng, _length(rng, system_mean_tokens, 16)) for _ in range(n_prompts)]
    t = _arrivals(rng, rate_per_s, n_requests)
    reqs = []
    for i in range(n_requests):
        k = _zipf_pick(rng, zipf_a, n_prompts)
        prompt = np.concatenate([prompts[k], _tokens(rng, _length(rng, user_mean_tokens))])
        reqs.append(TraceRequest(float(t[i]), len(prompt), _length(rng, output_mean_tokens), tokens=prompt))
    return reqs


def agent_loops(
    n_sessions: int = 50, steps: int = 12, *, seed: int = 0, rate_per_s: float = 0.2, think_s: float = 2.0,
    system_tokens: int = 4000, tool_mean_tokens: float = 1200, action_mean_tokens: float = 150,
) -> list[TraceRequest]:
    """Agent loops: a long shared tool-description prompt, then many quick steps, each appending the model's
    action (its output) and a tool observation."""
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_tokens)
    return _sorted(_sessions(rng, n_sessions, steps, rate_per_s, think_s, system, tool_mean_tokens, action_mean_tokens))


def rag_shared_documents(
    n_requests: int = 1000, *, seed: int = 0, n_docs: int = 50, docs_per_request: int = 2, zipf_a: float = 1.2,
    rate_per_s: float = 4.0, system_tokens: int = 300, doc_mean_tokens: float = 3000,
    question_mean_tokens: float = 80, output_mean_tokens: float = 200,
) -> list[TraceRequest]:
    """RAG: system prompt + retrieved documents (Zipf popularity, most relevant first) + a question.
    Reuse ends at the first differing document: the branch-junction case for KDA checkpoints."""
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_tokens)
    docs = [_tokens(rng, _length(rng, doc_mean_tokens, 64)) for _ in range(n_docs)]
    t = _arrivals(rng, rate_per_s, n_requests)
    reqs = []
    for i in range(n_requests):
        chosen: list[int] = []
        while len(chosen) < docs_per_request:
            k = _zipf_pick(rng, zipf_a, n_docs)
            if k not in chosen:
                chosen.append(k)
        prompt = np.concatenate([system, *(docs[k] for k in chosen), _tokens(rng, _length(rng, question_mean_tokens))])
        reqs.append(TraceRequest(float(t[i]), len(prompt), _length(rng, output_mean_tokens), tokens=prompt))
    return reqs


SYNTHETIC_WORKLOADS = {
    "chat": lambda seed, n: multi_turn_chat(max(1, n // 5), 5, seed=seed),
    "system-prompts": lambda seed, n: shared_system_prompts(n, seed=seed),
    "agent": lambda seed, n: agent_loops(max(1, n // 12), 12, seed=seed),
    "rag": lambda seed, n: rag_shared_documents(n, seed=seed),
}


def synthetic_workload(name: str, seed: int = 0, requests: int = 1000) -> list[TraceRequest]:
    """A named generator with default shape parameters and about `requests` requests."""
    from k3sim.errors import InputError

    if name not in SYNTHETIC_WORKLOADS:
        raise InputError(f"unknown workload '{name}' (choose {', '.join(SYNTHETIC_WORKLOADS)})", source="--workload")
    from k3sim.configs.bounds import check_range

    check_range(requests, "requests", "--requests", integer=True)  # held in memory: a documented upper bound
    check_range(seed, "seed", "--seed", integer=True)
    return SYNTHETIC_WORKLOADS[name](seed, requests)
