"""Context parallelism for hybrid stacks: traffic and time per strategy, per rank.

`cp_step` answers one configuration of KDA + MLA layers; `model_cp_step` any model, every mixer kind with its
scheme (`kinds`: GDN's delta-rule fold and the scalar-decay folds in `folds`, GQA / SWA in `attention`); `sweep`
scans S and P for crossovers; `intra_device` models the three single-GPU forms of KDA prefill; `validate`
compares with measured fla kernels.
"""

from k3sim.cp.geometry import CPGeometry, default_state_dtype, geometry_from_model
from k3sim.cp.model import (DEFAULT_MLA_KV, DEFAULT_MLA_STRATEGY, CPStepResult, KindCost, check_state_dtype,
                            cp_step, model_cp_step)
from k3sim.cp.traffic import KDA_STRATEGIES, MLA_STRATEGIES, STRATEGIES, layer_traffic

__all__ = ["CPGeometry", "geometry_from_model", "default_state_dtype", "cp_step", "model_cp_step", "KindCost",
           "check_state_dtype",
           "CPStepResult", "DEFAULT_MLA_STRATEGY", "DEFAULT_MLA_KV", "STRATEGIES", "KDA_STRATEGIES",
           "MLA_STRATEGIES", "layer_traffic"]
