"""The token budget (`plan --tokens N --days D`): candidate clusters, the compute bound, the smallest cluster
against a brute-force search, the runner-up, and a budget no layout meets."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest_helpers import kl_train  # noqa: E402

from k3sim.planner.budget import (SECONDS_PER_DAY, candidate_clusters, grid_gpus,  # noqa: E402
                                  step_lower_bound_s, token_budget)
from k3sim.planner.inputs import load  # noqa: E402
from k3sim.planner.sweep import TRAIN_DIMS, _train_lists, evaluate, training_points  # noqa: E402

# kl_train: Kimi-Linear-48B on 16 H200s at 4K, tp2 pp2 ep8 dp4 x 4 micro-batches of one sequence:
# a global batch of 4 x 4 x 1 = 16 sequences = 65,536 tokens per step.
TOKENS_PER_STEP = 16 * 4096


def test_candidate_clusters_by_hand():
    # 16 halved to 1 and doubled to 64; 5 GPUs at 100 % MFU: 1, 2 and 4 cannot reach the rate
    assert candidate_clusters(16, 64, 5.0) == ([8, 16, 32, 64], [1, 2, 4])
    # 6,144 = 3 x 2^11: halved while whole (down to 3), doubled once under 20,000
    swept, below = candidate_clusters(6144, 20_000, 100.0)
    assert swept == [192, 384, 768, 1536, 3072, 6144, 12288] and below == [3, 6, 12, 24, 48, 96]
    # a cap below the scenario's own cluster keeps only the halvings under it
    assert candidate_clusters(8192, 5000, 1.0)[0] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def test_grid_gpus_is_the_widest_point(tmp_path):
    inp = load(kl_train(tmp_path))
    lists = _train_lists(inp, {"tp": [1, 2], "pp": [1, 4], "cp": [1, 2]})
    # dp fills: at most 16 sequences / 1 per micro-batch = 16 ranks; 2 x 4 x 2 x 16 = 256 GPUs
    assert grid_gpus(lists, 1) == 256
    # micro-batch counts named: dp at most 16 / min(4, 8) = 4
    assert grid_gpus({**lists, "num_micro_batches": [4, 8]}, 1) == 2 * 4 * 2 * 4
    assert grid_gpus({**lists, "dp": [3, 5]}, 1) == 2 * 4 * 2 * 5


def test_compute_bound_never_exceeds_the_step(tmp_path):
    """The pruning is sound only if no point's analytic step is below its bound: every point of the grid on
    16 and 32 GPUs, each against its own step."""
    from k3sim.training import TrainingContext

    inp = load(kl_train(tmp_path))
    ctx = TrainingContext(inp.model, inp.hw)
    lists = _train_lists(inp, {})
    checked = 0
    for gpus in (16, 32):
        for p in training_points(inp, lists, gpus, Counter(), {}, {d: set() for d in TRAIN_DIMS}):
            r = evaluate(inp, ctx, None, p, with_memory=False)
            if r["status"] == "ok":
                bound = step_lower_bound_s(inp, ctx, p)
                assert 0 < bound <= r["step_time_s"], (p, bound, r["step_time_s"])
                checked += 1
    assert checked > 100


def _brute_force(inp, gpus: int, days: float, tokens: float) -> list[dict]:
    """Every point of the grid on `gpus` GPUs with its memory plan; those that fit and meet, fastest first."""
    from k3sim.training import TrainingContext

    ctx = TrainingContext(inp.model, inp.hw)
    rows = [evaluate(inp, ctx, None, p) for p in
            training_points(inp, _train_lists(inp, {}), gpus, Counter(), {}, {d: set() for d in TRAIN_DIMS})]
    ok = [r for r in rows if r["status"] == "ok" and r["fits"]]
    meet = [r for r in ok if math.ceil(tokens / r["tokens_per_step"]) * r["step_time_s"] <= days * SECONDS_PER_DAY]
    return sorted(meet, key=lambda r: r["step_time_s"])


def test_the_smallest_cluster_against_a_brute_force_search(tmp_path):
    inp = load(kl_train(tmp_path), own_layout=True)
    tokens, days = 1e10, 1.0
    b = token_budget(inp, tokens, days)
    assert b.required_tokens_per_s == pytest.approx(1e10 / 86_400)  # 115,740.7 tokens/s
    assert b.met and b.chosen is not None and b.runner_up is not None
    c = b.chosen
    # every candidate trains the scenario's 16 sequences per step
    assert c["tokens_per_step"] == TOKENS_PER_STEP and c["global_batch_sequences"] == 16
    # ceil(1e10 / 65,536) = 152,588 steps of the chosen step time
    assert c["steps"] == 152_588 and c["days"] == pytest.approx(152_588 * c["step_time_s"] / 86_400)
    assert c["days"] <= days and c["fits"]
    # no cluster below the chosen one holds a layout that fits and meets; on it, the chosen is the fastest
    swept = [x["gpus"] for x in b.clusters]
    assert swept[-1] == c["gpus"] and swept == sorted(swept)
    for gpus in swept[:-1]:
        assert _brute_force(inp, gpus, days, tokens) == []
    best = _brute_force(inp, c["gpus"], days, tokens)
    assert (best[0]["tp"], best[0]["pp"], best[0]["ep"], best[0]["cp"], best[0]["dp"]) == \
        (c["tp"], c["pp"], c["ep"], c["cp"], c["dp"])
    assert c["step_time_s"] == pytest.approx(best[0]["step_time_s"], rel=1e-12)
    # runner-up: the next in (GPUs, days) order
    r = b.runner_up
    assert (r["gpus"], r["days"]) >= (c["gpus"], c["days"])
    assert r["step_time_s"] == pytest.approx(best[1]["step_time_s"], rel=1e-12)
    # k3sim plan's figures beside the sweep's: without a pipeline both clocks are the same step
    assert c["pp"] == 1 and c["plan_pipeline_source"] == "no pipeline (pp=1)"
    assert c["plan_step_time_s"] == pytest.approx(c["step_time_s"], rel=1e-12)


def test_pruning_gives_the_answer_of_pricing_every_point(tmp_path):
    inp = load(kl_train(tmp_path), own_layout=True)
    fast = token_budget(inp, 1e10, 1.0)
    full = token_budget(inp, 1e10, 1.0, prune=False)
    assert fast.chosen == full.chosen and fast.runner_up == full.runner_up
    assert sum(x["priced"] for x in fast.clusters) < sum(x["priced"] for x in full.clusters)


def test_a_budget_no_layout_meets_reports_the_best_layout(tmp_path):
    inp = load(kl_train(tmp_path), own_layout=True)
    b = token_budget(inp, 1e11, 1.0, max_gpus=64)
    assert not b.met and b.chosen is None and b.best is not None
    best = b.best
    assert best["gpus"] <= 64 and best["days"] > 1.0 and best["fits"]
    # the best of every swept cluster, by brute force (days huge: every fitting point "meets")
    found = [r for g in (x["gpus"] for x in b.clusters) for r in _brute_force(inp, g, 1e9, 1e11)]
    top = max(found, key=lambda r: r["tokens_per_s"])
    assert best["tokens_per_s"] == pytest.approx(top["tokens_per_s"], rel=1e-12)
    line = b.shortfall()
    assert "1,157,407 tokens/s" in line and f"{best['gpus']:,} GPUs" in line and f"{best['days']:.1f} days" in line
    # a cap below what 100 % MFU needs: no cluster to sweep, said so
    none = token_budget(inp, 1e12, 1.0, max_gpus=64)
    assert none.clusters == [] and "100 % MFU" in none.shortfall()


def test_budget_json_section(tmp_path):
    from k3sim.planner.plan import plan

    res = plan(kl_train(tmp_path, training="  tokens: 1.0e10\n  days: 1"), sections=("memory", "step", "token_budget"))
    j = res.to_json()["token_budget"]
    assert j["met"] and j["tokens"] == 1e10 and j["days"] == 1.0
    assert j["gpus"] == j["chosen"]["gpus"] and j["days_taken"] == j["chosen"]["days"]
    assert j["tokens_per_step"] == [TOKENS_PER_STEP] and j["global_batch_sequences"] == [16]
    assert "wall_s" not in j  # a regenerated plan is byte-identical
