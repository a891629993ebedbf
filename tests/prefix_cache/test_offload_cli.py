"""`k3sim prefix-cache --host-pool-bytes / --ssd-pool-bytes` and `--offload-report`: the tier in the replay's
JSON, bad input as one line naming the option (exit 2), the report's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers_pc import run_main

ROOT = Path(__file__).resolve().parents[2]
HEAD = ROOT / "tests" / "data" / "traces" / "conversation_head300.jsonl"
BASE = ("prefix-cache", "--trace", HEAD, "--model", ROOT / "models/kimi-k3.yaml", "--tp", "8", "--policy", "k3",
        "--capacity-bytes", "20e9")


def test_the_replay_json_splits_the_hit_by_tier_and_prices_the_restores(capsys):
    code, out, err = run_main(capsys, *BASE, "--host-pool-bytes", "256e9", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["host_pool_bytes"] == 256e9 and d["host_link_bytes_per_s"] == 55.05e9
    assert d["token_hit_rate_gpu"] + d["token_hit_rate_host"] == pytest.approx(d["token_hit_rate"])
    assert d["token_hit_rate_host"] > 0 and d["host_restore_bytes"] > 0
    assert d["host_restore_s"] == pytest.approx(d["host_restore_bytes"] / 55.05e9)
    assert d["offload"]["host"]["restored_bytes"] == d["host_restore_bytes"]
    code, out, _ = run_main(capsys, *BASE, "--json")
    off = json.loads(out)
    assert off["offload"] == {} and off["token_hit_rate_gpu"] == off["token_hit_rate"]
    assert off["token_hit_rate"] < d["token_hit_rate"]


def test_an_ssd_tier_under_host_memory(capsys):
    code, out, err = run_main(capsys, *BASE, "--host-pool-bytes", "2e9", "--ssd-pool-bytes", "1e12",
                              "--ssd-bytes-per-s", "6e9", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["offload"]["ssd"]["bandwidth_bytes_per_s"] == 6e9 and d["ssd_restore_bytes"] > 0
    assert d["ssd_restore_s"] == pytest.approx(d["ssd_restore_bytes"] / 6e9)
    assert d["token_hit_rate_gpu"] + d["token_hit_rate_host"] + d["token_hit_rate_ssd"] == pytest.approx(
        d["token_hit_rate"])


def _b200_scenario(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "scenarios" / "default.yaml").read_text())
    doc.update(hardware="b200", model=str(ROOT / "models" / "kimi-k3.yaml"))
    path = tmp_path / "b200.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("extra,option,text", [
    (("--host-pool-bytes", "-1"), "--host-pool-bytes", "finite number of bytes >= 0"),
    (("--host-pool-bytes", "nan"), "--host-pool-bytes", "finite number of bytes >= 0"),
    (("--host-pool-bytes", "1e12", "--sweep"), "--host-pool-bytes", "a sweep varies the GPU pool alone"),
    (("--ssd-bytes-per-s", "1e9"), "--ssd-bytes-per-s", "there is no SSD tier"),
    (("--ssd-pool-bytes", "1e12"), "--ssd-pool-bytes", "needs its read bandwidth"),
    (("--ssd-pool-bytes", "inf", "--ssd-bytes-per-s", "1e9"), "--ssd-pool-bytes", "finite number of bytes"),
])
def test_bad_offload_options_are_one_line_naming_the_option(capsys, extra, option, text):
    code, _, err = run_main(capsys, *BASE, *extra)
    assert code == 2, err
    line = err.strip()
    assert "\n" not in line and line.startswith(f"error: {option}:") and text in line


def test_a_host_tier_on_a_profile_without_a_host_link_or_over_an_unbounded_pool_is_refused(capsys, tmp_path):
    code, _, err = run_main(capsys, *BASE, "--host-pool-bytes", "1e12", "--step-scenario", _b200_scenario(tmp_path))
    assert code == 2 and err.strip().startswith("error: --host-pool-bytes:") and "'b200' has no host link" in err
    code, _, err = run_main(capsys, "prefix-cache", "--trace", HEAD, "--host-pool-bytes", "1e12")
    assert code == 2 and err.strip().startswith("error: --host-pool-bytes:") and "unbounded pool" in err


def test_the_offload_report_writes_its_table_and_csv(capsys, tmp_path):
    """On the trace's first 150 requests (the committed report runs the whole trace): every model x view x host
    size, plus the unbounded GPU pool."""
    import pandas as pd

    code, out, err = run_main(capsys, "prefix-cache", "--offload-report", "--out", tmp_path, "--limit", "150",
                              "--json")
    assert code == 0, err
    d = json.loads(out)
    df = pd.read_csv(tmp_path / "offload.csv")
    assert len(df) == len(d["rows"]) == 2 * 2 * 5
    assert set(df["view"]) == {"serve", "replay"} and set(df["model"]) == {"kimi-k3", "qwen3-next-80b-a3b"}
    tiered = df[df["host_pool_bytes_per_gpu"] > 0]
    assert (tiered["token_hit_rate_gpu"] + tiered["token_hit_rate_host"] - tiered["token_hit_rate"]).abs().max() < 1e-9
    md = (tmp_path / "offload.md").read_text()
    assert "55.05 GB/s achieved" in md and "| kimi-k3 |" in md
    code, _, err = run_main(capsys, "prefix-cache", "--offload-report", "--out", tmp_path, "--policy", "k3")
    assert code == 2 and err.strip().startswith("error: --policy:")
