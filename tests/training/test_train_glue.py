"""The training glue in the step model (`training.moe_glue`): auto follows the model's published training stack
and says so in the assumption row; a profile without its own glue calibration says "carried from h200" in the
assumption row and in every compute row whose seconds include the glue."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from memory_toys import toy_model  # noqa: E402

from k3sim.configs import load_hardware  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.predict import predict_kernel_time  # noqa: E402
from k3sim.training import TrainOptions, train_step  # noqa: E402

COMPUTE_ROWS = ("compute: forward", "compute: backward", "compute: recompute (activation checkpointing)")


def run(hw, mode, fused_stack=False):
    model = toy_model().model_copy(update={"training_stack_fused_permute": fused_stack})
    return train_step(model, load_hardware(hw), Parallelism(tp=2, ep=2), seq_len=4096, num_micro_batches=2,
                      kernel_time=predict_kernel_time, options=TrainOptions(moe_glue=mode), with_memory=False)


def glue_row(r):
    rows = [a for a in r.assumptions if "moe_glue" in a["assumption"] or "HBM-copy time" in a["assumption"]]
    assert len(rows) == 1
    return rows[0]


def test_auto_is_fused_for_a_model_whose_stack_fuses_the_permute_and_calibrated_otherwise():
    fused_stack = {m: run("h200", m, fused_stack=True) for m in ("auto", "fused", "calibrated", "proxy")}
    plain_stack = {m: run("h200", m) for m in ("auto", "calibrated")}
    assert fused_stack["auto"].step_time_s == fused_stack["fused"].step_time_s
    # the measured fused kernels sit between the bytes-only copy and the x11 unfused glue they replace
    t = {m: r.step_time_s for m, r in fused_stack.items()}
    assert t["proxy"] < t["fused"] < t["calibrated"]
    assert plain_stack["auto"].step_time_s == plain_stack["calibrated"].step_time_s
    row = glue_row(fused_stack["auto"])["assumption"]
    assert row.startswith("training.moe_glue: auto -> fused: toy's published training stack uses fused permute")
    from k3sim.step.glue import fused_source

    # the kernels it names: ours where measured on the profile, the dispatch kernels otherwise
    assert fused_source(load_hardware("h200")) in row and "the gated norm and the AttnRes read a plain proxy" in row
    assert glue_row(plain_stack["auto"])["assumption"].startswith("training.moe_glue: auto -> calibrated")
    # an explicit mode carries no "auto" clause
    assert not glue_row(fused_stack["fused"])["assumption"].startswith("training.moe_glue: auto")


@pytest.mark.parametrize("hw", ["h800", "h100-sxm"])
@pytest.mark.parametrize("mode", ["calibrated", "fused"])
def test_carried_glue_is_labelled_in_the_assumption_row_and_every_compute_row(hw, mode):
    r = run(hw, mode)
    assert f"carried from h200 to profile '{hw}'" in glue_row(r)["source"]
    rows = [b for b in r.breakdown if b.component in COMPUTE_ROWS]
    assert {b.component for b in rows} >= {"compute: forward", "compute: backward"}
    for b in rows:
        assert "carried from h200" in b.source, (b.component, b.source)
    own = run("h200", mode)
    assert not any("carried" in b.source for b in own.breakdown) and "carried" not in glue_row(own)["source"]
