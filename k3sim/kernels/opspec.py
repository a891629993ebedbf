"""What every op table shares: the `OpSpec` of one kernel, its parameters' ranges (`ParamRange`, kinds of the
bounds table), element sizes, and the MoE routing formulas both tables' expert ops use.

Below the tables: `k3sim.kernels.ops` (GEMM, HBM, MoE, KDA, attention, collectives, the EP all-to-all) and
`k3sim.kernels.ops_decode` (the decode-step kernels) each define their ops over this vocabulary, and
`ops.build_registry` assembles the registry `OPS` from their tables; no module registers ops into another's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from k3sim.configs.bounds import BOUNDS

BF16 = 2  # bytes per element
FP32 = 4

Params = Mapping[str, int]


class ParamRange(tuple):
    """(lo, hi) of one op parameter, from the bounds table's `kind` (`k3sim.configs.bounds.BOUNDS`), so a
    refusal can say why the upper end sits where it does; it unpacks as the plain pair callers read.
    `lo` overrides the table's lower end (a collective needs 2 GPUs; gpus_per_node 0 means the default)."""

    def __new__(cls, kind: str, lo: int | None = None):
        r = BOUNDS[kind]
        self = super().__new__(cls, (int(r.lo) if lo is None else int(lo), int(r.hi)))
        self.kind = kind
        return self

    def __getnewargs__(self):  # pickling and copying rebuild it from its kind (processes of a sweep)
        return self.kind, self[0]


@dataclass(frozen=True)
class OpSpec:
    """One kernel: what it takes, what it costs in the ideal case.

    `kind` is "compute" (roofline over FLOP and HBM bytes) or "collective" (alpha-beta over wire bytes).
    `categorical` parameters are never interpolated across (a different GPU count is a different
    machine configuration); `dtype` picks the peak FLOP/s in the hardware profile.
    """

    name: str
    family: str
    params: tuple[str, ...]
    ranges: dict[str, tuple[int, int]]
    flop: Callable[[Params], float]
    bytes: Callable[[Params], float]
    kind: str = "compute"
    dtype: str = "bf16"
    categorical: tuple[str, ...] = ()
    check: Callable[[Params], tuple[str, str] | None] = field(default=lambda p: None)  # (field, reason)
    eff_params: dict[str, float] = field(default_factory=dict)  # param -> reference value, see features()
    shape_params: tuple[str, ...] = ()  # what names a layer shape (GEMM's N, K): leave-shape-out validation
    # dependent steps one kernel program walks in sequence (see model.py's step_s); None: none modelled
    serial_steps: Callable[[Params], float] | None = None
    # parameters a caller may leave out (name -> default); not columns of the measured CSVs: KDA head
    # dims K, V (measured at 128; other values scale by the fitted model, see predict.py) and a
    # collective's gpus_per_node (0 = the profile's scale-up domain)
    optional: dict[str, int] = field(default_factory=dict)

    def features(self, rows: list[Params]):
        """n x k log2(param / reference) of `eff_params`: the fitted model's efficiency exponents act on these."""
        import numpy as np

        return np.array([[math.log2(r[k] / ref) for k, ref in self.eff_params.items()] for r in rows],
                        float).reshape(len(rows), len(self.eff_params))

    def steps(self, rows: list[Params]):
        """Dependent steps of each row (`serial_steps`), or None for an op without them."""
        import numpy as np

        return None if self.serial_steps is None else np.array([self.serial_steps(r) for r in rows], float)


# ---- MoE routing formulas (ops.py's moe_grouped_bf16 and ops_decode.py's expert ops) ----------------

def expected_distinct_experts(B: float, E: float, topk: float) -> float:
    """Expected number of experts hit by B tokens routing uniformly to topk of E: E(1-(1-k/E)^B)."""
    return E * (1.0 - (1.0 - topk / E) ** B)


def moe_flop(p: Params) -> float:
    return 2.0 * p["B"] * p["topk"] * p["K"] * p["N"]


def _topk_le_e(p: Params) -> tuple[str, str] | None:
    return None if p["topk"] <= p["E"] else ("topk", f"topk={p['topk']} exceeds E={p['E']} (each token is routed to "
                                                     "topk of the E experts): give topk <= E")
