"""EP all-to-all overlap computed from the pipeline schedule, and the DeepEP-class all-to-all of training, on
hand-worked cases (uniform costs, small p and m)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from fakes import fake_kernel_time, fake_layer_costs  # noqa: E402
from memory_toys import toy_model  # noqa: E402

from k3sim.configs import load_hardware, load_model  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.errors import InputError  # noqa: E402
from k3sim.training import TrainOptions, train_step  # noqa: E402
from k3sim.training.overlap import ep_params, pairing  # noqa: E402
from k3sim.training.schedule import check_schedule, pipeline_time  # noqa: E402

H200 = load_hardware("h200")
MODELS = Path(__file__).parents[2] / "models"
SHARE = (132 - 20) / 132   # H200: 132 SMs, DeepEP's normal kernels hold 20


def step(par, m, **opts):
    kt = fake_kernel_time({"ep_dispatch": 0.004, "ep_combine": 0.006})
    opts.setdefault("use_pipeline_engine", False)
    return train_step(toy_model(), H200, par, seq_len=64, num_micro_batches=m, activation_checkpointing=False,
                      options=TrainOptions(**opts), kernel_time=kt, layer_costs=fake_layer_costs())


@pytest.mark.parametrize("engine", [True, False])
def test_interleaved_pairs_hide_the_all_to_all_of_their_steady_state(engine):
    # p = 2, v = 2, m = 4; per rank F = 1 (0.25 all-to-all), B = 2 (0.5): a chunk is half of it. Kimi K2 /
    # Megatron: rank r warms up 2 (p - r - 1) + (v - 1) p + 1 chunk forwards of its m v = 8: rank 0 five (3
    # pairs left), rank 1 three (5 pairs). A pair: compute 0.375 + 0.75, all-to-all 0.125 + 0.25 hidden under it:
    # 1.125 against 1.5 alone, 0.375 saved. Unpaired the step is Megatron's 4 x 3 + (2 - 1)/2 x 3 = 13.5; paired it
    # runs at the pace of rank 1's pairs: 13.5 - 5 x 0.375 = 11.625. Rank 0 hides 3 x 0.375 / 4 = 0.28125 s per
    # micro-batch of its 0.75 s all-to-all, rank 1 0.46875.
    r = pipeline_time([1.0, 1.0], [2.0, 2.0], virtual_stages=2, micro_batches=4, comm_fwd=[0.25, 0.25],
                      comm_bwd=[0.5, 0.5], use_engine=engine)
    assert r.step_time_s == pytest.approx(11.625)
    assert r.ep_hidden_s == pytest.approx([0.28125, 0.46875])
    assert r.bubble_s == pytest.approx(11.625 - 4 * (3 - 0.28125))   # idle of the busier rank 0
    assert r.in_flight == pytest.approx([3.0, 2.0])                  # (5 + 1) / 2, (3 + 1) / 2: one more warm-up
    plain = pipeline_time([1.0, 1.0], [2.0, 2.0], virtual_stages=2, micro_batches=4, use_engine=engine)
    assert plain.step_time_s == pytest.approx(13.5) and plain.ep_hidden_s == [0.0, 0.0]


def test_1f1b_and_zb_h1_with_a_pipeline_hide_nothing():
    # Megatron-Core refuses the merged F&B under PP without virtual stages: the all-to-all stays exposed
    for name in ("1f1b", "zb-h1"):
        r = pipeline_time([1.0, 1.0], [2.0, 2.0], micro_batches=4, schedule=name, comm_fwd=[0.25, 0.25],
                          comm_bwd=[0.5, 0.5], use_engine=True)
        assert r.ep_hidden_s == [0.0, 0.0] and "exposed" in r.overlap_source
    assert pipeline_time([1.0, 1.0], [2.0, 2.0], micro_batches=4, schedule="1f1b", comm_fwd=[0.25, 0.25],
                         comm_bwd=[0.5, 0.5], use_engine=True).step_time_s == pytest.approx(4 * 3 + 3)
    assert pairing("1f1b", 1)[0] and not pairing("1f1b", 2)[0] and pairing("interleaved-1f1b", 8)[0]


@pytest.mark.parametrize("engine", [True, False])
def test_dualpipe_pairs_on_two_ranks(engine):
    # tests/pipeline hand-works this order: p = 2, m = 4, chunks F = B = W = 1 take 12 s; with half of F and of B
    # all-to-all the one F&B pair per rank takes max(0.5 + 1.5, 1, 1, 2) = 2 instead of 3: 11 s, and each rank
    # hides 1 s over its 4 micro-batches (0.25 per micro-batch); no bubble (p/2 - 1 = 0).
    kw = dict(micro_batches=4, schedule="dualpipe", weight=[1.0, 1.0], use_engine=engine)
    r = pipeline_time([1.0, 1.0], [2.0, 2.0], comm_fwd=[0.5, 0.5], comm_bwd=[0.5, 0.5], **kw)
    assert r.step_time_s == pytest.approx(11.0) and r.bubble_s == pytest.approx(0.0)
    assert r.ep_hidden_s == pytest.approx([0.25, 0.25])
    assert r.parameter_copies == 2 and r.in_flight == [3.0, 3.0]     # PP + 1 chunks (README table)
    assert pipeline_time([1.0, 1.0], [2.0, 2.0], **kw).step_time_s == pytest.approx(12.0)


def test_no_pipeline_merges_forward_i_plus_one_with_backward_i():
    # Toy model, one rank (dp 2, ep 2), 4 layers at F 1, B 1 + 0.5 s; its 3 MoE layers add dispatch 0.004 +
    # combine 0.006 s each to the forward and again to the backward: F = 4.03, B = 6.03, 0.03 s all-to-all each.
    one = step(Parallelism(dp=2, ep=2), 1)
    assert one.step_time_s == pytest.approx(10.06) and one.exposed_comm_s["ep"] == pytest.approx(0.06)
    # m = 3, Megatron's combined 1F1B: F0, (F1 + B0), (F2 + B1), B2; a pair takes 4 + 6 + (20/132) x 0.06
    # (the SMs DeepEP's kernels hold) = 10.00909 s against 10.06: 30.07818 s; EP exposed 3 x 0.06 - 2 x 0.05091
    three = step(Parallelism(dp=2, ep=2), 3)
    pair = 10.0 + (1 - SHARE) * 0.06
    assert three.step_time_s == pytest.approx(10.06 + 2 * pair)
    assert three.exposed_comm_s["ep"] == pytest.approx(3 * 0.06 - 2 * (10.06 - pair))
    assert sum(x.seconds for x in three.breakdown) == pytest.approx(three.step_time_s)
    # an explicit share overrides it: half of every all-to-all hidden, no pairing
    half = step(Parallelism(dp=2, ep=2), 3, ep_overlap=0.5)
    assert half.step_time_s == pytest.approx(3 * (10.0 + 0.03)) and half.exposed_comm_s["ep"] == pytest.approx(0.09)


@pytest.mark.parametrize("engine", [True, False])
def test_train_step_rows_add_up_under_every_schedule(engine):
    for name, par, m in (("auto", Parallelism(pp=2, virtual_stages=2, dp=2, ep=2), 4),
                         ("dualpipe", Parallelism(pp=2, dp=2, ep=2), 4),
                         ("dualpipev", Parallelism(pp=2, virtual_stages=2, dp=2, ep=2), 4),
                         ("zb-h1", Parallelism(pp=2, dp=2, ep=2), 4)):
        r = step(par, m, pipeline_schedule=name, use_pipeline_engine=engine)
        assert sum(x.seconds for x in r.breakdown) == pytest.approx(r.step_time_s), name
        assert r.pipeline.schedule == (name if name != "auto" else "interleaved-1f1b")
        assert r.pipeline.parameter_copies == (2 if name == "dualpipe" else 1)
    paired = step(Parallelism(pp=2, virtual_stages=2, dp=2, ep=2), 4)
    exposed = step(Parallelism(pp=2, virtual_stages=2, dp=2, ep=2), 4, ep_overlap=0.0)
    assert paired.exposed_comm_s["ep"] < exposed.exposed_comm_s["ep"]
    assert paired.step_time_s < exposed.step_time_s


@pytest.mark.parametrize("name,pp,v,m,field,words", [
    ("dualpipe", 3, 1, 8, "training.pipeline_schedule", "even number"),
    ("dualpipe", 4, 1, 6, "num_micro_batches", "at least 2 x pp = 8"),
    ("dualpipe", 4, 1, 9, "num_micro_batches", "even count"),
    ("dualpipev", 4, 2, 6, "num_micro_batches", "at least 2 x pp = 8"),
    ("dualpipev", 4, 1, 8, "training.pipeline_schedule", "set it to 2"),
    ("dualpipe", 4, 2, 8, "training.pipeline_schedule", "virtual_stages is 2"),
    ("zb-h1", 4, 2, 8, "training.pipeline_schedule", "virtual_stages is 2"),
    ("interleaved-1f1b", 4, 1, 8, "training.pipeline_schedule", "virtual_stages > 1"),
])
def test_schedule_refusals_name_the_field(name, pp, v, m, field, words):
    with pytest.raises(InputError) as e:
        check_schedule(name, pp, v, m, source="s.yaml")
    assert e.value.field == field and words in str(e.value) and "s.yaml" in str(e.value)


def test_ep_params_deepseek_node_limit_fp8_dispatch_and_k3():
    ds = load_model(MODELS / "deepseek-v3.yaml")
    o = TrainOptions(precision="fp8")
    # EP 64 on 8-GPU nodes spans 8 nodes: node-limited to 4 (arXiv 2412.19437 sec. 2.1.2); fp8 dispatch, bf16 combine
    d = ep_params(ds, Parallelism(ep=64, dp=64), H200, 4096, "dispatch", "fp8", o)
    c = ep_params(ds, Parallelism(ep=64, dp=64), H200, 4096, "combine", "fp8", o)
    assert (d["nodes_max"], d["dtype_bytes"], c["dtype_bytes"], d["D"], d["topk"], d["G"]) == (4, 1, 2, 7168, 8, 8)
    # inside one node, or across no more nodes than the limit, routing is not limited
    assert ep_params(ds, Parallelism(ep=8, dp=8), H200, 4096, "dispatch", "fp8", o)["nodes_max"] == 0
    assert ep_params(ds, Parallelism(ep=32, dp=32), H200, 4096, "dispatch", "bf16", o)["nodes_max"] == 0
    k3 = load_model(MODELS / "kimi-k3.yaml")
    p = ep_params(k3, Parallelism(tp=8, ep=64, dp=64), H200, 4096, "dispatch", "bf16",
                  TrainOptions(redundant_experts=2, routing_skew=0.5))
    assert (p["nodes_max"], p["D"], p["R"], p["zipf_milli"], p["kernel"]) == (0, 3584, 128, 500, 0)


def test_the_ep_all_to_all_is_deepeps_dispatch_and_combine():
    # the real clock: DeepSeek-V3 at EP 64, 4096 tokens per rank, FP8 dispatch is cheaper than BF16
    from k3sim.predict import predict_kernel_time
    from k3sim.training.overlap import ep_all_to_all

    ds = load_model(MODELS / "deepseek-v3.yaml")
    par = Parallelism(ep=64, dp=64)
    f8 = ep_all_to_all(predict_kernel_time, H200, ds, par, 4096, TrainOptions(precision="fp8"))
    b16 = ep_all_to_all(predict_kernel_time, H200, ds, par, 4096, TrainOptions())
    assert 0 < f8.dispatch_s < b16.dispatch_s and f8.combine_s == pytest.approx(b16.combine_s)
    assert "node-limited to 4 nodes" in f8.source and "(fp8)" in f8.source
