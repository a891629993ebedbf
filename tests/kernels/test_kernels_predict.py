"""predict_kernel_time: measured, interpolated, model and datasheet-roofline answers."""

from __future__ import annotations

import pytest
from conftest import HBM_BW, PEAK, hardware, true_seconds

from k3sim.errors import InputError
from k3sim.kernels import KernelTime
from k3sim.predict import predict_kernel_time


def test_exact_hit_is_measured(synth):
    p = dict(M=64, N=7168, K=2048)
    kt = predict_kernel_time("gemm_bf16", p, synth.hw)
    assert isinstance(kt, KernelTime)
    assert kt.source == "measured"
    assert kt.seconds == pytest.approx(true_seconds("gemm_bf16", p, 0.03), rel=1e-6)


@pytest.mark.parametrize("p", [dict(M=96, N=7168, K=2048), dict(M=3000, N=4096, K=4096), dict(M=24, N=5000, K=3000)])
def test_inside_range_is_interpolated_and_close(synth, p):
    kt = predict_kernel_time("gemm_bf16", p, synth.hw)
    assert kt.source == "interpolated"
    assert kt.seconds == pytest.approx(true_seconds("gemm_bf16", p, 0.03), rel=0.03)


def test_collective_inside_range(synth):
    p = dict(bytes=3 * 2 ** 20, gpus=2)
    kt = predict_kernel_time("all_gather", p, synth.hw)
    assert kt.source == "interpolated"
    assert kt.seconds == pytest.approx(true_seconds("all_gather", p, 0.03), rel=0.03)


def test_outside_range_is_model(synth):
    p = dict(M=65536, N=7168, K=2048)
    kt = predict_kernel_time("gemm_bf16", p, synth.hw)
    assert kt.source == "model" and "M=65536" in kt.detail
    assert kt.seconds == pytest.approx(true_seconds("gemm_bf16", p, 0.0), rel=0.07)  # +-3 % wiggle at both ends
    big = predict_kernel_time("hbm_copy", dict(bytes=2 ** 36), synth.hw)
    assert big.source == "model"
    assert big.seconds == pytest.approx(2 * 2 ** 36 / (0.9 * HBM_BW), rel=0.05)


def test_collective_on_unmeasured_gpu_count_is_the_ring_model(synth):
    """The synthetic 2-GPU truth is alpha 15 us (one ring step) and bus bandwidth 350 GB/s (77.8 % of the
    450 GB/s link); the one collective model (k3sim.comm) carries both to other counts by ring steps."""
    p8 = predict_kernel_time("all_gather", dict(bytes=2 ** 30, gpus=8), synth.hw)
    assert (p8.source, p8.method) == ("model", "ring")
    # 7 ring steps of 15 us, (8-1) x 1 GiB on the wire at 350 GB/s
    # (the fit of the 3 %-wiggled 2-GPU rows lands within 0.5 % of the truth: 1 % is the bound)
    assert p8.seconds == pytest.approx(7 * 15e-6 + 7 * 2 ** 30 / 350e9, rel=0.01)
    p16 = predict_kernel_time("all_gather", dict(bytes=2 ** 30, gpus=16), synth.hw)
    # leaves the 8-GPU NVLink domain: the ring's narrowest hop is the 50 GB/s NIC at the same fraction
    assert "scale-out" in p16.detail
    assert p16.seconds == pytest.approx(15 * 15e-6 + 15 * 2 ** 30 / (350e9 * 50e9 / 450e9), rel=0.01)
    # 1 KiB: the latency term decides, so the step count is what is checked (7 and 15 ring steps of 15 us)
    for n, bw in ((8, 350e9), (16, 350e9 * 50e9 / 450e9)):
        small = predict_kernel_time("all_gather", dict(bytes=1024, gpus=n), synth.hw)
        assert small.seconds == pytest.approx((n - 1) * 15e-6 + (n - 1) * 1024 / bw, rel=0.01)


def test_uncalibrated_profile_is_datasheet_roofline():
    hw = hardware(None, name="bare")
    p = dict(M=64, N=7168, K=2048)
    kt = predict_kernel_time("gemm_bf16", p, hw)
    assert kt.source == "datasheet-roofline" and "uncalibrated" in kt.detail
    mem = 2 * (64 * 2048 + 2048 * 7168 + 64 * 7168) / HBM_BW
    assert kt.seconds == pytest.approx(max(2 * 64 * 7168 * 2048 / PEAK["bf16"], mem))
    coll = predict_kernel_time("all_reduce", dict(bytes=2 ** 20, gpus=4), hw)
    assert coll.seconds == pytest.approx(2 * 3 / 4 * 2 ** 20 / 450e9)


def test_unmeasured_op_on_calibrated_profile_falls_back(synth):
    kt = predict_kernel_time("sdpa_causal_fwd", dict(T=4096, H=32, D=128), synth.hw)
    assert kt.source == "datasheet-roofline" and "no successful measurement" in kt.detail
    assert kt.seconds == pytest.approx(2 * 4096 ** 2 * 32 * 128 / PEAK["bf16"])


def test_failed_rows_are_never_used(synth):
    # the synthetic run has a failed row at M=N=K=2^20: it must not be an exact hit
    kt = predict_kernel_time("gemm_bf16", dict(M=2 ** 20, N=2 ** 20, K=2 ** 20), synth.hw)
    assert kt.source == "model"


def test_bad_input(synth):
    with pytest.raises(InputError, match="unknown op"):
        predict_kernel_time("gemm_bf17", dict(M=1), synth.hw)
    with pytest.raises(InputError, match="missing"):
        predict_kernel_time("chunk_kda_fwd", dict(T=4096), synth.hw)
    with pytest.raises(InputError, match="allowed range"):
        predict_kernel_time("recurrent_kda_decode", dict(B=1, T=65, H=1), synth.hw)
    with pytest.raises(InputError, match="hardware"):
        predict_kernel_time("gemm_bf16", dict(M=1, N=1, K=1), 42)


def test_named_profile_through_configs():
    """The shipped h200 profile is calibrated: a 1 GiB read rests on the committed measurements, takes at
    least the datasheet time (4.8 TB/s) and no more than twice it (a streaming read reaches > 50 %)."""
    kt = predict_kernel_time("hbm_read", {"bytes": 2 ** 30}, "h200")
    assert kt.source in ("measured", "interpolated")
    assert 2 ** 30 / 4.8e12 < kt.seconds < 2 * 2 ** 30 / 4.8e12


def test_missing_calibration_dir_is_an_error(tmp_path):
    """A profile naming a calibration_dir that is not there must not fall back to datasheet times."""
    hw = hardware(tmp_path / "typo", name="bare")
    with pytest.raises(InputError) as e:
        predict_kernel_time("hbm_copy", dict(bytes=2 ** 20), hw)
    assert e.value.field == "calibration_dir" and "typo" in str(e.value)


def test_other_head_dim_scales_from_128_and_says_so(synth):
    """No KDA measurement in the synthetic store: the datasheet roofline's ratio scales the 128 answer;
    chunk_kda_fwd is memory-bound there, so the ratio is the bytes ratio, worked by hand:
    per token-head (3K + 2V) x 2 + 2 bytes, plus the K x V fp32 state per head."""
    p = dict(T=4096, H=12)
    base = predict_kernel_time("chunk_kda_fwd", p, synth.hw)
    half = predict_kernel_time("chunk_kda_fwd", dict(p, K=64, V=64), synth.hw)
    assert half.source == "extrapolated" and "K=64, V=64" in half.detail
    by_hand = (4096 * 12 * (5 * 64 * 2 + 2) + 12 * 64 * 64 * 4) / (4096 * 12 * (5 * 128 * 2 + 2) + 12 * 128 * 128 * 4)
    assert half.seconds / base.seconds == pytest.approx(by_hand, rel=1e-9)
    with pytest.raises(InputError) as e:
        predict_kernel_time("chunk_kda_fwd", dict(p, K=0), synth.hw)
    assert e.value.field == "K"
