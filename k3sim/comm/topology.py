"""The links a collective runs over: the default placement (closed form) or a topology file (a graph).

Default placement (`placement_topology`): `gpus` ranks packed `gpus_per_node` to a node; each node's
GPUs hang off one NVSwitch (edge bandwidth = the profile's `scaleup_bandwidth_bytes_per_s`, per GPU,
one direction; HGX H200: NVLink 4 through NVSwitch) and each GPU has one NIC into a non-blocking
fabric (edge bandwidth = `scaleout_bandwidth_bytes_per_s`; HGX reference: one ConnectX-7 per GPU).
Every ring hop of that placement is one of two kinds, so no graph is built (`Placement`): two GPUs of
one node have two two-link paths (through their NVSwitch and through the fabric), the widest of which
carries max(scale-up, scale-out); two GPUs of different nodes have the fabric only. The work is O(1) in
GPUs (a graph and a shortest-path search per ring hop took 27 s at 4,096 GPUs).

A topology file (YAML or JSON) names the same things for a machine that differs:

    gpus: 4                       # GPU nodes are gpu0 .. gpu3
    links:                        # [a, b, bandwidth_bytes_per_s]; other nodes (switches) are free names
      - [gpu0, nvs0, 450.0e+9]
      - [gpu1, nvs0, 450.0e+9]
      ...
    gpus_per_node: 4              # optional: GPUs per scale-up domain (default: the profile's, at most gpus)
    nvswitch: true                # optional: the scale-up domain is a switch (NVLS-capable)

A ring step between two GPUs uses the path between them with the fewest links (ties: the widest);
its bandwidth is the narrowest link on it. A GPU with no path to the others is bad input. Every number
is checked against `k3sim.configs.bounds.BOUNDS` (GPUs: `collective_gpus`, links: `topology_links`,
bandwidths: `bandwidth`) and every refusal names the file and the field (`links[3][2]`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3sim.configs.bounds import BOUNDS, check_range
from k3sim.errors import InputError, shorten

# Adjacency entries the ring routing of one topology file may examine, over all its hops (a work bound, as
# the bounds table's are for inputs): the bidirectional search per hop touches a few links on the machines
# this models (an HGX node's NVSwitch and NIC, or leaf and spine switches: 10-16 per hop, 0.7-1.0 M for a
# ring of 65,536 GPUs); 2^22 (64 per hop at 65,536 GPUs, seconds of Python) trips only on a file whose
# hops cross chains of switches with thousands of ports, refused instead of running for minutes.
ROUTE_VISITS_MAX = 2 ** 22
FILE_KEYS = ("gpus", "links", "gpus_per_node", "nvswitch")
_GPU_NAME = re.compile(r"gpu([0-9]+)")


def gpu(i: int) -> str:
    return f"gpu{i}"


@dataclass
class Topology:
    """A topology file's machine as a graph (`load_topology`); its ring hops come from
    `widest_shortest_path`, whose work per file is bounded by `ROUTE_VISITS_MAX`."""

    graph: Any                 # networkx.Graph; edge attribute "bw" (bytes/s, one direction)
    gpus: int                  # GPU nodes gpu0 .. gpu{gpus-1}
    gpus_per_node: int         # GPUs sharing a scale-up domain (for the tree algorithm's node count)
    source: str                # "placement" or the file it came from
    nvswitch: bool = True      # the scale-up domain is a switch (NVLS-capable on Hopper), not point links

    def hop(self, a: int, b: int) -> tuple[float, int]:
        """(bandwidth of the narrowest edge, switch hops) on the widest of the fewest-link paths from gpu a
        to gpu b."""
        bw, links, _ = widest_shortest_path(self.adjacency(), gpu(a), gpu(b), ROUTE_VISITS_MAX, self.source)
        return bw, links - 1

    def adjacency(self) -> dict[str, dict[str, float]]:
        """{node: {neighbour: bandwidth}} as plain dicts, built once: the search reads it per link, and
        networkx's views cost several times a dict lookup."""
        adj = self.__dict__.get("_adjacency")
        if adj is None:
            adj = self.__dict__["_adjacency"] = {u: {v: float(d["bw"]) for v, d in nbrs.items()}
                                                 for u, nbrs in self.graph.adjacency()}
        return adj

    def ring_bottleneck(self, n: int) -> tuple[float, bool]:
        """Narrowest hop of the ring gpu0 -> gpu1 -> ... -> gpu{n-1} -> gpu0, and whether the ring
        leaves a scale-up domain. Memoised per n (at most `gpus` small entries): sweeps ask it for the
        same groups thousands of times. The hops together may examine `ROUTE_VISITS_MAX` adjacency
        entries; a file that needs more is refused."""
        if n < 2:
            return float("inf"), False
        memo = self.__dict__.setdefault("_ring_memo", {})
        if n not in memo:
            budget, narrowest = ROUTE_VISITS_MAX, float("inf")
            for i in range(n if n > 2 else 1):  # a 2-ring's two hops are one pair
                bw, _, used = widest_shortest_path(self.adjacency(), gpu(i), gpu((i + 1) % n), budget, self.source)
                narrowest, budget = min(narrowest, bw), budget - used
            memo[n] = (narrowest, n > self.gpus_per_node)
        return memo[n]


@dataclass
class Placement(Topology):
    """The default placement in closed form (module docstring): `graph` is None, hops are computed."""

    scaleup_bytes_per_s: float = 0.0   # GPU to its NVSwitch, one direction
    scaleout_bytes_per_s: float = 0.0  # GPU to the NIC fabric, one direction (0: no fabric)

    def hop(self, a: int, b: int) -> tuple[float, int]:
        """Same node: the NVSwitch path or the fabric path, whichever is wider; else the fabric."""
        if a // self.gpus_per_node == b // self.gpus_per_node:
            return self._intra(), 1
        return self.scaleout_bytes_per_s, 1

    def _intra(self) -> float:
        up, out = self.scaleup_bytes_per_s, self.scaleout_bytes_per_s
        return max(up, out) if out > 0 else up

    def ring_bottleneck(self, n: int) -> tuple[float, bool]:
        """The ring gpu0 .. gpu{n-1} has a same-node hop when a node holds two GPUs (gpu0 -> gpu1) and a
        cross-node hop when it spans nodes (n > gpus_per_node); its narrowest hop is the narrower kind."""
        if n < 2:
            return float("inf"), False
        gpn = self.gpus_per_node
        kinds = ([self._intra()] if gpn >= 2 else []) + ([self.scaleout_bytes_per_s] if n > gpn else [])
        return min(kinds), n > gpn


def widest_shortest_path(adj: dict[str, dict[str, float]], src: str, dst: str, budget: int,
                         source: str) -> tuple[float, int, int]:
    """(bandwidth, links, adjacency entries examined) of the widest among the fewest-link paths src -> dst.

    Bidirectional breadth-first search by whole layers. Each side keeps its frontier (the nodes at its
    current depth) and, per node, the widest bottleneck over its shortest paths from its end (max over
    predecessors of min(width, link)). While the two visited sets are disjoint, every path has more than
    depth_a + depth_b links; the first time a link joins the two frontiers, the shortest paths have exactly
    depth_a + depth_b + 1 links and each crosses one such joining link, so the answer is the max over
    joining links of min(width_a, link, width_b): the number enumerating every shortest path gives, in
    O(links touched). The joining test walks the cheaper of the two frontiers' links or tests every pair
    (whichever is fewer), and the cheaper side grows, so a hop through a switch of thousands of ports
    never walks those ports."""
    fronts = [{src: float("inf")}, {dst: float("inf")}]
    seen, depth, used = [{src}, {dst}], [0, 0], 0
    while True:
        cost = [sum(len(adj[u]) for u in f) for f in fronts]
        pairs = len(fronts[0]) * len(fronts[1])
        used += len(fronts[0]) + len(fronts[1]) + min(cost[0], cost[1], pairs)
        _within(used, budget, source)
        best = _joining(adj, fronts, cost, pairs)
        if best is not None:
            return best, depth[0] + depth[1] + 1, used
        k = 0 if cost[0] <= cost[1] else 1
        used += cost[k]
        _within(used, budget, source)
        fronts[k] = _grow(adj, fronts[k], seen[k])
        depth[k] += 1
        if not fronts[k]:
            raise InputError(f"{shorten(dst, 40)} has no path to {shorten(src, 40)} over the links", source=source,
                             field="links")


def _within(used: int, budget: int, source: str) -> None:
    if used > budget:
        raise InputError(f"routing the ring over this topology examines more than {ROUTE_VISITS_MAX:,} links "
                         "(its hops cross chains of switches of thousands of ports); give the GPUs shorter paths "
                         "(e.g. a switch per node) or describe fewer GPUs", source=source, field="links")


def _joining(adj: dict, fronts: list[dict], cost: list[int], pairs: int) -> float | None:
    """Max over links u-v (u in one frontier, v in the other) of min(width u, link, width v); None if none."""
    walk, other = (fronts[0], fronts[1]) if cost[0] <= cost[1] else (fronts[1], fronts[0])
    if pairs <= min(cost):
        links = ((wu, adj[u].get(v), wv) for u, wu in walk.items() for v, wv in other.items())
    else:
        links = ((wu, bw, other[v]) for u, wu in walk.items() for v, bw in adj[u].items() if v in other)
    widths = [min(wu, bw, wv) for wu, bw, wv in links if bw is not None]
    return max(widths) if widths else None


def _grow(adj: dict, front: dict, seen: set) -> dict:
    """The next BFS layer: each new node's width is the widest min(width of a predecessor, link) into it."""
    nxt: dict = {}
    for u, wu in front.items():
        for v, bw in adj[u].items():
            if v in seen:  # an earlier layer (this layer's nodes join `seen` below)
                continue
            w = wu if wu < bw else bw
            if v not in nxt or w > nxt[v]:
                nxt[v] = w
    seen.update(nxt)
    return nxt


def placement_topology(gpus: int, hw: Any, gpus_per_node: int | None = None) -> Topology:
    """`gpus` ranks, `gpus_per_node` per NVSwitch domain (default: the profile's scale-up domain), as a
    closed-form `Placement`: O(1) in GPUs, so nothing is cached (a cache of graphs per GPU count grew
    with every count a sweep asked for)."""
    top = int(BOUNDS["collective_gpus"].hi)
    if not 1 <= gpus <= top:
        raise InputError(f"{gpus:,} GPUs is outside the placement's [1, {top:,}] ({BOUNDS['collective_gpus'].why})",
                         field="gpus")
    domain = int(getattr(hw, "scaleup_domain_gpus", 0) or 0) or 1
    gpn = int(gpus_per_node or domain)
    if gpn < 1 or gpn > domain:
        raise InputError(f"gpus per node must be 1..{domain} (the scale-up domain of profile '{hw.name}'), got "
                         f"{gpn}; pack at most {domain} GPUs per node", field="gpus_per_node")
    up = float(hw.scaleup_bandwidth_bytes_per_s)
    out = float(getattr(hw, "scaleout_bandwidth_bytes_per_s", 0) or 0)
    if gpus > gpn and out <= 0:
        raise InputError(f"{gpus} GPUs span several nodes but profile '{hw.name}' has no scale-out bandwidth",
                         field="scaleout_bandwidth_bytes_per_s")
    return Placement(None, gpus, gpn, "placement", scaleup_bytes_per_s=up, scaleout_bytes_per_s=out)


def load_topology(path: str | Path, domain_gpus: int | None = None) -> Topology:
    """Read a topology file (format in the module docstring); every GPU must reach every other.
    Each refusal names the file and the field (`links[3][2]`) and says how to fix it."""
    import networkx as nx

    from k3sim.configs.loaders import read_mapping

    src = str(path)
    data = read_mapping(Path(path), what="topology file")  # k3sim.reader: opened once, capped
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        raise InputError(f"unknown key {shorten(unknown[0], 40)!r} (a topology file has {', '.join(FILE_KEYS)})",
                         source=src, field=shorten(unknown[0], 40))
    n = _file_count(data.get("gpus"), "collective_gpus", src, "gpus", "gpus: N for the GPUs gpu0 .. gpu<N-1>")
    links = data.get("links")
    if not isinstance(links, list) or not links:
        raise InputError("needs a non-empty 'links' list of [a, b, bandwidth_bytes_per_s]", source=src, field="links")
    _in_bounds(len(links), "topology_links", src, "links", "merge parallel links (sum their bandwidths) or "
               "describe fewer GPUs")
    g = nx.Graph()
    g.add_nodes_from(gpu(i) for i in range(n))
    for i, link in enumerate(links):
        a, b, bw = _link(link, i, n, src)
        if g.has_edge(a, b):
            raise InputError(f"repeats the link {shorten(a, 30)}-{shorten(b, 30)}; give each pair once (parallel "
                             "links: one entry with their summed bandwidth)", source=src, field=f"links[{i}]")
        g.add_edge(a, b, bw=bw)
    comp = nx.node_connected_component(g, gpu(0))
    lost = [gpu(i) for i in range(n) if gpu(i) not in comp]
    if lost:
        raise InputError(f"{lost[0]} is not connected to gpu0 (no path over the links); add a link from it",
                         source=src, field="links")
    if "gpus_per_node" in data:
        gpn = _file_count(data["gpus_per_node"], "gpus", src, "gpus_per_node", "GPUs per scale-up domain")
        if gpn > n:
            raise InputError(f"gpus_per_node: {gpn:,} exceeds gpus: {n:,} (all the file's GPUs fit one node): write "
                             f"gpus_per_node: {n} or fewer", source=src, field="gpus_per_node")
    else:
        gpn = min(domain_gpus or n, n)
    nvswitch = data.get("nvswitch", True)
    if not isinstance(nvswitch, bool):  # bool("no") is True: a quoted word must not pass as a switch
        raise InputError(f"nvswitch must be true or false, got {shorten(repr(nvswitch), 40)}", source=src,
                         field="nvswitch")
    return Topology(g, n, gpn, src, nvswitch=nvswitch)


def _in_bounds(value: Any, kind: str, src: str, field: str, fix: str) -> Any:
    """`check_range` naming the file and the field, with the fix appended to its reason."""
    try:
        return check_range(value, kind, src, field=field)
    except InputError as err:
        raise InputError(f"{err.reason}; {fix}", source=src, field=field) from None


def _file_count(value: Any, kind: str, src: str, field: str, what: str) -> int:
    """A whole number (YAML `4`, not `4.0` or `true`) inside `BOUNDS[kind]`."""
    r = BOUNDS[kind]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"needs a whole number in {r.text()}, got {shorten(repr(value), 40)}; write {what}",
                         source=src, field=field)
    return _in_bounds(value, kind, src, field, f"write {what}")


def _link(link: Any, i: int, n: int, src: str) -> tuple[str, str, float]:
    """One `[a, b, bandwidth_bytes_per_s]` entry, checked: names are strings, a `gpuK` name is one of the
    file's GPUs, the two ends differ, the bandwidth is inside the bounds table's `bandwidth`."""
    if not (isinstance(link, list) and len(link) == 3):
        raise InputError(f"must be [a, b, bandwidth_bytes_per_s], got {shorten(repr(link), 60)}", source=src,
                         field=f"links[{i}]")
    for j in (0, 1):
        name = link[j]
        if not isinstance(name, str) or not name:
            raise InputError(f"a link end is a node name (gpuK or a switch), got {shorten(repr(name), 40)}",
                             source=src, field=f"links[{i}][{j}]")
        m = _GPU_NAME.fullmatch(name)
        digits = m.group(1) if m else ""
        if m and len(digits) > 1 and digits.startswith("0"):
            raise InputError(f"{shorten(name, 40)} names a GPU with a leading zero: write gpu{digits.lstrip('0') or 0}"
                             " (or give a switch a name that is not gpuK)", source=src, field=f"links[{i}][{j}]")
        if m and (len(digits) > 7 or int(digits) >= n):
            raise InputError(f"{shorten(name, 40)} is not one of the file's GPUs gpu0 .. gpu{n - 1} (gpus: {n}): "
                             "raise gpus, or give a switch a name that is not gpuK", source=src,
                             field=f"links[{i}][{j}]")
    if link[0] == link[1]:
        raise InputError(f"links {shorten(link[0], 40)} to itself, which carries nothing; remove it", source=src,
                         field=f"links[{i}]")
    fix = "write the link's one-direction bandwidth in bytes/s (NVLink 4: 4.5e+11)"
    if isinstance(link[2], str):  # YAML 1.1 reads 1e308 (no point, no sign) as text
        raise InputError(f"{shorten(repr(link[2]), 40)} is text, not a number (YAML needs a decimal point and a "
                         f"signed exponent: 4.5e+11); {fix}", source=src, field=f"links[{i}][2]")
    bw = _in_bounds(link[2], "bandwidth", src, f"links[{i}][2]", fix)
    return link[0], link[1], float(bw)
