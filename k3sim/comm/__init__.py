"""The one collective model (ring, tree, NVLS over the default placement in closed form or over a topology
file's graph), calibrated on measured runs."""

from k3sim.comm.model import COLLECTIVES, CONVENTIONS, collective_time, ring_steps
from k3sim.comm.topology import Topology, load_topology, placement_topology

__all__ = ["COLLECTIVES", "CONVENTIONS", "Topology", "collective_time", "load_topology", "placement_topology",
           "ring_steps"]
