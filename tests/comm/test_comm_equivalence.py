"""The closed-form placement and the bidirectional widest-shortest-path search give the numbers the old
graph code gave (issue 19): the old implementation is kept here as the reference (a networkx graph of
the placement, `nx.all_shortest_paths` per ring hop, the widest of them), and both are compared over GPU
counts, GPUs per node, profiles, ops and random topologies."""

from __future__ import annotations

import random
from types import SimpleNamespace

import networkx as nx
import pytest

from k3sim.comm import collective_time, placement_topology
from k3sim.comm.model import COLLECTIVES
from k3sim.comm.topology import Placement, Topology, gpu, widest_shortest_path


class OldTopology(Topology):
    """The pre-issue-19 ring routing, verbatim in substance: every shortest path enumerated per hop."""

    def hop(self, a: int, b: int) -> tuple[float, int]:
        paths = list(nx.all_shortest_paths(self.graph, gpu(a), gpu(b)))
        best = max(min(self.graph.edges[u, v]["bw"] for u, v in zip(p, p[1:])) for p in paths)
        return float(best), len(paths[0]) - 2

    def ring_bottleneck(self, n: int) -> tuple[float, bool]:
        if n < 2:
            return float("inf"), False
        memo = self.__dict__.setdefault("_old_memo", {})  # the old code memoised per n too
        if n not in memo:
            bws = [self.hop(i, (i + 1) % n)[0] for i in range(n)]
            memo[n] = (min(bws), len({i // self.gpus_per_node for i in range(n)}) > 1)
        return memo[n]


def old_placement(gpus: int, hw, gpus_per_node: int | None = None) -> OldTopology:
    """The old `_build_placement` graph: GPU -> its node's NVSwitch, GPU -> one fabric (when scale-out > 0)."""
    gpn = int(gpus_per_node or hw.scaleup_domain_gpus)
    up, out = float(hw.scaleup_bandwidth_bytes_per_s), float(hw.scaleout_bandwidth_bytes_per_s or 0)
    g = nx.Graph()
    for i in range(gpus):
        g.add_edge(gpu(i), f"nvs{i // gpn}", bw=up)
        if out > 0:
            g.add_edge(gpu(i), "fabric", bw=out)
    return OldTopology(g, gpus, gpn, "placement")


def bare_hw(up: float = 400e9, out: float = 50e9, domain: int = 8) -> SimpleNamespace:
    return SimpleNamespace(name="bare-eq", scaleup_domain_gpus=domain, scaleup_bandwidth_bytes_per_s=up,
                           scaleout_bandwidth_bytes_per_s=out, num_sms=132, peak_flops_per_s={"bf16": 1e15},
                           hbm_bandwidth_bytes_per_s=4e12, calibration_dir=None)


# scale-up faster, slower than and equal to the NIC; a profile without a fabric; a 72-GPU domain
PROFILES = [bare_hw(), bare_hw(up=30e9), bare_hw(up=50e9), bare_hw(out=0.0), bare_hw(up=900e9, domain=72)]
COUNTS = [*range(2, 40), 63, 64, 65, 72, 73, 100, 144, 145, 257]


@pytest.mark.parametrize("hw", PROFILES, ids=lambda h: f"up{h.scaleup_bandwidth_bytes_per_s:.0e}-out"
                         f"{h.scaleout_bandwidth_bytes_per_s:.0e}-d{h.scaleup_domain_gpus}")
def test_closed_form_ring_equals_the_graph_ring(hw):
    for gpn in sorted({1, 2, 3, 5, hw.scaleup_domain_gpus}):
        for n in COUNTS:
            if n > gpn and hw.scaleout_bandwidth_bytes_per_s <= 0:
                continue  # refused by both: several nodes without a fabric
            new, old = placement_topology(n, hw, gpn), old_placement(n, hw, gpn)
            assert isinstance(new, Placement) and new.graph is None
            assert new.ring_bottleneck(n) == old.ring_bottleneck(n), (gpn, n)
            for m in (2, max(2, n // 2), n):  # a ring over the first m GPUs of the placement
                assert new.ring_bottleneck(m) == old.ring_bottleneck(m), (gpn, n, m)
            for a, b in ((0, n - 1), (0, 1), (n // 2, n - 1)):
                if a != b:
                    assert new.hop(a, b) == old.hop(a, b), (gpn, n, a, b)


@pytest.mark.parametrize("op", COLLECTIVES)
def test_collective_time_equals_the_graph_model(op):
    """Every field of the answer (seconds, method, detail) through the old graph and through the closed form;
    bare profiles have no measurements, so both take the model path; h200 counts past its 8-GPU domain."""
    from k3sim.configs.profiles import load_profile

    cases = [(hw, n, gpn) for hw in PROFILES[:3] for n in (2, 3, 8, 9, 16, 24, 64, 100, 300) for gpn in (None, 1, 4)]
    h200 = load_profile("h200")
    cases += [(h200, n, gpn) for n in (9, 16, 64, 257) for gpn in (None, 2)]
    for hw, n, gpn in cases:
        old_topo = old_placement(n, hw, gpn)
        for nbytes in (1, 4096, 12 * 2 ** 20):
            new = collective_time(op, nbytes, n, hw, gpus_per_node=gpn, convention="barrier")
            old = collective_time(op, nbytes, n, hw, topology=old_topo, convention="barrier")
            assert new == old, (hw.name, n, gpn, nbytes)


def random_topology(seed: int) -> Topology:
    """GPUs on 1-3 of a few switches, switch-to-switch links, a few GPU-GPU links: many ties among shortest
    paths, bandwidths from a short list so widths tie too."""
    rnd = random.Random(seed)
    n, switches = rnd.randint(2, 48), rnd.randint(1, 8)
    widths = [1e9, 5e10, 4.5e11, 9e11]
    g = nx.Graph()
    for i in range(n):
        for s in rnd.sample(range(switches), rnd.randint(1, min(3, switches))):
            g.add_edge(gpu(i), f"sw{s}", bw=rnd.choice(widths))
    for s in range(switches - 1):
        g.add_edge(f"sw{s}", f"sw{s + 1}", bw=rnd.choice(widths))
        if rnd.random() < 0.3:
            g.add_edge(f"sw{s}", f"spine{rnd.randrange(2)}", bw=rnd.choice(widths))
    for _ in range(rnd.randint(0, 6)):
        a, b = rnd.sample(range(n), 2) if n > 2 else (0, 1)
        g.add_edge(gpu(a), gpu(b), bw=rnd.choice(widths))
    return Topology(g, n, rnd.randint(1, n), f"random-{seed}")


@pytest.mark.parametrize("seed", range(40))
def test_bidirectional_search_equals_all_shortest_paths(seed):
    topo = random_topology(seed)
    old = OldTopology(topo.graph, topo.gpus, topo.gpus_per_node, topo.source)
    n = topo.gpus
    for a in range(n):
        for b in (a + 1, n - 1 - a, (a * 7 + 3) % n):
            if 0 <= b < n and b != a:
                assert topo.hop(a, b) == old.hop(a, b), (a, b)
    for m in sorted({2, max(2, n // 3), n}):
        assert topo.ring_bottleneck(m) == old.ring_bottleneck(m), m


def test_layered_graphs_with_exponentially_many_shortest_paths():
    """A chain of k diamonds has 2^k shortest paths (the old enumeration's worst case); the search's answer is
    still the widest of them: the narrowest link on the best branch of each diamond."""
    k, g = 30, nx.Graph()
    for d in range(k):
        wide, narrow = 1e11 * (1 + d % 3), 1e10
        g.add_edge(f"v{d}", f"a{d}", bw=wide)
        g.add_edge(f"a{d}", f"v{d + 1}", bw=wide)
        g.add_edge(f"v{d}", f"b{d}", bw=narrow)
        g.add_edge(f"b{d}", f"v{d + 1}", bw=narrow)
    bw, links, _ = widest_shortest_path({u: {v: d["bw"] for v, d in nb.items()} for u, nb in g.adjacency()},
                                        "v0", f"v{k}", 10 ** 6, "diamonds")
    assert (bw, links) == (1e11, 2 * k)
