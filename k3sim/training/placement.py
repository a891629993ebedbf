"""Where each parallel group's GPUs sit, and so which link its collectives and pipeline hops take.

Rank order is Megatron-Core's default `tp-cp-ep-dp-pp` (megatron/core/parallel_state.py, `order`): TP is
innermost (consecutive GPUs), then CP, then DP; PP outermost. Experts fold EP over the tp*cp*dp ranks of a
stage with expert-TP 1, so an EP group is `ep` consecutive GPUs. A group whose GPUs span more than one
scale-up domain (an NVLink node or rack) talks over the scale-out NICs.

A group's collective times come from `k3sim.cp.groups.Collectives` over `k3sim.cp.comm.CommModel` (the one
place that turns a collective into seconds for a group and its link), which the pipeline's stage-to-stage
sends share.
"""

from __future__ import annotations

from typing import Any

from k3sim.configs.parallel import Parallelism
from k3sim.cp.groups import Group


def groups(par: Parallelism) -> dict[str, Group]:
    """TP, CP, EP, dense-DP, expert-DP and PP groups under the `tp-cp-ep-dp-pp` order."""
    tp, cp, dp, ep = par.tp, par.cp, par.dp, par.ep
    stage = tp * cp * dp
    return {
        "tp": Group("tp", tp, tp),
        "cp": Group("cp", cp, tp * cp),
        "ep": Group("ep", ep, ep),
        "dp": Group("dp", dp * cp, stage),            # distributed optimizer shards over DP x CP
        "edp": Group("edp", stage // ep, stage),       # expert data-parallel replicas, stride ep
        "pp": Group("pp", par.pp, stage * par.pp),     # adjacent stages are `stage` GPUs apart
    }


def pp_hop_links(par: Parallelism, hw: Any) -> list[str]:
    """Link of each of the p*v - 1 hops between consecutive model chunks: a stage is tp*cp*dp consecutive
    ranks (rank order tp-cp-ep-dp-pp) and a hop leaves the scale-up domain when its two stages sit in
    different domains (`pipeline.costs.cross_node`, the pipeline engine's rule)."""
    if par.pp <= 1:
        return []
    from k3sim.pipeline.costs import cross_node

    p, n = par.pp, int(hw.scaleup_domain_gpus)
    g = par.tp * par.cp * par.dp
    return ["scale-out" if cross_node(s % p, (s + 1) % p, g, n) else "scale-up"
            for s in range(p * par.virtual_stages - 1)]
