"""Bytes and messages per rank per layer for each CP strategy (no times here).

Notation: S global tokens, P CP ranks, L = S/P, e bytes per activation element, s per state element.
Sources: KCP - fla PR #691 ("one all-gather ... communication volume CP x H x K x (K+V)") and
`fla/ops/cp/` (a second all-gather of the same size in backward; conv halo of W-1 rows);
ring / zigzag / all-gather KV - Megatron-Core context parallelism (`cp_comm_type` p2p / all_gather) and
TASP (arXiv 2509.26541): every rank receives the K, V of the other P-1 ranks, (P-1)/P 2 S h_kv e bytes,
which for h_kv = d in bf16 is the seed's 4 b S d; Ulysses - DeepSpeed-Ulysses (PODC'24): two all-to-alls,
q, k, v in and o out, each rank keeping 1/P of its buffer; LASP-2 (arXiv 2502.07563): one all-gather of
the d_k x d_v memory state per head, independent of S.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3sim.cp.geometry import CPGeometry
from k3sim.errors import InputError
from k3sim.comm.model import ring_steps
from k3sim.kernels.ops import COLLECTIVE_OPS, wire_bytes  # nccl-tests bus factors: one formula for bytes and time

# strategy -> (layer kinds it applies to, token layout, what it is)
STRATEGIES: dict[str, tuple[frozenset[str], str, str]] = {
    "kcp": (frozenset({"kda"}), "contiguous", "KDA context parallelism: all-gather of [S~|M], prefix fold"),
    "lasp2": (frozenset({"kda"}), "contiguous",
              "LASP-2 all-gather of states + sum: exact only for plain linear attention (reference)"),
    "ulysses": (frozenset({"kda", "mla"}), "contiguous", "DeepSpeed-Ulysses all-to-all (heads <-> sequence)"),
    "ring": (frozenset({"mla"}), "contiguous", "ring attention: P-1 point-to-point K/V hops, overlapped"),
    "zigzag-ring": (frozenset({"mla"}), "zigzag", "ring attention on the load-balanced 2P-chunk layout"),
    "allgather-kv": (frozenset({"mla"}), "zigzag", "all-gather K/V before attention (head-tail layout)"),
}
KDA_STRATEGIES = tuple(k for k, v in STRATEGIES.items() if "kda" in v[0])
MLA_STRATEGIES = tuple(k for k, v in STRATEGIES.items() if "mla" in v[0])


def check_strategy(strategy: str, layer_kind: str, seq_len: int, P: int, heads: int, option: str) -> str:
    """Validate a (strategy, layer kind, S, P) combination; returns the token layout."""
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES)})", source=option)
    kinds, layout, _ = STRATEGIES[strategy]
    if layer_kind not in kinds:
        ok = KDA_STRATEGIES if layer_kind == "kda" else MLA_STRATEGIES
        raise InputError(f"strategy '{strategy}' does not apply to {layer_kind.upper()} layers "
                         f"(use one of: {', '.join(ok)})", source=option)
    if seq_len <= 0:
        raise InputError(f"sequence length must be positive, got {seq_len}", source="--seq-len")
    if P < 1:
        raise InputError(f"CP degree must be at least 1, got {P}", source="--cp")
    split = 2 * P if layout == "zigzag" else P
    if seq_len % split:
        raise InputError(f"{'2P' if layout == 'zigzag' else 'P'} = {split} does not divide the sequence length "
                         f"{seq_len} ({strategy} splits it into {split} equal parts)", source="--seq-len")
    if strategy == "ulysses":
        if P > heads:
            raise InputError(f"ulysses needs P <= heads: P = {P} > {heads} {layer_kind.upper()} heads per rank",
                             source="--cp")
        if heads % P:
            raise InputError(f"ulysses needs P to divide the {heads} {layer_kind.upper()} heads, P = {P}",
                             source="--cp")
    return layout


@dataclass(frozen=True)
class Collective:
    """One communication call on the critical path: nccl-tests convention for `shard_bytes`."""

    op: str                 # all_gather | reduce_scatter | all_to_all | send_recv
    shard_bytes: float
    count: int = 1          # how many times it runs (ring hops)
    what: str = ""


@dataclass
class Traffic:
    """Per rank, one layer, one direction (forward or backward)."""

    send_bytes: float = 0.0
    recv_bytes: float = 0.0
    messages: int = 0
    collectives: list[Collective] = field(default_factory=list)

    def add(self, c: Collective, P: int) -> None:
        """Account a collective's bytes as a ring/pairwise algorithm puts them on each rank's link."""
        if P == 1:
            return
        if c.op not in COLLECTIVE_OPS:
            raise KeyError(c.op)
        b, m = wire_bytes(c.op, c.shard_bytes, P), ring_steps(c.op, P)  # messages: the ring's dependent steps
        self.send_bytes += b * c.count
        self.recv_bytes += b * c.count
        self.messages += m * c.count
        self.collectives.append(c)


def layer_traffic(strategy: str, layer_kind: str, g: CPGeometry, seq_len: int, P: int,
                  state_bytes: float = 4.0, mla_kv: str = "latent", conv_halo: bool = True
                  ) -> tuple[Traffic, Traffic]:
    """(forward, backward) traffic of one layer per rank."""
    L = seq_len // P
    e = g.act_bytes
    fwd, bwd = Traffic(), Traffic()
    if strategy == "kcp":
        frag = g.kda_state_elems_per_rank(True) * state_bytes
        halo = (g.conv_kernel - 1) * g.kda_conv_channels_per_rank * e
        fwd.add(Collective("all_gather", frag, what="(S~, M) per rank (fla hm buffer)"), P)
        if conv_halo:
            fwd.add(Collective("send_recv", halo, what="conv halo: last W-1 rows of q,k,v"), P)
        bwd.add(Collective("all_gather", frag, what="(dS~, dM) per rank (fla dhm buffer)"), P)
        if conv_halo:
            bwd.add(Collective("send_recv", halo, what="conv halo gradient"), P)
    elif strategy == "lasp2":
        st = g.kda_state_elems_per_rank(False) * state_bytes
        fwd.add(Collective("all_gather", st, what="memory state per rank"), P)
        bwd.add(Collective("all_gather", st, what="state gradient per rank"), P)
    elif strategy == "ulysses":
        if layer_kind == "kda":
            i, o = g.kda_ulysses_in_elems_per_token, g.kda_ulysses_out_elems_per_token
            wi, wo = "q, k, v, g, beta", "o"
        else:
            i, o = g.mla_ulysses_in_elems_per_token, g.mla_ulysses_out_elems_per_token
            wi, wo = "q, k, v (expanded)", "o"
        fwd.add(Collective("all_to_all", L * i * e, what=wi + " -> head shards"), P)
        fwd.add(Collective("all_to_all", L * o * e, what=wo + " -> sequence shards"), P)
        bwd.add(Collective("all_to_all", L * o * e, what="d" + wo), P)
        bwd.add(Collective("all_to_all", L * i * e, what="gradients of " + wi), P)
    elif strategy in ("ring", "zigzag-ring"):
        kv = L * g.mla_kv_elems_per_token(mla_kv) * e
        fwd.add(Collective("send_recv", kv, count=P - 1, what=f"K/V block ({mla_kv}) per hop"), P)
        bwd.add(Collective("send_recv", kv, count=P - 1, what=f"K/V block ({mla_kv}) per hop"), P)
        bwd.add(Collective("send_recv", kv, count=P, what="dK/dV accumulator per hop, last one home"), P)
    elif strategy == "allgather-kv":
        kv = L * g.mla_kv_elems_per_token(mla_kv) * e
        fwd.add(Collective("all_gather", kv, what=f"K/V ({mla_kv}) of every rank"), P)
        bwd.add(Collective("reduce_scatter", kv, what="dK/dV back to their owners"), P)
    else:
        raise InputError(f"unknown strategy '{strategy}'")
    return fwd, bwd


def ring_kv_recv_bytes_per_rank(seq_len: float, P: int, kv_elems_per_token: float, act_bytes: float = 2.0) -> float:
    """Ring attention, forward: (P-1) hops of L = S/P tokens of K and V: (P-1)/P S kv e."""
    return (P - 1) / P * seq_len * kv_elems_per_token * act_bytes
