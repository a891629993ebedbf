"""DualPipe, DualPipeV and the paired interleaved 1F1B: orders, the published bubble, the F&B op, refusals."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.pipeline import StageCosts, build_schedule, simulate, text_program, uniform_costs, validate_schedule
from k3sim.pipeline.placement import paired_seconds
from k3sim.pipeline.result import run_pipeline


def chunk_costs(S: int, F: float, B: float, W: float, fa: float = 0.0, ba: float = 0.0, send: float = 0.0,
                share: float = 1.0) -> StageCosts:
    """Every virtual stage (chunk) costs F forward, B input gradient, W weight gradient; fa / ba of F / B is
    the EP all-to-all a pair may hide."""
    return StageCosts((F,) * S, (B,) * S, (W,) * S, (send,) * S, (send,) * S, comm_forward_s=(fa,) * S,
                      comm_backward_s=(ba,) * S, comm_sm_share=share)


def idle(name: str, p: int, m: int, costs: StageCosts) -> tuple[float, list[float]]:
    tl = simulate(text_program(build_schedule(name, p, m), costs).program)
    return tl.step_time_s, [tl.step_time_s - b for b in tl.busy_s()]


def slots(sched, d: int) -> list[str]:
    names, o, out, i = "FBW", sched.orders[d], [], 0
    for n in sched.slots[d]:
        out.append("+".join(f"{names[k]}{s}.{mb}" for k, s, mb in o[i:i + n]))
        i += n
    return out


def test_dualpipe_order_is_the_published_figure():
    # deepseek-ai/DualPipe README figure, 8 ranks, 20 micro-batches: device 0 runs 7 forwards of direction 0,
    # one of direction 1, three (B input, W, F) of direction 1, one more direction-1 forward, then the F&B pairs
    # "7 + Backward" and "F + 0"; virtual stage 15 is direction 1's last stage (model stage 7) on device 0.
    s = build_schedule("dualpipe", 8, 20)
    assert slots(s, 0)[:19] == ["F0.0", "F0.1", "F0.2", "F0.3", "F0.4", "F0.5", "F0.6", "F15.10", "B15.10", "W15.10",
                                "F15.11", "B15.11", "W15.11", "F15.12", "B15.12", "W15.12", "F15.13",
                                "F0.7+B15.13+W15.13", "F15.14+B0.0+W0.0"]
    # device 7 mirrors it: direction 1 enters there
    assert slots(s, 7)[:9] == ["F8.10", "F8.11", "F8.12", "F8.13", "F8.14", "F8.15", "F8.16", "F7.0", "B7.0"]
    assert s.placement[:8] == tuple(range(8)) and s.placement[8:] == tuple(range(7, -1, -1))
    assert s.parameter_copies == 2 and build_schedule("dualpipev", 4, 8).parameter_copies == 1


@pytest.mark.parametrize("name,p,m", [("dualpipe", 2, 4), ("dualpipe", 4, 8), ("dualpipe", 8, 20), ("dualpipe", 6, 14),
                                      ("dualpipev", 1, 2), ("dualpipev", 3, 6), ("dualpipev", 4, 11),
                                      ("dualpipev", 8, 16)])
def test_dual_schedules_are_valid_dags_with_every_op_once(name, p, m):
    validate_schedule(build_schedule(name, p, m))


# The README's table: DualPipe (PP/2 - 1)(F&B + B - 3W), DualPipeV the same for PP = 2p stages on p devices;
# B the whole backward (input + weight gradient). Its figure draws a forward and an input-gradient chunk the
# same width; with F = B the engine's bubble (the idle of the rank with the most F&B pairs) is the formula
# exactly, whatever W <= F and whatever the pair's duration.
@pytest.mark.parametrize("name,p,m,F,B,W,fa,ba,fb,bubble", [
    # no communication: F&B = F + B + W = 2.5, bubble 3 x (2.5 + 1.5 - 1.5) = 7.5
    ("dualpipe", 8, 20, 1.0, 1.0, 0.5, 0.0, 0.0, 2.5, 7.5),
    ("dualpipe", 8, 32, 1.0, 1.0, 0.5, 0.0, 0.0, 2.5, 7.5),
    # F = B = W = 1: the figure's cells; F&B = 3, bubble 3 x (3 + 2 - 3) = 6 (8 ranks), 1 x 2 = 2 (4 ranks)
    ("dualpipe", 8, 20, 1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 6.0),
    ("dualpipe", 4, 8, 1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 2.0),
    # half of each chunk all-to-all: F&B = max(0.5 + 1.5, 0.5 + 0.5, 0.5 + 0.5, 1.5 + 0.5) = 2, bubble 3 x 1 = 3
    ("dualpipe", 8, 20, 1.0, 1.0, 1.0, 0.5, 0.5, 2.0, 3.0),
    # DualPipeV on 4 devices = 8 stages: 3 x (2.5 + 1.5 - 1.5) = 7.5; p = 2: 1 x 2 = 2 as DualPipe on 4
    ("dualpipev", 4, 8, 1.0, 1.0, 0.5, 0.0, 0.0, 2.5, 7.5),
    ("dualpipev", 4, 12, 1.0, 1.0, 1.0, 0.5, 0.5, 2.0, 3.0),
    ("dualpipev", 2, 4, 1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 2.0),
])
def test_bubble_is_the_published_formula(name, p, m, F, B, W, fa, ba, fb, bubble):
    k = p / 2 - 1 if name == "dualpipe" else p - 1
    assert paired_seconds(F - fa, fa, B + W - ba, ba) == pytest.approx(fb)
    assert k * (fb + (B + W) - 3 * W) == pytest.approx(bubble)
    step, idles = idle(name, p, m, chunk_costs(2 * p, F, B, W, fa, ba))
    assert max(idles) == pytest.approx(bubble, abs=1e-9)
    if fa == ba == 0:   # every rank as busy: the same bubble on each; a micro-batch meets 1 (2) chunks a rank
        assert min(idles) == pytest.approx(bubble, abs=1e-9)
        assert step == pytest.approx((1 if name == "dualpipe" else 2) * m * (F + B + W) + bubble)


def test_unequal_forward_and_backward_depart_from_the_table():
    # With F != B the repo's order leaves a bubble the table's formula does not give (it reads the figure's
    # equal cells): F = 1, B = 2, W = 1 on 8 ranks: the engine idles 11, the formula says 3 x (4 + 3 - 3) = 12.
    step, idles = idle("dualpipe", 8, 20, chunk_costs(16, 1.0, 2.0, 1.0))
    assert idles == pytest.approx([11.0] * 8) and step == pytest.approx(20 * 4 + 11)


def test_hand_worked_dualpipe_on_two_ranks():
    # p = 2, m = 4, chunks F = B = W = 1 (no sends). Device 0: F0.0 [0,1], F3.2 [1,2] (its input F2.2 ran on
    # device 1 at [0,1]), F0.1 [2,3], B3.2+W [3,5] (last stage of direction 1), the pair F3.3 + B0.0 + W [5,8]
    # (waits for B1.0+W of device 1 at [3,5]), B3.3+W [8,10], then B0.1 (zero bubble) [10,11] and its W [11,12].
    s = build_schedule("dualpipe", 2, 4)
    assert slots(s, 0) == ["F0.0", "F3.2", "F0.1", "B3.2+W3.2", "F3.3+B0.0+W0.0", "B3.3+W3.3", "B0.1", "W0.1"]
    step, idles = idle("dualpipe", 2, 4, chunk_costs(4, 1.0, 1.0, 1.0))
    assert step == pytest.approx(12.0) and idles == pytest.approx([0.0, 0.0])
    # half of each chunk all-to-all: the pair takes 2 instead of 3, and everything after it moves up by one
    step, _ = idle("dualpipe", 2, 4, chunk_costs(4, 1.0, 1.0, 1.0, 0.5, 0.5))
    assert step == pytest.approx(11.0)


def test_paired_seconds_formula():
    # compute 1 + 2, all-to-all 0.4 + 0.8: hidden under the other's compute, the SMs held cost (1 - s) x 1.2
    assert paired_seconds(1.0, 0.4, 2.0, 0.8) == pytest.approx(3.0)
    assert paired_seconds(1.0, 0.4, 2.0, 0.8, sm_share=112 / 132) == pytest.approx(3.0 + 20 / 132 * 1.2)
    # communication-bound: all of it (2 + 2.5), or one chunk alone (its own comm waits on its own compute)
    assert paired_seconds(0.5, 2.0, 0.5, 2.5) == pytest.approx(4.5)
    assert paired_seconds(0.2, 0.1, 3.0, 1.0) == pytest.approx(4.0)
    assert paired_seconds(1.0, 0.0, 2.0, 0.0) == pytest.approx(3.0)     # no comm: back to back


def test_paired_interleaved_costs_nothing_without_comm_and_hides_it_with():
    # Kimi K2 / Megatron: one more warm-up; without all-to-all the step is interleaved 1F1B's
    p, v, m = 4, 2, 8
    plain = uniform_costs(p, v, 1.0, 2.0)
    a = run_pipeline(build_schedule("interleaved-1f1b", p, m, v), plain).step_time_s
    b = run_pipeline(build_schedule("interleaved-1f1b", p, m, v, paired=True), plain).step_time_s
    assert a == b == pytest.approx(m * 3 + (p - 1) / v * 3)
    # a quarter of each op all-to-all: chunk F 0.5 (0.125), B 1 (0.25); a pair saves 1.5 - max(1.125, ...) = 0.375;
    # device 3 runs 16 - (2 x 0 + 4 + 1) = 11 pairs and the step shrinks by its 11 x 0.375
    c = chunk_costs(p * v, 0.5, 1.0, 0.0, 0.125, 0.25)
    unpaired = simulate(text_program(build_schedule("interleaved-1f1b", p, m, v), c).program).step_time_s
    paired = simulate(text_program(build_schedule("interleaved-1f1b", p, m, v, paired=True), c).program).step_time_s
    assert unpaired == pytest.approx(28.5) and paired == pytest.approx(28.5 - 11 * 0.375)


def test_dual_in_flight_is_pp_plus_one_chunks():
    # README table: activation per device PP + 1 (chunks); the result reports chunks / 2 per device
    res = run_pipeline(build_schedule("dualpipe", 8, 20), chunk_costs(16, 1.0, 1.0, 1.0))
    assert [s.peak_in_flight for s in res.stage] == [4.5] * 8


@pytest.mark.parametrize("args,option,words", [
    (("dualpipe", 7, 20), "--stages", "even number"),
    (("dualpipe", 8, 15), "--microbatches", "even count"),
    (("dualpipe", 8, 14), "--microbatches", "at least 2 x pp = 16"),
    (("dualpipev", 4, 7), "--microbatches", "at least 2 x pp = 8"),
    (("dualpipe", 4, 8, 2), "--virtual", "two chunks per device"),
])
def test_bad_dual_shapes_name_the_option(args, option, words):
    with pytest.raises(InputError) as e:
        build_schedule(*args)
    assert option in str(e.value) and words in str(e.value)


def test_encoder_policies_refuse_dualpipe_but_run_dualpipev():
    from k3sim.pipeline import EncoderWork

    enc = EncoderWork.uniform(8, 0.5)
    with pytest.raises(InputError, match="--encoder-policy"):
        run_pipeline(build_schedule("dualpipe", 4, 8), chunk_costs(8, 1.0, 1.0, 1.0), enc, "bubble")
    res = run_pipeline(build_schedule("dualpipev", 4, 8), chunk_costs(8, 1.0, 1.0, 1.0), enc, "bubble")
    assert res.step_time_s >= res.text_step_time_s > 0


@pytest.mark.parametrize("name,p,m", [("dualpipe", 4, 8), ("dualpipev", 3, 7)])
def test_dual_timeline_respects_dependencies_with_sends(name, p, m):
    s = build_schedule(name, p, m)
    prog = text_program(s, chunk_costs(2 * p, 0.7, 1.1, 0.4, 0.2, 0.3, send=0.3)).program
    tl = simulate(prog)
    for order in prog.orders:
        for a, b in zip(order, order[1:]):
            assert tl.start[b] >= tl.finish[a] - 1e-12
    for op in range(prog.num_ops):
        for dep, remote in prog.deps[op]:
            assert tl.start[op] >= (tl.arrival[dep] if remote else tl.finish[dep]) - 1e-12
