"""The derived and datasheet profiles through the commands that take a profile name (issue 21 item 6):
`k3sim kernel-time ... --hardware h800`, `k3sim decode --hardware h100-sxm`."""

from __future__ import annotations

import pytest


def test_kernel_time_on_a_derived_profile(cli_json):
    args = ("kernel-time", "mla_decode", "--set", "B=16", "--set", "C=131072", "--set", "H=16")
    h200 = cli_json(*args, "--hardware", "h200")
    h800 = cli_json(*args, "--hardware", "h800")
    assert h800["hardware"] == "h800" and h800["source"].startswith("derived from h200 (memory-bound")
    assert h800["seconds"] / h200["seconds"] == pytest.approx(4.8 / 3.35, rel=0.01)
    sheet = cli_json(*args, "--hardware", "h800-datasheet")
    assert sheet["source"] == "datasheet-roofline" and sheet["seconds"] < h200["seconds"]


def test_decode_on_derived_and_datasheet_h100(cli_json):
    """Derived: every row says derived, slower than the H200 (HBM 3.35 against 4.8 TB/s) but by no more than the
    HBM ratio; the datasheet-only profile is the roofline lower bound, faster than the measured H200."""
    h200, derived, sheet = (cli_json("decode", "--hardware", hw) for hw in ("h200", "h100-sxm", "h100-sxm-datasheet"))
    assert h200["tpot_s"] < derived["tpot_s"] <= h200["tpot_s"] * 4.8 / 3.35
    assert sheet["tpot_s"] < h200["tpot_s"]
    assert derived["datasheet_share_of_step"] == 0.0 and sheet["datasheet_share_of_step"] == 1.0
    for row in derived["breakdown"]:
        assert "derived from h200 (" in row["source"], row
