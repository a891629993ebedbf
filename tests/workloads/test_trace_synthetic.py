import numpy as np
import pytest

from k3sim.workloads import agent_loops, multi_turn_chat, prefix_keys, rag_shared_documents, shared_system_prompts

GENERATORS = [
    lambda seed: multi_turn_chat(10, 3, seed=seed),
    lambda seed: shared_system_prompts(50, seed=seed),
    lambda seed: agent_loops(5, 6, seed=seed),
    lambda seed: rag_shared_documents(50, seed=seed, n_docs=10),
]


@pytest.mark.parametrize("gen", GENERATORS)
def test_seeded_sorted_and_consistent(gen):
    a, b, c = gen(7), gen(7), gen(8)
    assert [r.input_tokens for r in a] == [r.input_tokens for r in b]
    assert [r.input_tokens for r in a] != [r.input_tokens for r in c]
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    assert all(len(r.tokens) == r.input_tokens > 0 and r.output_tokens >= 1 for r in a)


def test_chat_turn_extends_the_previous_turn_with_its_output():
    reqs = multi_turn_chat(3, 3, seed=0)
    by_session = {}
    for r in reqs:
        by_session.setdefault(r.session_id, []).append(r)
    for turns in by_session.values():
        for prev, nxt in zip(turns, turns[1:]):
            assert np.array_equal(nxt.tokens[: prev.input_tokens], prev.tokens)
            assert nxt.input_tokens > prev.input_tokens + prev.output_tokens


def test_token_keys_share_exactly_the_shared_prefix():
    reqs = shared_system_prompts(200, seed=1, n_prompts=2, zipf_a=2.0)
    a, b = reqs[0], next(r for r in reqs[1:] if np.array_equal(r.tokens[:64], reqs[0].tokens[:64]))
    n_same = int(np.argmax(a.tokens[: min(a.input_tokens, b.input_tokens)] != b.tokens[: min(a.input_tokens, b.input_tokens)]))
    ka, kb = prefix_keys(a, 16), prefix_keys(b, 16)
    shared = sum(1 for x, y in zip(ka, kb) if x == y)
    assert shared == n_same // 16
    assert ka[shared:shared + 1] != kb[shared:shared + 1]


def test_named_workloads_stay_the_same_and_refuse_a_negative_seed():
    """The committed synthetic reports depend on these exact draws: a refactor of the generators must keep them."""
    from k3sim.errors import InputError
    from k3sim.workloads import synthetic_workload

    # first four prompt lengths as the generators gave them when the reports were built
    assert [r.input_tokens for r in synthetic_workload("chat", 0, 10)[:4]] == [1000, 918, 1280, 1848]
    assert [r.input_tokens for r in synthetic_workload("rag", 0, 10)[:4]] == [9818, 4063, 8719, 8493]
    with pytest.raises(InputError, match="--seed: must be at least 0, got -1"):
        synthetic_workload("chat", -1, 10)
    # the documented range of k3sim.configs.bounds, ends included: 1 .. 100,000 requests
    with pytest.raises(InputError, match=r"--requests: 100,001 is outside \[1, 100,000\] requests"):
        synthetic_workload("chat", 0, 100_001)
    with pytest.raises(InputError, match="--requests: must be positive"):
        synthetic_workload("chat", 0, 0)
    assert len(synthetic_workload("chat", 0, 1)) >= 1
