"""k3sim: systems simulator and capacity planner for hybrid linear-attention MoE models.

Kept import-free so that `k3sim --help` starts fast; heavy modules load inside the commands.
"""

__version__ = "0.1.0"
