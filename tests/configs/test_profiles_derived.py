"""Derived hardware profiles (issue 21 item 6): `h100-sxm` and `h800` take their kernel times from the H200's
measurements (`derived_from`), the datasheet-only profiles stay loadable by name, and the schema's and the
source's rules refuse what the derivation cannot stand on."""

from __future__ import annotations

import pytest
import yaml

from k3sim.configs import load_hardware
from k3sim.configs.hardware import DATASHEET_FIELDS
from k3sim.configs.loaders import HARDWARE_DIR
from k3sim.configs.profiles import derived_source, measured_dir
from k3sim.errors import InputError

PAIRS = [("h100-sxm", "h100-sxm-datasheet"), ("h800", "h800-datasheet")]


@pytest.mark.parametrize("derived, datasheet", PAIRS)
def test_derived_and_datasheet_profiles_share_every_datasheet_figure(derived, datasheet):
    d, s = load_hardware(derived), load_hardware(datasheet)
    assert (d.name, s.name) == (derived, datasheet)
    assert {f: getattr(d, f) for f in DATASHEET_FIELDS} == {f: getattr(s, f) for f in DATASHEET_FIELDS}
    assert d.hbm_bytes == 80e9  # the target's capacity, not the H200's 141 GB
    assert d.derived_from.profile == "h200" and s.derived_from is None
    assert d.calibration_dir is None and s.calibration_dir is None


@pytest.mark.parametrize("name", ["h100-sxm", "h800"])
def test_derived_profile_says_what_the_derivation_ignores(name):
    ignores = load_hardware(name).derived_from.ignores
    topics = {line.split(":")[0] for line in ignores}
    assert {"clocks", "HBM", "L2", "NVLink", "host", "scale-out"} <= topics
    if name == "h800":  # the one link that differs from the source's
        assert any("400 GB/s" in line and "900" in line for line in ignores)


def test_derived_profile_has_no_measured_dir_of_its_own():
    """Validation, `calibrate` and the KCP parts ask `measured_dir`: a derived profile has none (its rows are the
    H200's, rescaled, and must not be validated against or written into as if they were its own)."""
    h100 = load_hardware("h100-sxm")
    assert measured_dir(h100) is None
    assert derived_source(h100).name == "h200"
    assert derived_source(load_hardware("h200")) is None


def _write(tmp_path, base: str, **changes) -> object:
    data = yaml.safe_load((HARDWARE_DIR / f"{base}.yaml").read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    p = tmp_path / f"{data['name']}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("changes, needle", [
    ({"calibration_dir": "measured/h200"}, "exclude each other"),
    ({"derived_from": {"profile": "h100-sxm", "ignores": ["x"]}}, "names the profile itself"),
    ({"derived_from": {"profile": "h200", "ignores": []}}, "ignores"),
    ({"derived_from": {"profile": "h200"}}, "ignores"),
])
def test_schema_refuses_a_derivation_it_cannot_stand_on(tmp_path, changes, needle):
    with pytest.raises(InputError) as err:
        load_hardware(_write(tmp_path, "h100-sxm", **changes))
    assert needle in str(err.value) and "derived_from" in str(err.value) + str(err.value.field)


@pytest.mark.parametrize("source, needle", [
    ("h800", "itself a derived profile"),               # a chain would compound the rescaling
    ("b200", "has no measured data"),                   # uncalibrated: nothing to rescale
])
def test_source_must_be_a_measured_profile(tmp_path, source, needle):
    hw = load_hardware(_write(tmp_path, "h100-sxm", name="h100-test",
                              derived_from={"profile": source, "ignores": ["x"]}))
    with pytest.raises(InputError) as err:
        derived_source(hw)
    assert needle in err.value.reason and err.value.field == "derived_from"


def test_source_must_have_the_same_compute(tmp_path):
    """Compute-bound times are kept: only between GPUs of one compute configuration (B200 peaks differ)."""
    hw = load_hardware(_write(tmp_path, "b200", name="b200-test", derived_from={"profile": "h200", "ignores": ["x"]}))
    with pytest.raises(InputError) as err:
        derived_source(hw)
    assert "compute differs" in err.value.reason and err.value.field == "derived_from"
