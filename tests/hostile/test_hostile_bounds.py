"""Bounded collective work and bounded kernel parameters (issue 19, items 4-6): topology files whose numbers
leave the bounds table, GPU counts past the collective maximum, `kernel-time` parameters outside their op's
range: one line naming the file and field (`links[1][2]`) or what the user typed (`--set T=0`), exit 2,
before any work; and the documented maximum itself (65,536 GPUs) answers."""

from __future__ import annotations

import json
import math
import time

import pytest

from hostile_helpers import assert_one_line, run_main

LINK_OK = "  - [gpu0, nvs0, 4.5e+11]\n"


def _kernel_time(capsys, *args):
    return run_main(capsys, "kernel-time", *args)


@pytest.mark.parametrize("second_link, field, words", [
    ("[gpu1, nvs0, 1.0e-300]", "links[1][2]", ["at least 1,000,000"]),
    ("[gpu1, nvs0, 1.0e+308]", "links[1][2]", ["outside [1,000,000, 1e+15] bytes/s"]),
    ("[gpu1, nvs0, .nan]", "links[1][2]", ["finite"]),
    ("[gpu1, nvs0, -4.5e+11]", "links[1][2]", ["at least 1,000,000"]),
    ("[gpu1, nvs0, .inf]", "links[1][2]", ["finite"]),
    ("[gpu1, nvs0, 1e308]", "links[1][2]", ["is text, not a number"]),  # YAML 1.1: no point -> a string
    ("[gpu1, nvs0, true]", "links[1][2]", ["expected a number"]),
    ("[gpu2, nvs0, 4.5e+11]", "links[1][0]", ["not one of the file's GPUs gpu0 .. gpu1"]),
    ("[nvs0, gpu70000, 4.5e+11]", "links[1][1]", ["not one of the file's GPUs"]),
    ("[gpu01, nvs0, 4.5e+11]", "links[1][0]", ["leading zero", "write gpu1"]),
    ("[gpu0, nvs0, 4.5e+11]", "links[1]", ["repeats the link gpu0-nvs0"]),
    ("[nvs0, nvs0, 4.5e+11]", "links[1]", ["to itself"]),
    ("[gpu1, 7, 4.5e+11]", "links[1][1]", ["node name"]),
    ("[gpu1, nvs0]", "links[1]", ["[a, b, bandwidth_bytes_per_s]"]),
])
def test_topology_link_numbers_are_bounded(tmp_path, capsys, second_link, field, words):
    """Bandwidths of 1e-300 and 1e308 were accepted (the bounds table says 1e6 to 1e15 B/s)."""
    topo = tmp_path / "topo.yaml"
    topo.write_text("gpus: 2\nlinks:\n" + LINK_OK + f"  - {second_link}\n")
    line = assert_one_line(*_kernel_time(capsys, "all_gather", "--set", "bytes=1024", "--set", "gpus=2",
                                         "--topology", topo), str(topo), f"field '{field}'", *words)
    assert ";" in line or ":" in line.split(f"field '{field}'")[1]  # a reason follows the field


@pytest.mark.parametrize("head, field, words", [
    ("gpus: 100000\n", "gpus", ["100,000 is outside [2, 65,536] GPUs"]),
    ("gpus: 1\n", "gpus", ["at least 2"]),
    ("gpus: 2.0\n", "gpus", ["whole number"]),
    ("gpus: true\n", "gpus", ["whole number"]),
    ("gpus: 2\ngpus_per_node: 3\n", "gpus_per_node", ["exceeds gpus: 2"]),
    ("gpus: 2\ngpus_per_node: 0\n", "gpus_per_node", ["positive"]),
    ("gpus: 2\nlink: []\n", "link", ["unknown key 'link'"]),
])
def test_topology_counts_are_bounded(tmp_path, capsys, head, field, words):
    topo = tmp_path / "topo.yaml"
    topo.write_text(head + "links:\n" + LINK_OK + "  - [gpu1, nvs0, 4.5e+11]\n")
    assert_one_line(*_kernel_time(capsys, "all_gather", "--set", "bytes=1024", "--set", "gpus=2", "--topology",
                                  topo), str(topo), f"field '{field}'", *words)


def test_json_topology_bandwidth_of_1e308_is_refused(tmp_path, capsys):
    """JSON reads 1e308 as a number (YAML reads it as text): the range refuses it, naming the entry."""
    topo = tmp_path / "topo.json"
    topo.write_text(json.dumps({"gpus": 2, "links": [["gpu0", "nvs0", 4.5e11], ["gpu1", "nvs0", 1e308]]}))
    assert_one_line(*_kernel_time(capsys, "all_gather", "--set", "bytes=1024", "--set", "gpus=2", "--topology",
                                  topo), str(topo), "field 'links[1][2]'", "1e+308 is outside")


@pytest.mark.parametrize("gpus", [128, 2000])
def test_ring_routing_work_is_bounded(tmp_path, capsys, monkeypatch, gpus):
    """GPUs alternating between two hubs joined through a third switch: every hop grows a hub's whole port
    list. The routing's work bound (`ROUTE_VISITS_MAX`, lowered here so the case stays small) refuses it in
    one line instead of running for minutes at 65,536 GPUs."""
    import k3sim.comm.topology as topology

    monkeypatch.setattr(topology, "ROUTE_VISITS_MAX", 20 * gpus)
    links = [[f"gpu{i}", "h1" if i % 2 == 0 else "h2", 5e10] for i in range(gpus)]
    topo = tmp_path / "hubs.json"
    topo.write_text(json.dumps({"gpus": gpus, "links": links + [["h1", "x", 5e10], ["x", "h2", 5e10]]}))
    assert_one_line(*_kernel_time(capsys, "all_gather", "--set", "bytes=1024", "--set", f"gpus={gpus}",
                                  "--topology", topo), str(topo), "field 'links'", f"more than {20 * gpus:,} links")


@pytest.mark.parametrize("gpus", ["65537", "1000000", "1e30", "4294967297"])
def test_kernel_time_gpus_past_the_collective_maximum_refused_at_once(capsys, gpus):
    t0 = time.perf_counter()
    assert_one_line(*_kernel_time(capsys, "all_gather", "--set", "bytes=1048576", "--set", f"gpus={gpus}"),
                    f"--set gpus={gpus}", "[2, 65,536] GPUs")
    assert time.perf_counter() - t0 < 10  # refused before any placement is built (generous: a hang check)


@pytest.mark.parametrize("op, sets, bad", [
    ("chunk_kda_fwd", ["T=4096", "H=12"], "T=0"),
    ("chunk_kda_fwd", ["T=4096", "H=12"], "H=5000"),
    ("chunk_kda_fwd", ["T=4096", "H=12"], "K=300"),
    ("sdpa_causal_fwd", ["T=4096", "H=12"], "D=257"),
    ("hbm_copy", [], f"bytes={2 ** 41}"),
    ("all_reduce", ["bytes=1024"], "gpus=1"),
    ("moe_grouped_bf16", ["B=64", "K=64", "N=64", "topk=2"], "E=70000"),
    ("router_topk", ["T=8", "E=8"], "topk=2000"),
    ("recurrent_kda_decode", ["T=1", "H=4"], "B=0"),
    ("rope", ["T=8", "H=4"], "D=1"),
    ("gemm_bf16", ["M=64", "N=64"], "K=nan"),
    ("gemm_bf16", ["M=64", "N=64"], "K=1.5"),
    ("gemm_bf16", ["M=64", "N=64", "K=64"], "Z=3"),
    ("moe_grouped_bf16", ["B=4", "E=8", "K=64", "N=64"], "topk=16"),
])
def test_kernel_time_bad_parameter_names_the_set_the_user_wrote(capsys, op, sets, bad):
    """`field 'T'` named the kernel's internal field; the line names `--set T=...` and no field."""
    argv = [x for s in [*sets, bad] for x in ("--set", s)]
    line = assert_one_line(*_kernel_time(capsys, op, *argv), f"--set {bad}:")
    assert "field '" not in line


def test_kernel_time_missing_and_unknown_parameters_say_what_is_known(capsys):
    line = assert_one_line(*_kernel_time(capsys, "gemm_bf16", "--set", "M=1", "--set", "N=1"), "--set:",
                           "missing parameter(s) K", "add --set K=VALUE")
    assert "field '" not in line
    assert_one_line(*_kernel_time(capsys, "chunk_kda_fwd", "--set", "T=1", "--set", "H=1", "--set", "Q=1"),
                    "--set Q=1:", "known: T, H; optional K, V")
    assert_one_line(*_kernel_time(capsys, "gemm_bf17", "--set", "M=1"), "unknown op 'gemm_bf17'",
                    "did you mean gemm_bf16")


def test_kernel_time_gpus_per_node_names_the_set(capsys, tmp_path):
    """Was `--gpus-per-node: field 'gpus_per_node'`, an option kernel-time does not have."""
    line = assert_one_line(*_kernel_time(capsys, "all_gather", "--set", "bytes=1024", "--set", "gpus=16",
                                         "--set", "gpus_per_node=16"), "--set gpus_per_node=16:", "1..8")
    assert "--gpus-per-node" not in line
    topo = tmp_path / "t.yaml"
    topo.write_text("gpus: 2\nlinks:\n" + LINK_OK + "  - [gpu1, nvs0, 4.5e+11]\n")
    # with a topology file the option had no effect (the file's own gpus_per_node was used): refused
    assert_one_line(*_kernel_time(capsys, "all_gather", "--set", "bytes=1024", "--set", "gpus=2", "--set",
                                  "gpus_per_node=1", "--topology", topo), "--set gpus_per_node=1:",
                    "default placement only")


def test_every_op_parameter_has_a_bounds_table_range(capsys):
    """Each parameter of each op is a kind of the bounds table, and one past either end is refused by
    kernel-time naming `--set NAME=VALUE`, before any prediction."""
    from k3sim.configs.bounds import BOUNDS
    from k3sim.kernels.ops import OPS, ParamRange

    for name, spec in OPS.items():
        base = {p: spec.ranges[p][0] for p in spec.params}
        for p, r in spec.ranges.items():
            assert isinstance(r, ParamRange) and r.kind in BOUNDS and r[1] == BOUNDS[r.kind].hi, (name, p)
            for v in (r[0] - 1, r[1] + 1):
                if p in spec.optional and v == -1 and r[0] == 0:
                    continue
                sets = {**base, p: v}
                argv = [x for k, val in sets.items() for x in ("--set", f"{k}={val}")]
                assert_one_line(*_kernel_time(capsys, name, *argv), f"--set {p}={v}:", "outside the allowed range")


def test_the_collective_maximum_answers(capsys):
    """65,536 GPUs on the default placement (the documented maximum; minutes before, quadratic ring
    routing): it answers, a ring over the NIC fabric. Timing is benchmarks/bench_contract.py's."""
    t0 = time.perf_counter()
    code, out, err = _kernel_time(capsys, "all_gather", "--set", "gpus=65536", "--set", "bytes=1048576", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["method"] == "ring" and "65536 GPUs (8192 node(s) of 8" in res["detail"]
    assert "scale-out" in res["detail"] and math.isfinite(res["seconds"]) and res["seconds"] > 0
    assert time.perf_counter() - t0 < 60
