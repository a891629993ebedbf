"""The serving whole-step check (`validation/decode_step.py`) on committed H200 data: predictions exist for
every measured point, the graph replay costs at least its kernels, and the kernel families the predictor
names match the profiler."""

import pytest

from k3sim.files import project_root
from k3sim.step.families import OTHER, kernel_family
from k3sim.validation.decode_step import PREDICTIONS, RUN, check_tables, manifest_call

RUN = project_root() / RUN
PRED = project_root() / PREDICTIONS


def test_kernel_families_by_name():
    assert kernel_family("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9x") == "routed experts"
    assert kernel_family("fused_recurrent_kda_fwd_kernel") == "KDA kernel"
    assert kernel_family("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT") == "GEMMs"
    assert kernel_family("_split_kernel") == "MLA attention"
    assert kernel_family("void at::native::radixSortKVInPlace<-2, -1, 16, 2, long>") == OTHER


def test_manifest_calls_map_runtime_shapes():
    c = manifest_call("bmm_bf16", {"batch": 32, "M": 64, "N": 512, "K": 128})
    assert (c.op, dict(c.params)) == ("gemm_bf16", {"M": 64, "N": 32 * 512, "K": 128})
    c = manifest_call("moe_permute", {"T": 64, "topk": 16, "rows": 212, "D": 3584})
    assert c.proxy_bytes == 2 * 212 * 3584 * 2  # compacted rows, not T x topk
    c = manifest_call("silu_mul", {"T": "64x2", "N": 3072})
    assert dict(c.params) == {"T": 128, "N": 3072}


@pytest.fixture(scope="module")
def tables():
    return check_tables(PRED, RUN)


def test_every_measured_point_has_both_predictions(tables):
    steps, _ = tables
    assert len(steps) == 33 + 36 + 20
    assert steps[["predicted_model_s", "predicted_manifest_s", "seconds"]].notna().all().all()


def test_graph_replay_costs_at_least_its_kernels(tables):
    steps, _ = tables
    dec = steps[(steps.part == "decode") & steps.profiled_kernel_sum_s.notna()]
    assert len(dec) == 8
    ratio = dec.seconds / dec.profiled_kernel_sum_s
    assert (ratio > 0.99).all() and (ratio < 1.20).all()


def test_routed_experts_predicted_within_fifteen_percent_of_the_profiler(tables):
    _, fams = tables
    f = fams[(fams.family == "routed experts") & (fams.part == "decode") & (fams.B >= 8)]
    assert len(f) == 6
    assert ((f.predicted_s / f.profiled_s - 1).abs() < 0.15).all()


def test_run_b_out_of_sample_points_were_predicted_before_and_mostly_land_within_ten_percent():
    import pandas as pd

    d = pd.read_csv(project_root() / "reports/decode/wholestep_check_b.csv")
    assert len(d) == 29  # Kimi-Linear B=192 at 32K did not fit beside the weights
    err = d.error_glue_calibrated.abs()
    assert err[d.config == "kimi-linear-48b"].max() < 0.07
    assert (err <= 0.10).sum() >= 26
