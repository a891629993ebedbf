"""The links a collective runs over, as a networkx graph: GPUs, NVSwitch (scale-up) domains, NIC fabric.

Default placement (`placement_topology`): `gpus` ranks packed `gpus_per_node` to a node; each node's
GPUs hang off one NVSwitch (edge bandwidth = the profile's `scaleup_bandwidth_bytes_per_s`, per GPU,
one direction; HGX H200: NVLink 4 through NVSwitch) and each GPU has one NIC into a non-blocking
fabric (edge bandwidth = `scaleout_bandwidth_bytes_per_s`; HGX reference: one ConnectX-7 per GPU).
A topology file (YAML) names the same things for a machine that differs:

    gpus: 4                       # GPU nodes are gpu0 .. gpu3
    links:                        # [a, b, bandwidth_bytes_per_s]; other nodes (switches) are free names
      - [gpu0, nvs0, 450.0e+9]
      - [gpu1, nvs0, 450.0e+9]
      ...

A ring step between two GPUs uses the path between them with the fewest switch hops (ties: the widest);
its bandwidth is the narrowest edge on it. A GPU with no path to the others is bad input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3sim.errors import InputError


def gpu(i: int) -> str:
    return f"gpu{i}"


@dataclass
class Topology:
    graph: Any                 # networkx.Graph; edge attribute "bw" (bytes/s, one direction)
    gpus: int                  # GPU nodes gpu0 .. gpu{gpus-1}
    gpus_per_node: int         # GPUs sharing a scale-up domain (for the tree algorithm's node count)
    source: str                # "placement" or the file it came from
    nvswitch: bool = True      # the scale-up domain is a switch (NVLS-capable on Hopper), not point links

    def hop(self, a: int, b: int) -> tuple[float, int]:
        """(bandwidth of the narrowest edge, switch hops) on the path from gpu a to gpu b."""
        import networkx as nx

        paths = list(nx.all_shortest_paths(self.graph, gpu(a), gpu(b)))
        best = max(min(self.graph.edges[u, v]["bw"] for u, v in zip(p, p[1:])) for p in paths)
        return float(best), len(paths[0]) - 2

    def ring_bottleneck(self, n: int) -> tuple[float, bool]:
        """Narrowest hop of the ring gpu0 -> gpu1 -> ... -> gpu{n-1} -> gpu0, and whether the ring
        leaves a scale-up domain. Memoised per topology and n: sweeps ask it for the same wide groups
        thousands of times, and shortest paths over a 1,024-GPU graph take seconds."""
        if n < 2:
            return float("inf"), False
        memo = self.__dict__.setdefault("_ring_memo", {})
        if n not in memo:
            bws = [self.hop(i, (i + 1) % n)[0] for i in range(n)]
            nodes = {i // self.gpus_per_node for i in range(n)}
            memo[n] = (min(bws), len(nodes) > 1)
        return memo[n]


_PLACEMENTS: dict[tuple, Topology] = {}


def placement_topology(gpus: int, hw: Any, gpus_per_node: int | None = None) -> Topology:
    """`gpus` ranks, `gpus_per_node` per NVSwitch domain (default: the profile's scale-up domain).
    Built once per (gpus, domain, link bandwidths): the graph depends on nothing else."""
    key = (gpus, gpus_per_node, int(getattr(hw, "scaleup_domain_gpus", 0) or 0),
           float(hw.scaleup_bandwidth_bytes_per_s), float(getattr(hw, "scaleout_bandwidth_bytes_per_s", 0) or 0))
    if key not in _PLACEMENTS:
        _PLACEMENTS[key] = _build_placement(gpus, hw, gpus_per_node)
    return _PLACEMENTS[key]


def _build_placement(gpus: int, hw: Any, gpus_per_node: int | None = None) -> Topology:
    import networkx as nx

    domain = int(getattr(hw, "scaleup_domain_gpus", 0) or 0) or 1
    gpn = int(gpus_per_node or domain)
    if gpn < 1 or gpn > domain:
        raise InputError(f"gpus per node must be 1..{domain} (the profile's scale-up domain), got {gpn}",
                         source="--gpus-per-node", field="gpus_per_node")
    up = float(hw.scaleup_bandwidth_bytes_per_s)
    out = float(getattr(hw, "scaleout_bandwidth_bytes_per_s", 0) or 0)
    g = nx.Graph()
    for i in range(gpus):
        node = i // gpn
        g.add_edge(gpu(i), f"nvs{node}", bw=up)
        if out > 0:
            g.add_edge(gpu(i), "fabric", bw=out)
    if gpus > gpn and out <= 0:
        raise InputError(f"{gpus} GPUs span several nodes but profile '{hw.name}' has no scale-out bandwidth",
                         field="scaleout_bandwidth_bytes_per_s")
    return Topology(g, gpus, gpn, "placement")


def load_topology(path: str | Path, domain_gpus: int | None = None) -> Topology:
    """Read a topology file (format in the module docstring); every GPU must reach every other."""
    import networkx as nx

    from k3sim.configs.loaders import read_mapping

    src = str(path)
    data = read_mapping(Path(path))
    if not isinstance(data.get("gpus"), int) or isinstance(data.get("gpus"), bool) \
            or data["gpus"] < 1:
        raise InputError("needs 'gpus: N' (a positive integer)", source=src, field="gpus")
    n = data["gpus"]
    links = data.get("links")
    if not isinstance(links, list) or not links:
        raise InputError("needs a non-empty 'links' list of [a, b, bandwidth_bytes_per_s]", source=src, field="links")
    g = nx.Graph()
    g.add_nodes_from(gpu(i) for i in range(n))
    for i, link in enumerate(links):
        if not (isinstance(link, list) and len(link) == 3 and all(isinstance(x, str) for x in link[:2])):
            raise InputError(f"link {i} must be [a, b, bandwidth_bytes_per_s]", source=src, field="links")
        bw = link[2]
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0 < float(bw) < float("inf"):
            raise InputError(f"link {i}: bandwidth must be a positive number of bytes/s, got {bw!r}",
                             source=src, field="links")
        g.add_edge(link[0], link[1], bw=float(bw))
    stray = sorted(x for x in g.nodes if x.startswith("gpu") and x[3:].isdigit() and int(x[3:]) >= n)
    if stray:
        raise InputError(f"link names {stray[0]} but the file declares gpus: {n} (gpu0..gpu{n - 1})",
                         source=src, field="links")
    comp = nx.node_connected_component(g, gpu(0))
    lost = [gpu(i) for i in range(n) if gpu(i) not in comp]
    if lost:
        raise InputError(f"{lost[0]} is not connected to gpu0 (no path over the links)", source=src, field="links")
    gpn = data.get("gpus_per_node", domain_gpus or n)
    if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1:
        raise InputError(f"gpus_per_node must be a positive integer, got {gpn!r}", source=src, field="gpus_per_node")
    nvswitch = data.get("nvswitch", True)
    if not isinstance(nvswitch, bool):  # bool("no") is True: a quoted word must not pass as a switch
        raise InputError(f"nvswitch must be true or false, got {nvswitch!r}", source=src, field="nvswitch")
    return Topology(g, n, min(gpn, n), src, nvswitch=nvswitch)
