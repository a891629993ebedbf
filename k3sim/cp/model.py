"""One training step's attention work across a CP group: KCP (or another scheme) on the KDA layers,
a chosen scheme on the MLA layers, summed over the hybrid stack as it is (K3: 69 KDA + 24 MLA)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from k3sim.cp import docs as D
from k3sim.cp.comm import CommModel, KernelClock, default_kernel_time
from k3sim.cp.geometry import CPGeometry
from k3sim.cp.layers import LayerCost, LayerInputs, layer_cost
from k3sim.cp.traffic import check_strategy
from k3sim.errors import InputError

DEFAULT_MLA_STRATEGY = "allgather-kv"   # what K3 CP does on MLA layers (torchtitan kimi_k3, PR #4313/#4500)
DEFAULT_MLA_KV = "latent"               # 576 elements/token instead of 30 720: 53x fewer bytes


@dataclass
class CPStepResult:
    model: str
    hardware: str
    seq_len: int
    cp: int
    tp: int
    state_dtype: str
    kda_strategy: str
    mla_strategy: str
    mla_kv: str
    docs: int
    link: str
    num_kda_layers: int
    num_mla_layers: int
    kda_layer_recv_bytes_per_rank: float       # forward, one KDA layer (KCP: state fragments + conv halo)
    kda_layer_state_recv_bytes_per_rank: float # forward, the [S~|M] (or S) fragments alone: the paper's figure
    mla_layer_recv_bytes_per_rank: float       # forward, one MLA layer
    kda_layer_time_s: float                    # forward + backward, one layer
    mla_layer_time_s: float
    step_attention_time_s: float               # all attention layers, forward + backward
    step_recv_bytes_per_rank: float            # all attention layers, forward + backward
    kda: LayerCost | None = None
    mla: LayerCost | None = None
    breakdown: list[dict] = field(default_factory=list)


def _state_recv(g: CPGeometry, strategy: str, seq_len: int, P: int, state_dtype: str) -> float:
    """Forward bytes of the state fragments alone (no conv halo); for Ulysses the whole all-to-all."""
    from k3sim.configs.dtypes import bytes_per_element
    from k3sim.cp.traffic import layer_traffic

    fwd, _ = layer_traffic(strategy, "kda", g, seq_len, P, bytes_per_element(state_dtype), conv_halo=False)
    return fwd.recv_bytes


def fitted_intra(hardware: Any) -> Any:
    """Intra-device parameters fitted to the profile's measured chunk_kda_fwd, or None; from the disk cache
    (`k3sim.cp.cached`) when these measurements, this profile and this code were fitted before."""
    import dataclasses

    from k3sim.cp import cached
    from k3sim.cp.intra_device import IntraParams
    from k3sim.cp.validate import fit_intra, measured_root

    root = measured_root(hardware)
    k = cached.entry_key(hardware, root)
    hit = cached.load(k, "intra")
    if isinstance(hit, dict) and "params" in hit:
        try:
            return None if hit["params"] is None else IntraParams(**hit["params"])
        except TypeError:  # fields of another version: refitted below
            pass
    params = fit_intra(hardware, root)
    cached.save(k, "intra", {"params": None if params is None else dataclasses.asdict(params)})
    return params


def kcp_parts_of(hardware: Any):
    """The profile's measured KCP parts (cp/kcp_parts.py), or None (no measurements, or a stand-in profile)."""
    from k3sim.cp.kcp_parts import load_parts
    from k3sim.cp.validate import measured_root

    root = measured_root(hardware)
    return load_parts(root, int(getattr(hardware, "num_sms", 132)), hardware) if root is not None else None


def check_state_dtype(state_dtype: str) -> None:
    """KCP moves the recurrent state in bf16 or fp32 (fla keeps fp32); anything else is bad input."""
    if state_dtype not in ("bf16", "fp32"):
        raise InputError(f"state dtype must be bf16 or fp32, got '{state_dtype}'", source="--state-dtype")


def layer_inputs(g: CPGeometry, hardware: Any, seq_len: int, P: int, *, state_dtype: str = "fp32",
                 mla_kv: str = DEFAULT_MLA_KV, docs: int | None = None, doc_lengths: list[int] | None = None,
                 kernel_time=None, bandwidth_override: float | None = None, kcp_pre_factor: float | None = None,
                 conv_halo: bool = True, clock: KernelClock | None = None, intra: Any = None,
                 pre_model: str = "auto") -> LayerInputs:
    """Everything a per-layer cost function reads; `clock` lets a sweep share memoised kernel times.

    `pre_model` "auto": fla's KCP pre-process and merge as measured alone on one GPU (cp/kcp_parts.py)
    where the profile has those measurements and no FLOP-ratio factor is forced, else the FLOP ratio."""
    parts = None
    if pre_model in ("auto", "parts"):
        parts = kcp_parts_of(hardware)
        pre_model = "parts" if parts is not None and kcp_pre_factor is None else "flop-ratio"
    bounds = D.doc_bounds(seq_len, docs, doc_lengths)
    clock = clock or KernelClock(hardware, kernel_time or default_kernel_time())
    comm = CommModel(clock, P, P * g.tp, bandwidth_override)
    x = LayerInputs(g, clock, comm, seq_len, P, bounds, state_dtype, mla_kv, conv_halo=conv_halo, intra=intra,
                    pre_model=pre_model, parts=parts)
    if kcp_pre_factor is not None:
        x.kcp_pre_factor = kcp_pre_factor
    return x


def layer_at(strategy: str, layer_kind: str, x: LayerInputs) -> LayerCost:
    """One layer's cost after validating the strategy for this layer kind, S and P."""
    heads = x.g.kda_heads_per_rank if layer_kind == "kda" else x.g.mla_heads_per_rank
    check_strategy(strategy, layer_kind, x.seq_len, x.P, heads, "--strategy" if layer_kind == "kda" else "--mla-strategy")
    return layer_cost(strategy, layer_kind, x)


def cp_step(g: CPGeometry, hardware: Any, seq_len: int, P: int, kda_strategy: str = "kcp",
            mla_strategy: str = DEFAULT_MLA_STRATEGY, *, state_dtype: str = "fp32", mla_kv: str = DEFAULT_MLA_KV,
            docs: int | None = None, doc_lengths: list[int] | None = None, kernel_time=None,
            bandwidth_override: float | None = None, kcp_pre_factor: float | None = None,
            intra: Any = "auto") -> CPStepResult:
    """Per-rank bytes and seconds of every attention layer of one training step (one sequence).

    `intra="auto"` fits the intra-device KDA model to the profile's measured chunk_kda_fwd when there is
    any (host floor and GPU time for KCP's pre-process); None uses the kernel predictor's times alone."""
    if isinstance(intra, str) and intra == "auto":
        intra = fitted_intra(hardware) if kernel_time is None else None
    check_state_dtype(state_dtype)
    if mla_kv not in ("latent", "expanded"):
        raise InputError(f"MLA KV form must be latent or expanded, got '{mla_kv}'", source="--mla-kv")
    if g.num_kda_layers:
        check_strategy(kda_strategy, "kda", seq_len, P, g.kda_heads_per_rank, "--strategy")
    if g.num_mla_layers:
        check_strategy(mla_strategy, "mla", seq_len, P, g.mla_heads_per_rank, "--mla-strategy")
    x = layer_inputs(g, hardware, seq_len, P, state_dtype=state_dtype, mla_kv=mla_kv, docs=docs,
                     doc_lengths=doc_lengths, kernel_time=kernel_time, bandwidth_override=bandwidth_override,
                     kcp_pre_factor=kcp_pre_factor, intra=intra)
    bounds, comm = x.bounds, x.comm
    kda = layer_cost(kda_strategy, "kda", x) if g.num_kda_layers else None
    mla = layer_cost(mla_strategy, "mla", x) if g.num_mla_layers else None
    nk, nm = g.num_kda_layers, g.num_mla_layers
    t_k = kda.time_s if kda else 0.0
    t_m = mla.time_s if mla else 0.0
    breakdown = []
    for n, lc in ((nk, kda), (nm, mla)):
        if lc is None:
            continue
        for phase in ("fwd", "bwd"):
            for r in getattr(lc, phase).rows:
                breakdown.append({"layer": lc.layer_kind, "phase": phase, "component": r["component"],
                                  "seconds_per_layer": r["seconds"], "seconds_step": n * r["seconds"],
                                  "source": r["source"]})
    return CPStepResult(
        model=g.name, hardware=str(getattr(hardware, "name", hardware)), seq_len=seq_len, cp=P, tp=g.tp,
        state_dtype=state_dtype, kda_strategy=kda_strategy, mla_strategy=mla_strategy, mla_kv=mla_kv,
        docs=len(bounds) - 1, link=comm.link, num_kda_layers=nk, num_mla_layers=nm,
        kda_layer_recv_bytes_per_rank=kda.fwd.recv_bytes if kda else 0.0,
        kda_layer_state_recv_bytes_per_rank=_state_recv(g, kda_strategy, seq_len, P, state_dtype) if kda else 0.0,
        mla_layer_recv_bytes_per_rank=mla.fwd.recv_bytes if mla else 0.0,
        kda_layer_time_s=t_k, mla_layer_time_s=t_m, step_attention_time_s=nk * t_k + nm * t_m,
        step_recv_bytes_per_rank=(nk * (kda.fwd.recv_bytes + kda.bwd.recv_bytes) if kda else 0.0)
        + (nm * (mla.fwd.recv_bytes + mla.bwd.recv_bytes) if mla else 0.0),
        kda=kda, mla=mla, breakdown=breakdown)
