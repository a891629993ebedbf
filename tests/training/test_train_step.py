"""The step-time model on hand-checked small cases (constant kernel times, hand-set layer costs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from fakes import fake_kernel_time, fake_layer_costs  # noqa: E402
from memory_toys import toy_model  # noqa: E402

from k3sim.configs import load_hardware  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.errors import InputError  # noqa: E402
from k3sim.training import TrainOptions, train_step  # noqa: E402
from k3sim.comm.routing import ep_imbalance  # noqa: E402
from k3sim.training.schedule import closed_form  # noqa: E402

H200 = load_hardware("h200")


def step(par, kt=None, costs=None, **kw):
    kw.setdefault("activation_checkpointing", False)
    kw.setdefault("options", TrainOptions(use_pipeline_engine=False))
    return train_step(toy_model(), H200, par, seq_len=kw.pop("seq_len", 64), kernel_time=kt or fake_kernel_time(),
                      layer_costs=costs or fake_layer_costs(), **kw)


def test_one_gpu_no_comm_is_sum_of_layer_costs_times_micro_batches():
    # 4 layers x (1 + 1 + 0.5) s + lm_head (0.25 fwd + 0.25 bwd) = 10.5 s per micro-batch; 3 micro-batches
    r = step(Parallelism(), costs=fake_layer_costs(emb=0.0, head=0.25), num_micro_batches=3)
    assert r.step_time_s == pytest.approx(3 * 10.5)
    assert r.bubble_s == 0 and all(v == 0 for v in r.exposed_comm_s.values())
    assert sum(x.seconds for x in r.breakdown) == pytest.approx(r.step_time_s)


def test_recompute_adds_one_forward_per_layer():
    r = step(Parallelism(), num_micro_batches=2, activation_checkpointing=True)
    assert r.step_time_s == pytest.approx(2 * 4 * (2.5 + 1.0))


def test_tp2_adds_exactly_the_rs_and_ag_times():
    kt = fake_kernel_time({"all_gather": 0.01, "reduce_scatter": 0.02})
    base = step(Parallelism(tp=1), kt=kt, num_micro_batches=2)
    tp2 = step(Parallelism(tp=2), kt=kt, num_micro_batches=2)
    # per layer: 2 sublayers x (AG + RS) forward and again backward; 4 layers; 2 micro-batches
    extra = 2 * 4 * 2 * 2 * (0.01 + 0.02)
    assert tp2.step_time_s - base.step_time_s == pytest.approx(extra)
    assert tp2.exposed_comm_s["tp"] == pytest.approx(extra)
    # with recompute the forward's AG+RS run a third time
    tp2r = step(Parallelism(tp=2), kt=kt, num_micro_batches=2, activation_checkpointing=True)
    base_r = step(Parallelism(tp=1), kt=kt, num_micro_batches=2, activation_checkpointing=True)
    assert tp2r.step_time_s - base_r.step_time_s == pytest.approx(extra * 3 / 2)
    half = step(Parallelism(tp=2), kt=kt, num_micro_batches=2,
                options=TrainOptions(tp_overlap=0.5, use_pipeline_engine=False))
    assert half.step_time_s - base.step_time_s == pytest.approx(extra / 2)


@pytest.mark.parametrize("rs,expected", [(1.0, 0.0), (12.0, 12.0 - 6.0)])
def test_dp_exposes_grad_reduce_scatter_only_beyond_overlap(rs, expected):
    # The overlap window is the last micro-batch's backward on the single stage: 4 layers x (1 + 0.5) s,
    # lm_head 0 -> 6 s. The model's two grad reduce-scatters (non-expert over dp=2, expert over edp=2) take
    # rs / 2 s each, rs in all: 1 s hides entirely, 12 s exposes 12 - 6 = 6 s.
    kt = fake_kernel_time({"reduce_scatter": rs / 2, "all_gather": 0.0})
    base = step(Parallelism(dp=1), kt=kt, num_micro_batches=1)
    dp = step(Parallelism(dp=2), kt=kt, num_micro_batches=1)
    assert dp.step_time_s - base.step_time_s == pytest.approx(expected)
    assert dp.exposed_comm_s["dp"] == pytest.approx(expected)


def test_pipeline_bubble_matches_megatron_closed_form():
    # pp=2, v=1, m=4: stage costs 2 layers x 2.5 s = 5 s per micro-batch -> bubble (p-1)/1 x 5 = 5 s
    r = step(Parallelism(pp=2), num_micro_batches=4)
    assert r.bubble_s == pytest.approx(5.0)
    assert r.bubble_ratio == pytest.approx(1 / 4)
    assert r.step_time_s == pytest.approx(4 * 5.0 + 5.0)
    # interleaved v=2 halves the bubble; m must be a multiple of p
    r2 = step(Parallelism(pp=2, virtual_stages=2), num_micro_batches=4)
    assert r2.bubble_s == pytest.approx(2.5)
    with pytest.raises(InputError, match="multiple of pp"):
        step(Parallelism(pp=2, virtual_stages=2), num_micro_batches=3)


def test_closed_form_uniform_interleaved():
    pt = closed_form([1.0] * 8, [2.0] * 8, 2, 16)
    assert pt.bubble_ratio == pytest.approx(7 / (2 * 16))


def test_pp_sends_exposed_on_fill_and_drain():
    kt = fake_kernel_time({"send_recv": 0.1})
    r = step(Parallelism(pp=2), kt=kt, num_micro_batches=4)
    assert r.exposed_comm_s["pp"] == pytest.approx(2 * (2 - 1) * 0.1)


def test_ep_all_to_all_and_imbalance():
    kt = fake_kernel_time({"ep_dispatch": 0.004, "ep_combine": 0.006, "all_to_all": 1.0})
    base = step(Parallelism(dp=2), kt=kt, num_micro_batches=1)
    ep = step(Parallelism(dp=2, ep=2), kt=kt, num_micro_batches=1)
    # 3 MoE layers x (DeepEP-class dispatch + combine) forward and backward; the EP model's busiest link
    # carries the routing distribution, so no imbalance stretch on top (NCCL's all_to_all is not called).
    # The sampled imbalance of the EP group's tokens (64 per rank x ep 2 = 128 tokens, top-2 of 4 experts,
    # seed 0 -> 1.03125, k3sim.comm.routing's seeded multinomial) stretches the expert GEMMs only.
    assert ep.ep_imbalance == ep_imbalance(4, 2, 2, 128, seed=0).max_over_mean == pytest.approx(1.03125)
    assert ep.exposed_comm_s["ep"] == pytest.approx(3 * 2 * (0.004 + 0.006))
    # expert GEMMs cost nothing under this clock, so the all-to-alls are the whole difference
    assert ep.step_time_s - base.step_time_s == pytest.approx(3 * 2 * (0.004 + 0.006))


def test_mfu_from_model_flop():
    r = step(Parallelism(), num_micro_batches=2)
    peak = H200.peak_flops_per_s["bf16"]
    assert r.mfu == pytest.approx(r.model_flop_per_step / (r.step_time_s * peak))
    assert r.tokens_per_step == 2 * 64
    assert r.tokens_per_s == pytest.approx(128 / r.step_time_s)


def test_deterministic():
    a = step(Parallelism(dp=2, ep=2), kt=fake_kernel_time({"all_to_all": 0.01}), num_micro_batches=2)
    b = step(Parallelism(dp=2, ep=2), kt=fake_kernel_time({"all_to_all": 0.01}), num_micro_batches=2)
    assert a.step_time_s == b.step_time_s and a.ep_imbalance == b.ep_imbalance


def test_memory_verdict_when_it_does_not_fit():
    from k3sim.configs import load_model

    k3 = load_model(Path(__file__).parents[2] / "models" / "kimi-k3.yaml")
    r = train_step(k3, H200, Parallelism(tp=8, ep=8), seq_len=4096, kernel_time=fake_kernel_time(),
                   layer_costs=fake_layer_costs(), options=TrainOptions(use_pipeline_engine=False))
    # 2.8 T parameters x 18 B (bf16 weight, fp32 grad, Adam) over 8 GPUs is far beyond 141 GB
    assert not r.fits and r.verdict.startswith("does not fit: pipeline stage 0 needs")
    assert "GB HBM of h200" in r.verdict and r.memory.per_gpu_bytes["total"] > 5e12 / 8


def test_bad_options():
    with pytest.raises(InputError, match="tp_overlap"):
        step(Parallelism(), options=TrainOptions(tp_overlap=1.5))
    with pytest.raises(InputError, match="cp=3"):
        step(Parallelism(cp=3, dp=1), seq_len=64)


def test_engine_agrees_with_closed_form_on_uniform_stages():
    from k3sim.training.schedule import engine_available, pipeline_time

    if not engine_available():
        pytest.skip("k3sim.pipeline not present")
    eng = pipeline_time([1.0] * 4, [2.0] * 4, virtual_stages=2, micro_batches=8, use_engine=True)
    cf = pipeline_time([1.0] * 4, [2.0] * 4, virtual_stages=2, micro_batches=8, use_engine=False)
    assert eng.step_time_s == pytest.approx(cf.step_time_s)
    assert eng.bubble_ratio == pytest.approx(3 / (2 * 8))


def test_collective_grid_interpolation_close_to_direct_calls():
    from k3sim.cp.groups import Collectives, Group

    c = Collectives(H200, __import__("k3sim.predict", fromlist=["predict_kernel_time"]).predict_kernel_time)
    for op, g in (("reduce_scatter", Group("dp", 8, 512)), ("all_to_all", Group("ep", 64, 64)),
                  ("all_gather", Group("tp", 8, 8)), ("all_gather", Group("tp", 4, 8)),
                  ("reduce_scatter", Group("dp", 16, 128))):
        for nbytes in (3_000, 77_777, 1_234_567, 98_765_432):
            direct = c._direct(op, nbytes, g)[0]
            assert c.time(op, nbytes, g)[0] == pytest.approx(direct, rel=1e-2), (op, nbytes)


def test_cp_adds_its_communication_per_layer_kind_and_micro_batch():
    # The local kernels cost nothing here, so everything k3sim.cp reports per layer is CP's own cost
    # (KCP: all-gather of (S~, M) + conv-halo send, forward and backward, + pre-process and fold).
    from k3sim.cp import cp_step, geometry_from_model

    kt = fake_kernel_time({"all_gather": 0.01, "send_recv": 0.002, "reduce_scatter": 0.003})
    base = step(Parallelism(dp=2), kt=kt, num_micro_batches=3)
    cp2 = step(Parallelism(cp=2), kt=kt, num_micro_batches=3)
    ref = cp_step(geometry_from_model(toy_model(), 1), H200, 64, 2, kernel_time=kt, intra=None)
    assert ref.kda_layer_time_s >= 2 * (0.01 + 0.002)           # + KCP's own pre-process and fold
    per_mb = 3 * ref.kda_layer_time_s + 1 * ref.mla_layer_time_s   # toy: 3 KDA + 1 MLA layers
    assert cp2.exposed_comm_s["cp"] == pytest.approx(3 * per_mb)
    # dp=2 and cp=2 shard gradients over the same 2 ranks: the rest of the step is the same
    assert cp2.step_time_s - base.step_time_s == pytest.approx(3 * per_mb)


@pytest.mark.parametrize("par, outs", [
    (Parallelism(tp=2, pp=8), ["scale-up"] * 3 + ["scale-out"] + ["scale-up"] * 3),  # 4 stages per 8-GPU domain
    (Parallelism(tp=8, pp=4), ["scale-out"] * 3),                                  # a stage fills a domain
    (Parallelism(tp=1, pp=4), ["scale-up"] * 3),
    # interleaved: chunk s on device s % 4, two devices per domain; the loop-back hop 3 -> 0 crosses
    (Parallelism(tp=4, pp=4, virtual_stages=2), ["scale-up", "scale-out"] * 3 + ["scale-up"]),
    (Parallelism(tp=2, pp=4, dp=2), ["scale-up", "scale-out", "scale-up"]),        # dp widens the stage
])
def test_pp_hops_follow_the_pipeline_engines_rule(par, outs):
    from k3sim.pipeline.costs import cross_node
    from k3sim.training.placement import pp_hop_links

    assert pp_hop_links(par, H200) == outs
    g, p = par.tp * par.cp * par.dp, par.pp
    assert outs == ["scale-out" if cross_node(s % p, (s + 1) % p, g, 8) else "scale-up"
                    for s in range(p * par.virtual_stages - 1)]


def test_pp_send_time_is_the_mean_hop():
    from k3sim.predict import predict_kernel_time

    def run(par):
        return step(par, kt=predict_kernel_time, num_micro_batches=16, seq_len=65536)

    # dp widens a stage to 4 GPUs without changing the hop's bytes: 2 stages per 8-GPU domain
    r, up = run(Parallelism(tp=2, pp=4, dp=2)), run(Parallelism(tp=2, pp=4))
    assert "1 of 3 hops scale-out" in next(b for b in r.breakdown if b.kind == "pp").source
    assert "0 of 3 hops scale-out" in next(b for b in up.breakdown if b.kind == "pp").source
    t_up = up.exposed_comm_s["pp"] / (2 * 3)
    t_out = 3 * r.exposed_comm_s["pp"] / (2 * 3) - 2 * t_up  # the one NIC hop, solved from the mean
    assert t_out > 1.2 * t_up > 0  # the NIC hop is slower than the NVLink one


def test_moe_glue_proxy_is_the_bytes_only_model_and_says_so():
    from k3sim.predict import predict_kernel_time

    def run(mode):
        return train_step(toy_model(), H200, Parallelism(tp=2, ep=2), seq_len=4096, num_micro_batches=2,
                          kernel_time=predict_kernel_time, options=TrainOptions(moe_glue=mode))

    cal, proxy = run("calibrated"), run("proxy")
    assert proxy.compute_s < cal.compute_s
    glue_rows = [[a for a in r.assumptions if "unmeasured kernels" in a["assumption"]] for r in (cal, proxy)]
    from k3sim.step.glue import load_glue

    g = load_glue(H200)
    assert f"x {g.fwd:.1f} forward, x {g.bwd:.1f} backward" in glue_rows[0][0]["assumption"]
    assert glue_rows[0][0]["source"].startswith(g.source)
    assert "bytes only" in glue_rows[1][0]["assumption"] and f"x {g.fwd:.1f}" not in glue_rows[1][0]["assumption"]
    assert glue_rows[1][0]["source"].startswith("modelling choice (not measured)")
    with pytest.raises(InputError, match="moe_glue.*'fused' or 'proxy'"):  # the schema's words
        run("unfused")
