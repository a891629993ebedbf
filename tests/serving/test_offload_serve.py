"""`k3sim serve` with a host-memory tier under each replica's pool (issue 24 item 8): a hit found in host memory
delays the request's first step by its restore; a tier that keeps nothing changes nothing; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from k3sim.serving.run import ServeSetup, simulate
from k3sim.workloads.request import TraceRequest

from serving_helpers import ROOT, constant, linear, scenario  # noqa: F401  (scenario: a fixture)

from tests.conftest import run_cli  # noqa: E402  (the root conftest: a bare `conftest` may be a sub-package's)

HEAD = ROOT / "tests" / "data" / "traces" / "conversation_head300.jsonl"


def _req(t, L, O, first_id):
    return TraceRequest(t, L, O, block_ids=list(range(first_id, first_id + -(-L // 512))))


def _engine(host: float) -> dict:
    # a 0.4 GB pool per GPU (26 pages of 1,024 tokens of K3 at TP8 PP2), one engine: A's pages and checkpoint are
    # evicted by B's 20,000-token prompt
    return {"engine": {"pool_bytes": 0.4e9, "pp_microbatches": False, "host_pool_bytes": host}}


def test_a_host_hit_delays_the_first_step_by_its_restore(scenario):
    """Every step 1 s. A (4,196 tokens) at 0 leaves 4 whole 1,024-token pages of KV and a checkpoint at token
    4,096; B (20,000 tokens) at 10 evicts them into the host tier; A's prompt again at 20: hit 4,096 tokens from
    host memory, restored = 4 pages + one checkpoint (every group's state) over the host link, then one step for
    the 100 tokens left: TTFT = restore + 1 s. Without the tier the same request has no hit and TTFT 1 s (one
    4,196-token chunk in the 8,192-token budget)."""
    reqs = [_req(0.0, 4196, 1, 0), _req(10.0, 20000, 1, 1000), _req(20.0, 4196, 1, 0)]
    setup = ServeSetup.from_scenario(scenario(_engine(1e9)))
    cfg = setup.pools[0].cache
    # capacity and bandwidth are scaled alike by the stage share (whole-model bytes per GPU byte): 55.05 GB/s
    # achieved per GPU (the H200 measurement) for 1 GB per GPU
    assert cfg.host_bandwidth_bytes_per_s / cfg.host_capacity_bytes == pytest.approx(55.05)
    res = simulate(setup, reqs, step_seconds=constant(1.0))
    c = res.frame().set_index("request").loc[2]
    restore_bytes = 4 * cfg.page_bytes + cfg.kda_state_bytes_per_request
    restore_s = restore_bytes / cfg.host_bandwidth_bytes_per_s
    assert c["hit_tokens"] == 4096
    assert c["ttft_s"] == pytest.approx(1.0 + restore_s, rel=1e-9)
    s = res.summary
    assert s["host_restore_bytes"] == restore_bytes and s["host_restore_s"] == pytest.approx(restore_s)
    assert s["requests_restored"] == 1 and s["restore_wait_s_total"] == pytest.approx(restore_s)
    assert s["token_hit_rate_host"] == pytest.approx(4096 / (4196 + 20000 + 4196)) and s["token_hit_rate_gpu"] == 0
    off = simulate(ServeSetup.from_scenario(scenario(_engine(0.0))), reqs, step_seconds=constant(1.0))
    c0 = off.frame().set_index("request").loc[2]
    assert c0["hit_tokens"] == 0 and c0["ttft_s"] == 1.0
    assert "token_hit_rate_host" not in off.summary and off.summary["token_hit_rate_gpu"] == 0.0


def test_a_tier_that_keeps_nothing_changes_no_figure(scenario):
    """A 1-byte host tier per GPU holds no page or checkpoint: every eviction passes it by, so the first 300
    conversation requests serve exactly as with no tier (the offload paths on, nothing restored)."""
    from k3sim.workloads import read_mooncake

    def run(host):
        setup = ServeSetup.from_scenario(scenario({"engine": {"pool_bytes": 4e9, "host_pool_bytes": host}}))
        return simulate(setup, read_mooncake(HEAD), step_seconds=linear(0.01, 2e-5)).summary

    off, on = run(0.0), run(1.0)
    for k in ("requests", "ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "token_hit_rate", "sim_seconds", "steps",
              "preemptions"):
        assert on[k] == off[k], k
    assert on["host_restore_bytes"] == 0 and on["token_hit_rate_host"] == 0.0


def test_serve_cli_reports_the_tier_in_json():
    p = run_cli("serve", "--trace", "data/traces/conversation_trace.jsonl", "--limit", "40", "--host-pool-bytes",
                "256e9", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["token_hit_rate"] == pytest.approx(d["token_hit_rate_gpu"] + d["token_hit_rate_host"])
    assert d["host_restore_s"] == pytest.approx(d["host_restore_bytes"] / (55.05e9 * d["host_pool_bytes_per_engine"]
                                                                           / 256e9) if d["host_restore_bytes"] else 0)


@pytest.mark.parametrize("value,text", [("-1", "finite number of bytes >= 0"), ("nan", "finite number of bytes")])
def test_bad_host_pool_bytes_is_one_line_naming_the_option(value, text):
    p = run_cli("serve", "--trace", "data/traces/conversation_trace.jsonl", "--limit", "5", "--host-pool-bytes",
                value)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "--host-pool-bytes" in p.stderr and text in p.stderr


def test_a_host_tier_on_a_profile_without_a_host_link_is_refused(tmp_path):
    doc = yaml.safe_load((ROOT / "scenarios" / "default.yaml").read_text())
    doc["hardware"] = "b200"
    doc["model"] = str(ROOT / "models" / "kimi-k3.yaml")
    path = tmp_path / "b200.yaml"
    path.write_text(yaml.safe_dump(doc))
    p = run_cli("serve", "--scenario", path, "--trace", "data/traces/conversation_trace.jsonl", "--limit", "5",
                "--host-pool-bytes", "1e12")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "--host-pool-bytes" in p.stderr and "b200" in p.stderr and "host link" in p.stderr
    doc["serving"] = {"engine": {"host_pool_bytes": 1e12}}  # the scenario field: named as the field
    path.write_text(yaml.safe_dump(doc))
    p = run_cli("serve", "--scenario", path, "--trace", "data/traces/conversation_trace.jsonl", "--limit", "5")
    assert p.returncode == 2 and "serving.engine.host_pool_bytes" in p.stderr
