"""Hardware profiles: datasheet numbers with sources, dense (not sparsity-doubled) FLOP/s."""

from __future__ import annotations

import pytest

from k3sim.configs import load_hardware
from k3sim.configs.hardware import DATASHEET_FIELDS
from k3sim.configs.loaders import hardware_names
from k3sim.errors import InputError

PROFILES = ["h100-sxm", "h800", "h200", "b200", "gb200-nvl72"]


def test_all_profiles_shipped():
    assert set(PROFILES) <= set(hardware_names())


@pytest.mark.parametrize("name", PROFILES)
def test_profile_has_sources(name):
    hw = load_hardware(name)
    assert hw.name == name
    assert all(hw.sources.get(f) for f in DATASHEET_FIELDS)
    # Dense bf16 peak: fp8 is twice bf16 on Hopper/Blackwell; a sparsity-doubled sheet would give 2x.
    assert hw.peak_flops_per_s["fp8"] == pytest.approx(2 * hw.peak_flops_per_s["bf16"], rel=0.01)


@pytest.mark.parametrize("name", PROFILES)
def test_every_peak_flops_dtype_is_named_in_its_source(name):
    """Each dtype's peak figure is traceable: its source line names that dtype."""
    hw = load_hardware(name)
    source = hw.sources["peak_flops_per_s"].lower()
    missing = [dtype for dtype in hw.peak_flops_per_s if dtype.lower() not in source]
    assert not missing, f"{name}: peak_flops_per_s source does not cover {missing}"


def test_h200_numbers():
    hw = load_hardware("h200")
    assert hw.hbm_bytes == 150_109_880_320 and hw.hbm_bandwidth_bytes_per_s == 4.8e12
    assert hw.peak_flops_per_s["bf16"] == 989e12  # not the 1,979 "with sparsity"
    assert hw.scaleup_bandwidth_bytes_per_s == 450e9  # 900 GB/s bidirectional / 2
    assert hw.num_sms == 132 and hw.calibration_dir == "measured/h200"


def test_h800_nvlink_cut():
    assert load_hardware("h800").scaleup_bandwidth_bytes_per_s < load_hardware("h100-sxm").scaleup_bandwidth_bytes_per_s
    # 400 GB/s bidirectional / 2 against H100's 900 / 2; same HBM and Tensor Cores as H100 SXM.
    assert load_hardware("h800").scaleup_bandwidth_bytes_per_s == 200e9
    assert load_hardware("h100-sxm").scaleup_bandwidth_bytes_per_s == 450e9
    assert load_hardware("h800").peak_flops_per_s == load_hardware("h100-sxm").peak_flops_per_s


@pytest.mark.parametrize("name, hbm, bf16, nvlink, sms", [
    ("b200", 180e9, 2250e12, 900e9, 148),         # DGX B200 1,440 GB / 8; NVLink 5 1.8 TB/s / 2
    ("gb200-nvl72", 186e9, 2500e12, 900e9, 148),  # 13.4 TB / 72; 1200 W dense table
])
def test_blackwell_numbers(name, hbm, bf16, nvlink, sms):
    hw = load_hardware(name)
    assert (hw.hbm_bytes, hw.peak_flops_per_s["bf16"], hw.scaleup_bandwidth_bytes_per_s, hw.num_sms) == (
        hbm, bf16, nvlink, sms)
    assert hw.peak_flops_per_s["mxfp4"] == 4 * hw.peak_flops_per_s["bf16"]  # FP4 = 2 x FP8 = 4 x BF16


def test_profile_by_path(root):
    assert load_hardware(root / "hardware_profiles/b200.yaml").num_sms == 148


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(InputError, match="h200"):
        load_hardware("h300")


def test_missing_source_rejected(tmp_path, root):
    text = (root / "hardware_profiles/h200.yaml").read_text().replace("  num_sms: GH100", "  other: GH100")
    p = tmp_path / "hw.yaml"
    p.write_text(text)
    with pytest.raises(InputError) as err:
        load_hardware(p)
    assert "num_sms" in str(err.value) and str(p) in str(err.value)
