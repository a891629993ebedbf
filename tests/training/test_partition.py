"""Cost-balanced pipeline stages (issue 22 item 5): `k3sim.training.partition` on hand-worked costs, exact for
one chunk per rank (checked against every split), never worse than the uniform split; the step model's use of
it on a toy model with hand-set layer costs; the K3 1M scenario before and after."""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from fakes import fake_kernel_time  # noqa: E402
from memory_toys import toy_model  # noqa: E402

from k3sim.configs import load_hardware  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.errors import InputError  # noqa: E402
from k3sim.memory.layout import chunk_layers, rank_layers  # noqa: E402
from k3sim.step.training import LayerCost  # noqa: E402
from k3sim.training import TrainOptions, train_step  # noqa: E402
from k3sim.training import partition  # noqa: E402
from k3sim.training.partition import balanced_split, rank_seconds  # noqa: E402
from k3sim.training.step import _fastest_fitting  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def worst(chunks, costs, pp, first=0.0, last=0.0) -> float:
    return max(rank_seconds(chunks, costs, pp, first, last))


def optimum(costs, pp, v, first=0.0, last=0.0) -> float:
    """The slowest rank of the best split, over every contiguous split into pp*v non-empty chunks."""
    L, n = len(costs), pp * v
    best = float("inf")
    for cuts in itertools.combinations(range(1, L), n - 1):
        b = (0, *cuts, L)
        best = min(best, worst([list(range(b[c], b[c + 1])) for c in range(n)], costs, pp, first, last))
    return best


def valid(chunks, L, n) -> bool:
    return len(chunks) == n and all(chunks) and [i for c in chunks for i in c] == list(range(L))


def cases(seed: int, count: int, vs=(1, 2, 3)):
    rng = random.Random(seed)
    for _ in range(count):
        pp, v = rng.randint(1, 4), rng.choice(vs)
        L = rng.randint(pp * v, max(pp * v, min(pp * v + 6, 11)))
        costs = [rng.choice([0.0, 0.5, 1.0, 2.0, 5.0, 3 * rng.random()]) for _ in range(L)]
        yield costs, pp, v, rng.choice([0.0, 0.0, 1.0, 3.0]), rng.choice([0.0, 0.0, 2.0])


# ---------------------------------------------------------------------------------------- hand-worked
def test_two_stages_keep_the_uniform_split_when_it_is_already_best():
    # [1,1,1 | 5,1,1]: 3 s and 7 s. The stage with the 5 holds at least one more layer (7 s at best, either side),
    # so 7 s is optimal and the tie keeps the split by count.
    assert balanced_split([1, 1, 1, 5, 1, 1], 2, 1) == [[0, 1, 2], [3, 4, 5]]


def test_three_stages_isolate_the_costly_layer():
    # uniform [1,1 | 1,5 | 1,1] = 2, 6, 2 s; best: the 5 alone, [1,1,1 | 5 | 1,1] = 3, 5, 2 s (no split under 5 s)
    costs = [1, 1, 1, 5, 1, 1]
    assert worst(chunk_layers(6, 3), costs, 3) == 6
    assert balanced_split(costs, 3, 1) == [[0, 1, 2], [3], [4, 5]]


def test_embedding_and_lm_head_are_counted():
    # four 1 s layers, 2 s of embedding on the first stage: [1 | 1,1,1] = 3, 3 s (uniform: 4, 2 s)
    assert balanced_split([1, 1, 1, 1], 2, 1, first_extra=2.0) == [[0], [1, 2, 3]]
    assert balanced_split([1, 1, 1, 1], 2, 1, last_extra=2.0) == [[0, 1, 2], [3]]


def test_interleaved_hand_worked():
    # pp=2, v=2: the rank holding the 5 s layer holds another chunk of at least one 1 s layer: 6 s at best, reached
    costs = [1, 1, 1, 5, 1, 1]
    chunks = balanced_split(costs, 2, 2)
    assert valid(chunks, 6, 4) and worst(chunks, costs, 2) == 6


# ------------------------------------------------------------------------------------------ properties
def test_exact_for_one_chunk_per_rank():
    for costs, pp, v, first, last in cases(1, 400, vs=(1,)):
        chunks = balanced_split(costs, pp, 1, first, last)
        assert valid(chunks, len(costs), pp)
        assert worst(chunks, costs, pp, first, last) == pytest.approx(optimum(costs, pp, 1, first, last), abs=1e-9)


def test_interleaved_never_worse_than_uniform_and_within_the_chunk_bound():
    """v > 1 has no exact method here: the result is never worse than the uniform split and is within
    T / pp + v x (costliest item) of any split's lower bound T / pp (the bound of balancing the pp*v chunks)."""
    for costs, pp, v, first, last in cases(2, 400, vs=(2, 3)):
        chunks = balanced_split(costs, pp, v, first, last)
        L, w = len(costs), worst(chunks, costs, pp, first, last)
        assert valid(chunks, L, pp * v)
        assert w <= worst(chunk_layers(L, pp * v), costs, pp, first, last) + 1e-12
        total = sum(costs) + first + last
        assert w <= total / pp + v * max(costs + [first, last]) + 1e-9
        assert w >= optimum(costs, pp, v, first, last) - 1e-9


def test_bad_input_is_refused():
    with pytest.raises(InputError, match="chunks of at least one"):
        balanced_split([1.0] * 5, 3, 2)
    with pytest.raises(InputError, match="non-negative"):
        balanced_split([1.0, -1.0], 2, 1)


def test_rank_layers_takes_an_explicit_chunk_list():
    toy = toy_model()   # 4 layers
    assert rank_layers(toy, Parallelism(pp=2), [[0, 1, 2], [3]]) == [[0, 1, 2], [3]]
    assert rank_layers(toy, Parallelism(pp=2, virtual_stages=2), [[0], [1], [2], [3]]) == [[0, 2], [1, 3]]
    assert rank_layers(toy, Parallelism(pp=2)) == [[0, 1], [2, 3]]           # None: the uniform split
    for bad in ([[0, 1, 2, 3]], [[0, 2], [1, 3]], [[0], [1, 2, 3], []]):
        with pytest.raises(InputError, match="stage split"):
            rank_layers(toy, Parallelism(pp=2), bad)


# ------------------------------------------------------------------------------------------ the step
H200 = load_hardware("h200")


def mla_heavy_costs(model, hw, **_):
    """Hand-set: a KDA layer 1 s forward + 1 s backward, the MLA layer 5 s + 5 s; embedding and head free."""
    out = [LayerCost(i, k, 5.0 if k == "mla" else 1.0, 5.0 if k == "mla" else 1.0, 0.0, 0.0, 0.0)
           for i, k in enumerate(model.layer_kinds)]
    return out + [LayerCost(-1, "embedding", 0.0, 0.0, 0.0, 0.0, 0.0),
                  LayerCost(model.num_layers, "lm_head", 0.0, 0.0, 0.0, 0.0, 0.0)]


def toy_step(split: str, costs=mla_heavy_costs, **kw):
    return train_step(toy_model(), H200, Parallelism(pp=2), seq_len=64, num_micro_batches=4,
                      activation_checkpointing=False, kernel_time=fake_kernel_time(), layer_costs=costs,
                      options=TrainOptions(use_pipeline_engine=False, stage_split=split), **kw)


def test_step_splits_the_toy_by_cost():
    """Toy: layers KDA, KDA, KDA, MLA at 2, 2, 2, 10 s per micro-batch, no communication, 4 micro-batches,
    Megatron's closed form (m + (p - 1) / v) x slowest stage. Uniform [1,2 | 3,4]: 4 and 12 s -> 5 x 12 = 60 s.
    Balanced [1,2,3 | 4]: 6 and 10 s -> 5 x 10 = 50 s."""
    uni, bal = toy_step("uniform"), toy_step("balanced")
    assert uni.stage_split == "uniform" and [s["layers"] for s in uni.stages] == [[1, 2], [3, 4]]
    assert uni.step_time_s == pytest.approx(60.0)
    assert bal.stage_split == "balanced" and [s["layers"] for s in bal.stages] == [[1, 2, 3], [4]]
    assert [s["per_micro_batch_s"] for s in bal.stages] == pytest.approx([6.0, 10.0])
    assert bal.step_time_s == pytest.approx(50.0)
    assert [s["layers"] for s in bal.memory.stages] == [[1, 2, 3], [4]]      # the memory plan gets the split
    assert [s["layers"] for s in uni.memory.stages] == [[1, 2], [3, 4]]
    assert "balanced by cost" in bal.assumptions[-1]["assumption"]


def test_uniform_option_is_the_split_by_count_field_for_field():
    """With equal layer costs the balanced search finds the uniform split, so both options run the same code
    path (`chunks` None, the split by count `rank_layers(model, par)`): every field of the result agrees."""
    def flat(model, hw, **_):
        return [LayerCost(i, k, 1.0, 1.0, 0.5, 0.0, 0.0) for i, k in enumerate(model.layer_kinds)] + \
            [LayerCost(-1, "embedding", 0.0, 0.0, 0.0, 0.0, 0.0), LayerCost(4, "lm_head", 0.0, 0.0, 0.0, 0.0, 0.0)]
    uni, bal = toy_step("uniform", flat), toy_step("balanced", flat)
    assert [[i - 1 for i in s["layers"]] for s in uni.stages] == rank_layers(toy_model(), Parallelism(pp=2))
    assert uni.step_time_s == pytest.approx(5 * 5.0)    # 2 layers x 2.5 s per stage, (4 + 1) x 5 s
    for f in ("step_time_s", "stages", "bubble_s", "exposed_comm_s", "mfu", "fits"):
        assert getattr(uni, f) == getattr(bal, f)
    assert bal.stage_split == "uniform"                  # what the step used, not what was asked


def test_fastest_fitting_prefers_a_split_that_fits():
    runs = [(1.0, "balanced"), (2.0, "uniform")]
    plans = {"balanced": (None, False, "no"), "uniform": (None, True, "yes")}
    assert _fastest_fitting(runs, lambda r: plans[r[1]]) == ((2.0, "uniform"), (None, True, "yes"))
    plans["balanced"] = (None, True, "yes")
    assert _fastest_fitting(runs, lambda r: plans[r[1]])[0] == (1.0, "balanced")
    plans = {"balanced": (None, False, "a"), "uniform": (None, False, "b")}
    assert _fastest_fitting(runs, lambda r: plans[r[1]]) == ((1.0, "balanced"), (None, False, "a"))


def test_report_shows_per_stage_time():
    from k3sim.report.render import _layer_ranges, _stage_sections

    assert _layer_ranges([1, 2, 3, 33, 34, 40]) == "1-3, 33-34, 40"
    t = toy_step("balanced")
    sec = _stage_sections(SimpleNamespace(training=t))[0]
    assert sec["table"]["rows"][1][:2] == ["1", "4"] and "by cost (balanced)" in sec["note"]
    assert "1.67 x the fastest" in sec["note"]          # 10 s / 6 s


# ------------------------------------------------------------------------------------- K3 at 1M context
def test_k3_1m_stages_before_and_after(monkeypatch):
    """The committed 1M scenario (TP8 CP32 PP16 v2): uniform leaves one rank three MLA layers (48, 92, 93) and
    another none; at 1M an MLA layer (CP all-gather attention over the whole sequence) costs several KDA
    layers, so the slowest/fastest ratio is above 4 (issue 22 quotes 4.3 x; 7.5 x with the costs of
    2026-12-02). Balanced: 24 MLA layers on 16 ranks leave some rank two of them, so no split beats the two
    cheapest MLA layers' seconds; the split found is within 3 % of that bound, its ratio under 1.5 (1.42
    measured), and the step at least 25 % shorter (31 % measured). Each stage row is the sum of its layers'
    seconds as the split saw them, less the EP all-to-all the schedule hides afterwards (a few %)."""
    from k3sim.planner.inputs import load

    inp = load(ROOT / "scenarios" / "k3-h200-train-1m.yaml")
    sc, w = inp.scenario, inp.scenario.workload
    seen = {}

    def spy(costs, pp, v, first_extra=0.0, last_extra=0.0):
        seen["costs"] = list(costs)
        return balanced_split(costs, pp, v, first_extra, last_extra)

    monkeypatch.setattr(partition, "balanced_split", spy)
    runs = {}
    for split in ("uniform", "balanced"):
        runs[split] = train_step(inp.model, inp.hw, sc.parallelism, seq_len=w.context_tokens,
                                 micro_batch_size=w.micro_batch_size, num_micro_batches=w.num_micro_batches,
                                 activation_checkpointing=w.activation_checkpointing, with_memory=False,
                                 options=inp.training.options(None).model_copy(update={"stage_split": split}))
    per = {k: [s["per_micro_batch_s"] for s in r.stages] for k, r in runs.items()}
    assert max(per["uniform"]) / min(per["uniform"]) > 4.0
    assert runs["balanced"].stage_split == "balanced"
    costs, kinds = seen["costs"], inp.model.layer_kinds
    mla = sorted(c for c, k in zip(costs, kinds) if k == "mla")
    assert len(mla) == 24
    bound = max(mla[0] + mla[1], sum(costs) / 16)
    assert bound <= max(per["balanced"]) <= 1.03 * bound
    assert max(per["balanced"]) / min(per["balanced"]) < 1.5
    assert runs["balanced"].step_time_s < 0.75 * runs["uniform"].step_time_s
    for s in runs["balanced"].stages:   # the schedule then hides part of a stage's EP all-to-all (training.overlap)
        assert 0.95 * sum(costs[i - 1] for i in s["layers"]) <= s["per_micro_batch_s"] <= \
            sum(costs[i - 1] for i in s["layers"]) + 1e-9
