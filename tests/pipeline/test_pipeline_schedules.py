"""Bubble formulas with uniform costs and free transfers, and schedule validity."""

from __future__ import annotations

import pytest

from k3sim.errors import InputError
from k3sim.pipeline import build_schedule, simulate, text_program, uniform_costs, validate_schedule
from k3sim.pipeline.result import run_pipeline


def bubble(name: str, p: int, m: int, v: int = 1, F: float = 1.0, B: float = 2.0, W=None) -> float:
    s = build_schedule(name, p, m, v)
    res = run_pipeline(s, uniform_costs(p, v, F, B, W))
    return res.bubble_ratio


@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 8), (8, 8), (8, 32), (16, 16), (3, 7)])
def test_1f1b_and_gpipe_bubble_is_p_minus_1_over_m(p, m):
    assert bubble("1f1b", p, m) == pytest.approx((p - 1) / m, rel=1e-12)
    assert bubble("gpipe", p, m) == pytest.approx((p - 1) / m, rel=1e-12)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2), (8, 16, 3), (8, 64, 4)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, m, v):
    assert bubble("interleaved-1f1b", p, m, v) == pytest.approx((p - 1) / (v * m), rel=1e-9)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32), (6, 12)])
def test_zb_h1_bubble_is_a_third_with_equal_f_b_w(p, m):
    # F = B = W = 1: --uniform-costs F,B means B splits into B/2 + W/2, so F,B = 1,2
    assert bubble("zb-h1", p, m, F=1.0, B=2.0) == pytest.approx((p - 1) / (3 * m), rel=1e-12)
    assert bubble("zb-h1", p, m, F=1.0, B=1.0, W=1.0) == pytest.approx((p - 1) / (3 * m), rel=1e-12)


def test_zb_h1_beats_1f1b_and_interleaved_beats_1f1b_with_unequal_costs():
    p, m = 8, 24
    assert bubble("zb-h1", p, m, F=1.0, B=3.0) < bubble("1f1b", p, m, F=1.0, B=3.0)
    assert bubble("interleaved-1f1b", p, m, 2, F=1.0, B=3.0) < bubble("1f1b", p, m, F=1.0, B=3.0)


def test_step_time_hand_worked_1f1b():
    # p=3, m=2, F=1, B=2, worked by hand: stage 2 runs F0 [2,3] B0 [3,5] F1 [5,6] B1 [6,8];
    # stage 1 B0 [5,7] B1 [8,10]; stage 0 B0 [7,9] B1 [10,12] -> 12 = (m + p - 1)(F + B)
    s = build_schedule("1f1b", 3, 2)
    tl = simulate(text_program(s, uniform_costs(3, 1, 1.0, 2.0)).program)
    assert tl.step_time_s == pytest.approx(12.0)


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 6, 1), ("1f1b", 4, 3, 1), ("1f1b", 5, 9, 1),
                                        ("interleaved-1f1b", 4, 8, 3), ("zb-h1", 5, 3, 1), ("zb-h1", 4, 10, 1)])
def test_schedules_are_valid_dags_with_every_op_once(name, p, m, v):
    validate_schedule(build_schedule(name, p, m, v))


def test_validate_catches_a_deadlocking_order():
    s = build_schedule("1f1b", 2, 2)
    last = s.orders[1]                                  # F10 B10 F11 B11
    assert [op[0] for op in last[:2]] == [0, 1]
    from dataclasses import replace

    bad = replace(s, orders=(s.orders[0], (last[1], last[0]) + last[2:]))  # B10 before its own F10
    with pytest.raises(ValueError):
        validate_schedule(bad)


@pytest.mark.parametrize("args,option", [(("interleaved-1f1b", 4, 6, 2), "--microbatches"),
                                         (("interleaved-1f1b", 4, 8, 0), "--virtual"),
                                         (("1f1b", 4, 8, 2), "--virtual"),
                                         (("1f1b", 0, 8, 1), "--stages"),
                                         (("nope", 4, 8, 1), "--schedule")])
def test_bad_shapes_raise_input_error_naming_the_option(args, option):
    with pytest.raises(InputError) as e:
        build_schedule(*args)
    assert option in str(e.value)
