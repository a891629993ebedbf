"""What context parallelism reads of each layer kind, per CP rank after head-parallel TP, and which scheme each
kind runs. Shapes come from the kinds registry (`k3sim.configs.kinds`: `state_bytes`, `conv_state_bytes`,
`kv_bytes_per_token`, `window_tokens`, `tp_rules`); KDA and MLA keep their own geometry (`cp/geometry.py`).

Recurrent kinds keep a fixed-size state, so no token crosses ranks: each rank runs its chunk from a zero state,
the ranks exchange one summary each, and every rank folds the summaries of the ranks before it into its initial
state. What the summary holds depends on the transition:
- delta rule (KDA, GDN): S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T. The transition is a d_k x d_k
  matrix, so a rank sends (S~, M): its local state and the product of its transitions, per head - per VALUE head
  for GDN, whose beta and decay are per value head (grouped key heads shared). fla runs one CP code path for
  both (fla `fla/ops/cp/KCP.md`: "Context Parallel for GDN (Gated Delta Rule) and KDA"). Scheme "kcp".
- scalar decay (Mamba2's SSD, lightning attention; Mamba-1 per channel): S_t = a_t S_t-1 + k_t v_t^T with a_t a
  scalar per head (per inner channel for Mamba-1), which commutes with the state. A rank's initial state is the
  decayed sum of the earlier ranks' local states, S_in(r) = a(r-1) S_in(r-1) + S~(r-1): a rank-prefix scan over
  (S~, cumulative decay). This is SSD's inter-chunk state passing (Dao & Gu, arXiv 2405.21060 sec. 6) with a
  rank as the chunk, and LASP-2's single all-gather of memory states (Sun et al., arXiv 2502.07563) with decay.
  Scheme "lasp2". Lightning's decay is a fixed slope per head, known to every rank: only S~ is sent.
Softmax-attention kinds move tokens' K and V: GQA takes all-gather KV (default: its few KV heads make the gather
cheap; LASP-2H's all-gather for the standard-attention layers of a hybrid, arXiv 2502.07563), ring,
zigzag ring or Ulysses; SWA's window bounds what crosses: the K/V of the W - 1 tokens before the rank
("window-halo").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from k3sim.errors import InputError

# The CP schemes each mixer kind runs, its default first. Every kind's scheme is picked by --strategy except
# MLA's (`OPTION`): K3's KDA and MLA layers take a scheme each (`k3sim cp --strategy / --mla-strategy`).
SCHEMES: dict[str, tuple[str, ...]] = {
    "kda": ("kcp", "ulysses", "lasp2"),
    "mla": ("allgather-kv", "ring", "zigzag-ring", "ulysses"),
    "gdn": ("kcp",),
    "mamba2": ("lasp2",),
    "mamba": ("lasp2",),
    "lightning": ("lasp2",),
    "gqa": ("allgather-kv", "ring", "zigzag-ring", "ulysses"),
    "swa": ("window-halo",),
}
OPTION: dict[str, str] = {"mla": "--mla-strategy"}
STRATEGY_OPTION = "--strategy"

# What a scheme does on a kind of each family (the output's "scheme" column)
SCHEME_LABELS: dict[str, str] = {
    "kcp": "delta-rule fold: all-gather of (S~, M), prefix fold",
    "lasp2": "decayed-sum fold: all-gather of states, rank-prefix scan",
    "allgather-kv": "all-gather K/V (head-tail layout)",
    "ring": "ring attention, K/V hops overlapped",
    "zigzag-ring": "ring attention on the zigzag layout",
    "ulysses": "DeepSpeed-Ulysses all-to-all (heads <-> sequence)",
    "window-halo": "K/V halo of the W-1 tokens before the rank",
}

BORROWED_SSM_HEAD_DIM = 64   # Mamba-1 priced as Mamba2 heads of this many channels (the measured head_dim)


@dataclass(frozen=True)
class RecurrentShape:
    """One recurrent layer per CP rank: `heads` states of d_k x d_v each (after TP), the transition a rank sends
    with its state ("matrix": d_k x d_k per head; "scalar": one fp32 cumulative log-decay per head; "fixed": a
    decay every rank knows, nothing sent), the conv halo, and the chunked kernel that prices its work."""

    kind: str
    title: str
    heads: int
    dk: int
    dv: int
    transition: str
    state_bytes: int            # registry `state_bytes(cfg, tp, dtype)`: S~ of one rank
    state_dtype: str
    halo_bytes: int             # registry `conv_state_bytes(cfg, tp)`: the last W-1 conv inputs (0: no conv)
    op: str                     # chunked forward kernel; op + "_bwd" is its forward+backward
    op_params: tuple = ()       # (name, value) pairs of the op besides T
    op_note: str = ""           # where the op is borrowed from another kind: why, said in the output

    @property
    def params(self) -> dict:
        return dict(self.op_params)

    @property
    def transition_bytes(self) -> int:
        if self.transition == "matrix":
            from k3sim.configs.dtypes import bytes_per_element

            return math.ceil(self.heads * self.dk * self.dk * bytes_per_element(self.state_dtype))
        return 4 * self.heads if self.transition == "scalar" else 0

    @property
    def fragment_bytes(self) -> int:
        """What one rank contributes to the all-gather: its state and its transition."""
        return self.state_bytes + self.transition_bytes


@dataclass(frozen=True)
class AttentionShape:
    """One softmax-attention layer per CP rank: query heads, the KV heads it holds (one replicated copy where TP
    exceeds them), head dim, the K/V bytes one token adds (registry `kv_bytes_per_token`) and the window."""

    kind: str
    title: str
    q_heads: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_token: int
    window: int | None
    act_bytes: float = 2.0      # q, o (bf16) in Ulysses' all-to-all


@dataclass(frozen=True)
class KindLayers:
    """A kind of the model: how many layers hold it, its shape and the scheme it runs."""

    kind: str
    layers: int
    shape: Any = field(compare=False)
    scheme: str


def _dtype(cfg: Any, state_dtype: str | None) -> str:
    return state_dtype or cfg.state_dtype


def _gdn(cfg: Any, tp: int, sdt: str | None, kind: Any) -> RecurrentShape:
    H, Hk = cfg.num_value_heads // tp, cfg.num_key_heads // tp
    d = _dtype(cfg, sdt)
    return RecurrentShape("gdn", kind.title, H, cfg.head_dim_k, cfg.head_dim_v, "matrix",
                          kind.state_bytes(cfg, tp, d), d, kind.conv_state_bytes(cfg, tp), "chunk_gdn_fwd",
                          (("H", H), ("Hk", Hk), ("K", cfg.head_dim_k), ("V", cfg.head_dim_v)))


def _mamba2(cfg: Any, tp: int, sdt: str | None, kind: Any) -> RecurrentShape:
    """Heads of head_dim P with state N: fla's chunk_simple_gla form at K = N, V = P (`kernels.ops`)."""
    H, d = cfg.num_heads // tp, _dtype(cfg, sdt)
    return RecurrentShape("mamba2", kind.title, H, cfg.state_size, cfg.head_dim, "scalar",
                          kind.state_bytes(cfg, tp, d), d, kind.conv_state_bytes(cfg, tp), "mamba2_chunk_fwd",
                          (("H", H), ("K", cfg.state_size), ("V", cfg.head_dim)))


def _mamba(cfg: Any, tp: int, sdt: str | None, kind: Any) -> RecurrentShape:
    """Mamba-1: d_inner channels, each with an N-wide state and its own decay. No measured kernel of its own: the
    selective scan is priced as Mamba2's chunked scan over the same d_inner x N state, in heads of 64 channels."""
    C, d = cfg.inner_size // tp, _dtype(cfg, sdt)
    H = max(1, math.ceil(C / BORROWED_SSM_HEAD_DIM))
    note = (f"proxy: mamba2_chunk_fwd borrowed at H = {H} heads of {BORROWED_SSM_HEAD_DIM} channels, K = d_state "
            f"{cfg.state_size} (the same {C} x {cfg.state_size} state; Mamba-1 has no measured kernel)")
    return RecurrentShape("mamba", kind.title, C, cfg.state_size, 1, "scalar", kind.state_bytes(cfg, tp, d), d,
                          kind.conv_state_bytes(cfg, tp), "mamba2_chunk_fwd",
                          (("H", H), ("K", cfg.state_size), ("V", BORROWED_SSM_HEAD_DIM)), note)


def _lightning(cfg: Any, tp: int, sdt: str | None, kind: Any) -> RecurrentShape:
    """Linear attention with a fixed decay slope per head: the scalar-decay chunked form Mamba2's op measures."""
    H, d = cfg.num_heads // tp, _dtype(cfg, sdt)
    note = (f"borrowed: mamba2_chunk_fwd (fla chunk_simple_gla, the same scalar-decay chunked form) at K = V = "
            f"{cfg.head_dim}; lightning attention has no measured kernel")
    return RecurrentShape("lightning", kind.title, H, cfg.head_dim, cfg.head_dim, "fixed",
                          kind.state_bytes(cfg, tp, d), d, kind.conv_state_bytes(cfg, tp), "mamba2_chunk_fwd",
                          (("H", H), ("K", cfg.head_dim), ("V", cfg.head_dim)), note)


def _attention(cfg: Any, tp: int, sdt: str | None, kind: Any) -> AttentionShape:
    kv_rule = kind.tp_rules(cfg)[1]  # GQA's second rule: the KV heads (replicated where tp exceeds them)
    return AttentionShape(kind.name, kind.title, cfg.num_heads // tp, kv_rule.per_rank(tp), cfg.head_dim,
                          kind.kv_bytes_per_token(cfg, tp), kind.window_tokens(cfg))


SHAPES = {"gdn": _gdn, "mamba2": _mamba2, "mamba": _mamba, "lightning": _lightning, "gqa": _attention,
          "swa": _attention}
GEOMETRY_KINDS = ("kda", "mla")  # the kinds `CPGeometry` holds


def shape_of(model: Any, kind: str, tp: int, state_dtype: str | None = None):
    """The CP shape of `kind`'s layers in `model` at head-parallel `tp`; a TP that does not split the kind is
    refused in one line naming --tp."""
    from k3sim.configs.kinds import MIXERS

    mk, cfg = MIXERS[kind], model.section(kind)
    reason = mk.tp_problem(cfg, tp)
    if reason:
        raise InputError(reason, source="--tp")
    return SHAPES[kind](cfg, tp, state_dtype, mk)


def _titles(kinds) -> str:
    from k3sim.configs.kinds import MIXERS

    return " or ".join(MIXERS[k].title for k in kinds)


def resolve_schemes(model: Any, strategy: str | None, mla_strategy: str | None) -> dict[str, str]:
    """The scheme of every mixer kind of `model`: --strategy where the kind can run it, else the kind's default;
    MLA's from --mla-strategy. A strategy no kind of the model runs, or --mla-strategy on a model without MLA
    layers, is refused in one line naming the option and what the model's kinds do take."""
    from k3sim.configs.kinds import MIXERS
    from k3sim.cp.traffic import STRATEGIES

    kinds = model.mixer_kinds
    missing = [k for k in kinds if k not in SCHEMES]
    if missing:
        raise InputError(f"{MIXERS[missing[0]].title} layers have no context-parallel scheme in k3sim.cp "
                         f"(kinds with one: {', '.join(SCHEMES)})", field="model")
    known = list(dict.fromkeys([*STRATEGIES, *(s for v in SCHEMES.values() for s in v)]))
    if strategy is not None and strategy not in known:
        raise InputError(f"unknown strategy '{strategy}' (known: {', '.join(known)})", source=STRATEGY_OPTION)
    own = [k for k in kinds if OPTION.get(k, STRATEGY_OPTION) == STRATEGY_OPTION]
    name = getattr(model, "name", "the model")
    if mla_strategy is not None and "mla" not in kinds:
        hint = f"; give the {_titles(own)} layers' scheme with --strategy" if own else ""
        raise InputError(f"sets the MLA layers' scheme and {name} has no MLA layers{hint}",
                         source="--mla-strategy")
    takers = [k for k in own if strategy in SCHEMES[k]]
    if strategy is not None and not takers:
        raise InputError(_not_applicable(strategy, own, kinds, name), source=STRATEGY_OPTION)
    out = {k: (strategy if k in takers else SCHEMES[k][0]) for k in own}
    for k in kinds:
        if k not in out:
            out[k] = mla_strategy if mla_strategy is not None else SCHEMES[k][0]
    return out


def _not_applicable(strategy: str, own: list[str], kinds: tuple, name: str) -> str:
    """One line: which of the model's layers --strategy sets, what they take, and where `strategy` does run."""
    from k3sim.configs.kinds import MIXERS

    if not own:
        return (f"does not apply to {name}: its layers are all {_titles(kinds)}, whose scheme is set by "
                f"{OPTION.get(kinds[0], STRATEGY_OPTION)}")
    takes = "; ".join(f"{MIXERS[k].title}: {', '.join(SCHEMES[k])}" for k in own)
    runs = [k for k in SCHEMES if strategy in SCHEMES[k]]
    where = f"; {strategy} runs on {_titles(runs).replace(' or ', ', ')} layers" if runs else ""
    other = [k for k in kinds if k not in own and strategy in SCHEMES[k]]
    if other:
        where += f", and {name}'s {_titles(other)} layers take theirs from {OPTION[other[0]]}"
    return f"strategy '{strategy}' does not apply to {_titles(own)} layers ({takes}){where}"


def model_kinds(model: Any, tp: int, schemes: dict[str, str], state_dtype: str | None = None) -> list[KindLayers]:
    """Every mixer kind of `model` that `CPGeometry` does not hold, in registry order, with its shape and scheme."""
    return [KindLayers(k, model.num_layers_with(k), shape_of(model, k, tp, state_dtype), schemes[k])
            for k in model.mixer_kinds if k not in GEOMETRY_KINDS]
