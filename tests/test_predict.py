"""The kernel-time facade `k3sim.predict.predict_kernel_time`: collectives go to the one collective model,
every other op to the kernel predictor, and the kernels package answers no collective itself (layers: kernels
and comm sit side by side; the facade is above both)."""

from __future__ import annotations

import pytest

import k3sim.kernels
from k3sim.comm import collective_time
from k3sim.errors import InputError
from k3sim.kernels.ops import OPS
from k3sim.kernels.predict import profile_predictor
from k3sim.predict import predict_kernel_time

COLLECTIVES = [name for name, spec in OPS.items() if spec.kind == "collective"]


def test_the_registry_has_collectives():
    assert len(COLLECTIVES) >= 5, COLLECTIVES  # all_gather, reduce_scatter, all_reduce, all_to_all, send_recv


@pytest.mark.parametrize("op", COLLECTIVES)
@pytest.mark.parametrize("gpus, gpus_per_node", [(2, 0), (8, 0), (16, 0), (4, 2)])
@pytest.mark.parametrize("convention", ["graph", "eager"])
def test_a_collective_is_the_collective_models_answer(op, gpus, gpus_per_node, convention):
    """The collective model's answer itself, seconds, source, detail, method and convention: a CUDA-graph step
    ("graph") asks for the graph-timed series, an eager call for the barrier-started one, and the answer keeps the
    convention of the rows it came from (`k3sim.comm.model.SERIES`; issue 20: never relabelled)."""
    params = {"bytes": 3 * 2 ** 20, "gpus": 2 if op == "send_recv" else gpus, "gpus_per_node": gpus_per_node}
    got = predict_kernel_time(op, params, "h200", convention)
    series = {"graph": "graph", "eager": "barrier"}[convention]
    ref = collective_time(op, params["bytes"], params["gpus"], "h200", gpus_per_node=gpus_per_node or None,
                          convention=series)
    assert got == ref and got.convention in ("graph", "barrier")


@pytest.mark.parametrize("op, params", [
    ("gemm_bf16", {"M": 4096, "N": 4096, "K": 4096}),
    ("hbm_copy", {"bytes": 2 ** 30}),
    ("chunk_kda_fwd", {"T": 32768, "H": 96}),
    ("chunk_kda_fwd", {"T": 8192, "H": 16, "K": 64, "V": 64}),
    ("sdpa_causal_fwd", {"T": 8192, "H": 16, "D": 128}),
])
@pytest.mark.parametrize("convention", ["graph", "eager"])
def test_every_other_op_is_the_kernel_predictors_answer(op, params, convention):
    assert predict_kernel_time(op, params, "h200", convention) == \
        profile_predictor("h200").predict(op, params, convention)


@pytest.mark.parametrize("op", COLLECTIVES)
def test_the_kernel_predictor_refuses_a_collective(op):
    """Kernels hold a collective's points and fits (comm reads them) but never answer one: no second answer."""
    with pytest.raises(ValueError, match="collective"):
        profile_predictor("h200").predict(op, {"bytes": 2 ** 20, "gpus": 2})


def test_kernels_exports_no_kernel_time_function():
    assert not hasattr(k3sim.kernels, "predict_kernel_time")


@pytest.mark.parametrize("op, params, convention, field", [
    ("all_gather", {"bytes": 2 ** 20, "gpus": 8}, "cuda", "convention"),
    ("all_gather", {"bytes": 2 ** 20}, "graph", "gpus"),
    ("all_reduce", {"bytes": 2 ** 20, "gpus": 8, "T": 1}, "graph", "T"),
    ("all_gather_v2", {"bytes": 2 ** 20, "gpus": 8}, "graph", "op"),
])
def test_bad_input_is_refused_before_any_model_runs(op, params, convention, field):
    with pytest.raises(InputError) as err:
        predict_kernel_time(op, params, "h200", convention)
    assert err.value.field == field
