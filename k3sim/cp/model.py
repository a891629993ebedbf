"""One training step's attention work across a CP group: KCP (or another scheme) on the KDA layers,
a chosen scheme on the MLA layers, summed over the hybrid stack as it is (K3: 69 KDA + 24 MLA); and for any
model (`model_cp_step`), every mixer kind with its own scheme (`cp/kinds.py`: the GDN and scalar-decay folds of
`cp/folds.py`, the GQA / SWA schemes of `cp/attention.py`), summed over its layers by kind."""

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
    kda_strategy: str | None        # None: the model has no KDA layers (`kinds` holds every kind's scheme)
    mla_strategy: str | None
    mla_kv: str | None
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
    kinds: list[KindCost] = field(default_factory=list)   # every mixer kind: its layers, scheme and cost


@dataclass
class KindCost:
    """One mixer kind of the step: its layer count, the scheme it ran and one layer's bytes and seconds."""

    kind: str
    title: str
    layers: int
    scheme: str
    scheme_label: str
    state_dtype: str | None                    # the state a fold moves (None: an attention kind)
    layer_recv_bytes_per_rank: float           # forward, one layer (a fold: summaries + conv halo)
    layer_state_recv_bytes_per_rank: float     # forward, the state summaries alone (0 for attention kinds)
    layer_time_s: float                        # forward + backward, one layer
    step_time_s: float                         # all its layers
    notes: list[str] = field(default_factory=list)
    layer: LayerCost | None = None             # the per-layer cost (the `kda` / `mla` fields for those kinds)
    kv_form: str | None = None                 # MLA: the K/V form moved (latent | expanded)


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
            intra: Any = "auto", others: tuple = ()) -> CPStepResult:
    """Per-rank bytes and seconds of every attention layer of one training step (one sequence).

    `intra="auto"` fits the intra-device KDA model to the profile's measured chunk_kda_fwd when there is
    any (host floor and GPU time for KCP's pre-process); None uses the kernel predictor's times alone.
    `others`: the layers of kinds `g` does not hold (`cp.kinds.KindLayers`, from `model_cp_step`)."""
    if isinstance(intra, str) and intra == "auto":
        intra = fitted_intra(hardware) if kernel_time is None and g.num_kda_layers else None
    check_state_dtype(state_dtype)
    if mla_kv not in ("latent", "expanded"):
        raise InputError(f"MLA KV form must be latent or expanded, got '{mla_kv}'", source="--mla-kv")
    if g.num_kda_layers:
        check_strategy(kda_strategy, "kda", seq_len, P, g.kda_heads_per_rank, "--strategy")
    if g.num_mla_layers:
        check_strategy(mla_strategy, "mla", seq_len, P, g.mla_heads_per_rank, "--mla-strategy")
    from k3sim.cp.attention import check_split

    for kl in others:
        check_split(kl.scheme, seq_len, P)
    x = layer_inputs(g, hardware, seq_len, P, state_dtype=state_dtype, mla_kv=mla_kv, docs=docs,
                     doc_lengths=doc_lengths, kernel_time=kernel_time, bandwidth_override=bandwidth_override,
                     kcp_pre_factor=kcp_pre_factor, intra=intra)
    bounds, comm = x.bounds, x.comm
    kda = layer_cost(kda_strategy, "kda", x) if g.num_kda_layers else None
    mla = layer_cost(mla_strategy, "mla", x) if g.num_mla_layers else None
    nk, nm = g.num_kda_layers, g.num_mla_layers
    t_k = kda.time_s if kda else 0.0
    t_m = mla.time_s if mla else 0.0
    kinds = _geometry_kinds(g, kda, mla, _state_recv(g, kda_strategy, seq_len, P, state_dtype) if kda else 0.0,
                            state_dtype, mla_kv) + [_other_kind(kl, x) for kl in others]
    breakdown = [{"layer": kc.kind, "phase": phase, "component": r["component"], "seconds_per_layer": r["seconds"],
                  "seconds_step": kc.layers * r["seconds"], "source": r["source"]}
                 for kc in kinds for phase in ("fwd", "bwd") for r in getattr(kc.layer, phase).rows]
    return CPStepResult(
        model=g.name, hardware=str(getattr(hardware, "name", hardware)), seq_len=seq_len, cp=P, tp=g.tp,
        state_dtype=state_dtype, kda_strategy=kda_strategy, mla_strategy=mla_strategy, mla_kv=mla_kv,
        docs=len(bounds) - 1, link=comm.link, num_kda_layers=nk, num_mla_layers=nm,
        kda_layer_recv_bytes_per_rank=kda.fwd.recv_bytes if kda else 0.0,
        kda_layer_state_recv_bytes_per_rank=kinds[0].layer_state_recv_bytes_per_rank if kda else 0.0,
        mla_layer_recv_bytes_per_rank=mla.fwd.recv_bytes if mla else 0.0,
        kda_layer_time_s=t_k, mla_layer_time_s=t_m, step_attention_time_s=sum(kc.step_time_s for kc in kinds),
        step_recv_bytes_per_rank=sum(kc.layers * (kc.layer.fwd.recv_bytes + kc.layer.bwd.recv_bytes)
                                     for kc in kinds),
        kda=kda, mla=mla, breakdown=breakdown, kinds=kinds)


def _kind_cost(kind: str, layers: int, lc: LayerCost, state_dtype: str | None, state_recv: float) -> KindCost:
    from k3sim.configs.kinds import MIXERS
    from k3sim.cp.kinds import SCHEME_LABELS

    return KindCost(kind=kind, title=MIXERS[kind].title, layers=layers, scheme=lc.strategy,
                    scheme_label=SCHEME_LABELS.get(lc.strategy, lc.strategy), state_dtype=state_dtype,
                    layer_recv_bytes_per_rank=float(lc.fwd.recv_bytes),
                    layer_state_recv_bytes_per_rank=float(state_recv),
                    layer_time_s=float(lc.time_s), step_time_s=float(layers * lc.time_s), notes=list(lc.notes),
                    layer=lc)


def _geometry_kinds(g: CPGeometry, kda: LayerCost | None, mla: LayerCost | None, kda_state_recv: float,
                    state_dtype: str, mla_kv: str) -> list[KindCost]:
    """The KDA and MLA entries of `CPStepResult.kinds` (their costs as `cp_step` always made them)."""
    out = []
    if kda is not None:
        out.append(_kind_cost("kda", g.num_kda_layers, kda, state_dtype, kda_state_recv))
    if mla is not None:
        out.append(_kind_cost("mla", g.num_mla_layers, mla, None, 0.0))
        out[-1].kv_form = mla_kv if mla.strategy != "ulysses" else "expanded"
    return out


def _other_kind(kl: Any, x: LayerInputs) -> KindCost:
    """A kind `CPGeometry` does not hold: its fold (recurrent) or attention scheme (`cp/kinds.py`)."""
    from k3sim.cp.attention import attention_layer
    from k3sim.cp.folds import fold_layer, state_recv_bytes
    from k3sim.cp.kinds import RecurrentShape

    s = kl.shape
    if isinstance(s, RecurrentShape):
        return _kind_cost(kl.kind, kl.layers, fold_layer(x, s, kl.scheme), s.state_dtype, state_recv_bytes(s, x.P))
    return _kind_cost(kl.kind, kl.layers, attention_layer(x, s, kl.scheme), None, 0.0)


def model_cp_step(model: Any, hardware: Any, seq_len: int, P: int, *, tp: int = 1, strategy: str | None = None,
                  mla_strategy: str | None = None, state_dtype: str | None = None, mla_kv: str | None = None,
                  docs: int | None = None, doc_lengths: list[int] | None = None, kernel_time=None,
                  bandwidth_override: float | None = None, intra: Any = "auto") -> CPStepResult:
    """`cp_step` for any model: every mixer kind with the scheme `cp.kinds.resolve_schemes` gives it (--strategy
    where the kind runs it, else its default; MLA's from --mla-strategy), the step summed over the layers by
    kind. `state_dtype` None: each recurrent kind moves its own state dtype (KDA's: `default_state_dtype`). KDA
    and MLA are priced by `cp_step` exactly as for `CPGeometry` alone."""
    from k3sim.cp.geometry import default_state_dtype, kda_mla_geometry
    from k3sim.cp.kinds import model_kinds, resolve_schemes

    schemes = resolve_schemes(model, strategy, mla_strategy)
    if mla_kv is not None and "mla" not in schemes:
        raise InputError(f"sets how MLA layers move K/V and {getattr(model, 'name', 'the model')} has no MLA "
                         "layers", source="--mla-kv")
    if state_dtype is not None:
        check_state_dtype(state_dtype)
    g = kda_mla_geometry(model, tp)
    others = tuple(model_kinds(model, tp, schemes, state_dtype))
    r = cp_step(g, hardware, seq_len, P, schemes.get("kda", "kcp"), schemes.get("mla", DEFAULT_MLA_STRATEGY),
                state_dtype=default_state_dtype(model) if state_dtype is None else state_dtype,
                mla_kv=DEFAULT_MLA_KV if mla_kv is None else mla_kv, docs=docs, doc_lengths=doc_lengths,
                kernel_time=kernel_time, bandwidth_override=bandwidth_override, intra=intra, others=others)
    # the KDA / MLA fields name what those layers ran: nothing where the model has none
    r.kda_strategy = r.kda_strategy if "kda" in schemes else None
    r.mla_strategy, r.mla_kv = (r.mla_strategy, r.mla_kv) if "mla" in schemes else (None, None)
    return r
