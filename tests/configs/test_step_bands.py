"""Error bands from the whole-step checks (k3sim.configs.bands): the envelope rule on a hand-built table, the family
and pooled choice, the wide datasheet band of a profile without measured kernels and the words that say so, the
carried band of a derived profile, and bad tables refused in one line."""

from __future__ import annotations

import pytest

from k3sim.configs import load_hardware
from k3sim.configs.bands import Band, read_rows, step_band
from k3sim.errors import InputError


def _check(error, family="m", kind="decode", basis="measured", used=True, config=None):
    return {"profile": "h200", "basis": basis, "kind": kind, "family": family, "config": config or f"{family}-cfg",
            "run": "run-a", "point": "B=1", "measured_s": 1.0, "predicted_s": 1.0 + error, "error": error,
            "used": used, "note": ""}


TABLE = [_check(-0.20), _check(-0.05), _check(+0.10), _check(-0.90, used=False),  # unused: host-bound, say
         _check(-0.50, family="n"), _check(-0.30, kind="train"),
         _check(-0.80, basis="datasheet"), _check(-0.50, basis="datasheet")]


def test_the_band_is_the_envelope_of_the_family_checks():
    b = step_band(load_hardware("h200"), "decode", "m", rows=TABLE)
    # errors -0.20, -0.05, +0.10 (the -0.90 row is not used): measured = predicted / (1 + e)
    assert b.checks == 3 and b.family == "m" and b.calibration == "measured"
    assert b.low_factor == pytest.approx(1 / 1.10) and b.high_factor == pytest.approx(1 / 0.80)
    lo, hi = b.times(0.033)
    assert lo == pytest.approx(0.030) and hi == pytest.approx(0.04125)
    lo, hi = b.rates(100.0)  # a rate inverse to the step time
    assert lo == pytest.approx(80.0) and hi == pytest.approx(110.0)
    assert "3 decode checks of m on h200" in b.describe() and "-20.0 % to +10.0 %" in b.describe()


def test_an_unchecked_model_pools_every_family_and_says_so():
    b = step_band(load_hardware("h200"), "decode", "x", rows=TABLE)
    assert b.family is None and b.checks == 4 and b.families == ("m", "n")
    assert b.high_factor == pytest.approx(2.0) and b.low_factor == pytest.approx(1 / 1.10)
    assert "x has no decode check of its own" in b.describe()


def test_a_one_sided_error_keeps_the_figure_inside_its_band():
    b = step_band(load_hardware("h200"), "train", "m", rows=TABLE)  # one check, -30 %: the model read low
    assert b.low_factor == 1.0 and b.high_factor == pytest.approx(1 / 0.7)
    assert b.times(10.0) == (10.0, pytest.approx(10 / 0.7))
    assert step_band(load_hardware("h200"), "prefill", "m", rows=TABLE) is None  # no check of the kind


def test_a_profile_without_measured_kernels_gets_the_wide_datasheet_band_and_says_so():
    b = step_band(load_hardware("b200"), "decode", "m", rows=TABLE)
    assert b.basis == "datasheet" and b.calibration == "uncalibrated" and b.checks == 2
    assert b.high_factor == pytest.approx(1 / 0.2) and b.low_factor == 1.0  # errors -80 % and -50 %
    text = b.describe()
    assert "b200 has no measured kernels (datasheet figures only), so the band is wide" in text
    assert "predicted from datasheet figures alone" in text


def test_the_committed_table_gives_datasheet_profiles_a_wider_band_than_h200():
    ds, h200 = (step_band(load_hardware(h), "decode", "kimi-k3") for h in ("b200", "h200"))
    assert ds.calibration == "uncalibrated" and h200.calibration == "measured"
    assert ds.high_factor > 2 * h200.high_factor and h200.family == "kimi-k3" and h200.checks > 40


def test_a_derived_profile_carries_the_measured_band_and_says_so():
    b = step_band(load_hardware("h100-sxm"), "decode", "kimi-k3")
    h200 = step_band(load_hardware("h200"), "decode", "kimi-k3")
    assert b.calibration == "carried" and (b.low_factor, b.high_factor) == (h200.low_factor, h200.high_factor)
    assert "carried from h200: h100-sxm's kernels are h200's measurements rescaled" in b.describe()


def test_a_file_that_is_not_a_band_table_is_refused_naming_it(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("profile,kind\nh200,decode\n")
    with pytest.raises(InputError) as e:
        read_rows(bad)
    assert str(bad) in str(e.value) and "not a band table" in str(e.value)


def test_band_json_names_its_checks():
    b = Band(kind="decode", model="m", hardware="h200", profile="h200", basis="measured", calibration="measured",
             family="m", checks=2, error_min=-0.2, error_max=0.0, families=("m",), configs=("c",), runs=("r",))
    j = b.to_json()
    assert j["high_factor"] == pytest.approx(1.25) and j["low_factor"] == 1.0 and j["source"] == b.describe()
