"""The one collective model: hand-worked ring/tree times, topology checks, and agreement of kernel-time and cp."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from k3sim.comm import collective_time, load_topology, placement_topology
from k3sim.errors import InputError


def bare_hw(**kw) -> SimpleNamespace:
    """No measurements (no calibration dir): datasheet links, zero latency; easy to work by hand."""
    d = dict(name="bare-comm", scaleup_domain_gpus=8, scaleup_bandwidth_bytes_per_s=400e9,
             scaleout_bandwidth_bytes_per_s=50e9, num_sms=132, peak_flops_per_s={"bf16": 1e15},
             hbm_bandwidth_bytes_per_s=4e12, calibration_dir=None)
    d.update(kw)
    return SimpleNamespace(**d)


def test_ring_inside_and_across_nodes_by_hand():
    hw = bare_hw()
    t8 = collective_time("all_gather", 2 ** 20, 8, hw)
    assert t8.method == "ring" and t8.source == "datasheet-roofline"
    assert t8.seconds == pytest.approx(7 * 2 ** 20 / 400e9)          # (n-1) x shard over NVSwitch
    t16 = collective_time("all_gather", 2 ** 20, 16, hw)
    assert t16.seconds == pytest.approx(15 * 2 ** 20 / 50e9)         # the ring's narrowest hop is the NIC
    # two ranks on different nodes (e.g. a CP pair strided by TP 8): the NIC again
    assert collective_time("all_gather", 2 ** 20, 2, hw, gpus_per_node=1).seconds == pytest.approx(2 ** 20 / 50e9)


def test_tree_all_reduce_across_nodes_and_nvls_marked_off():
    hw = bare_hw()
    t = collective_time("all_reduce", 2 ** 20, 16, hw)
    # ring: 2 x 15/16 x 1 MiB / 50 GB/s = 39.3 us; tree: 2 x 1 MiB / 50 GB/s = 41.9 us: ring wins at zero latency
    assert t.method == "ring" and t.seconds == pytest.approx(2 * 15 / 16 * 2 ** 20 / 50e9)
    inside = collective_time("all_reduce", 2 ** 20, 8, hw)
    assert "NVLS would take" in inside.detail and "disabled by policy" in inside.detail
    assert collective_time("all_reduce", 2 ** 20, 8, hw, nvls=True).method == "nvls"


def test_tree_wins_on_latency_for_a_small_all_reduce_over_many_nodes():
    """64 GPUs = 8 nodes of 8: ring 2 x 63 = 126 steps, tree 2 x (log2 8 + 8 - 1) = 20 steps; the tree moves
    2 x the buffer per rank (reduce up, broadcast down) at the NIC's measured fraction."""
    from k3sim.comm.model import _calibration
    from k3sim.configs.profiles import load_profile

    hw = load_profile("h200")
    cal = _calibration(hw, "all_reduce")
    if cal is None:
        pytest.skip("no measured all_reduce in this checkout")
    alpha, frac = cal[0], cal[1]
    t = collective_time("all_reduce", 1024, 64, hw)
    assert t.method == "tree" and "20 steps" in t.detail
    assert t.seconds == pytest.approx(20 * alpha + 2 * 1024 / (frac * hw.scaleout_bandwidth_bytes_per_s), rel=1e-12)
    assert t.seconds < 126 * alpha  # the ring's latency alone


def test_topology_file_errors(tmp_path):
    f = tmp_path / "topo.yaml"
    f.write_text("gpus: 3\nlinks:\n  - [gpu0, nvs0, 4.0e+11]\n  - [gpu1, nvs0, 4.0e+11]\n")
    with pytest.raises(InputError) as e:
        load_topology(f)
    assert "gpu2 is not connected" in str(e.value) and e.value.field == "links"
    f.write_text("gpus: 2\nlinks:\n  - [gpu0, nvs0, 4.0e+11]\n  - [gpu1, nvs0, 1.0e+11]\n")
    topo = load_topology(f)
    assert topo.ring_bottleneck(2) == (1e11, False)
    with pytest.raises(InputError) as e:
        collective_time("all_gather", 2 ** 20, 4, bare_hw(), topology=f)
    assert e.value.field == "gpus" and "topology has 2" in str(e.value)
    assert collective_time("all_gather", 2 ** 20, 2, bare_hw(), topology=f).seconds == pytest.approx(2 ** 20 / 1e11)
    links = "links:\n  - [gpu0, nvs0, 4.0e+11]\n  - [gpu1, nvs0, 1.0e+11]\n"
    for extra, field in (("gpus_per_node: two\n", "gpus_per_node"), ("gpus_per_node: 0\n", "gpus_per_node"),
                         ('nvswitch: "no"\n', "nvswitch")):
        f.write_text("gpus: 2\n" + extra + links)
        with pytest.raises(InputError) as e:
            load_topology(f)
        assert e.value.field == field, extra
    f.write_text("gpus: 2\ngpus_per_node: 1\nnvswitch: false\n" + links)
    topo = load_topology(f)
    assert (topo.gpus_per_node, topo.nvswitch) == (1, False)


def test_placement_rejects_more_per_node_than_the_domain():
    with pytest.raises(InputError):
        placement_topology(16, bare_hw(), gpus_per_node=16)


def test_kernel_time_and_cp_agree_on_every_collective():
    """The issue's example: a 16-GPU all-gather of a 12 MiB shard; and a CP pair across nodes (TP 8)."""
    from k3sim.cp.comm import CommModel, KernelClock
    from k3sim.cp.traffic import Collective
    from k3sim.predict import predict_kernel_time
    from k3sim.configs.profiles import load_profile

    hw = load_profile("h200")
    clock = KernelClock(hw, predict_kernel_time)
    for op in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
        cp16 = CommModel(clock, 16, 16).time(Collective(op, 12 * 2 ** 20))[0]
        kt16 = predict_kernel_time(op, {"bytes": 12 * 2 ** 20, "gpus": 16}, hw).seconds
        assert cp16 == pytest.approx(kt16, rel=1e-12)
        pair = CommModel(clock, 2, 16).time(Collective(op, 12 * 2 ** 20))[0]
        kt2 = predict_kernel_time(op, {"bytes": 12 * 2 ** 20, "gpus": 2, "gpus_per_node": 1}, hw).seconds
        assert pair == pytest.approx(kt2, rel=1e-12)
        assert pair > predict_kernel_time(op, {"bytes": 12 * 2 ** 20, "gpus": 2}, hw).seconds  # NIC < NVLink


def test_kernel_time_topology_bad_input_is_one_line_exit_2(tmp_path, cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: 3\nlinks:\n  - [gpu0, nvs0, 4.5e+11]\n  - [gpu1, nvs0, 4.5e+11]\n")
    ok = tmp_path / "ok.yaml"
    ok.write_text("gpus: 2\nlinks:\n  - [gpu0, nvs0, 4.5e+11]\n  - [gpu1, nvs0, 4.5e+11]\n")
    for args, words in ((["--set", "gpus=3", "--topology", str(bad)], "gpu2 is not connected"),
                        (["--set", "gpus=4", "--topology", str(ok)], "on 4 GPUs, but the topology has 2")):
        proc = cli("kernel-time", "all_gather", "--set", "bytes=1048576", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
