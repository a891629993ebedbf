"""Softmax-attention layers of the hybrid kinds (GQA, SWA) under context parallelism: traffic and time per rank.

The schemes are MLA's (`cp/layers.py`) on GQA's K and V: a token adds the registry's `kv_bytes_per_token` (K and V
of the KV heads one TP rank holds: Qwen3-Next 2 x 2 x 256 x 2 B = 2 KiB), with nothing to up-project. The work
is (query, key) pairs (`cp/docs`, document masks included) times seconds per pair of the measured GQA prefill op
`gqa_prefill_fwd` {T, Hq, Hkv, D, window} at the rank's T (FlashAttention-2 through torch), the backward from
`sdpa_causal_fwd_bwd - sdpa_causal_fwd` at H = Hq (FlashAttention's backward with GQA costs as MHA compute, the
step model's rule). Sources of the schemes as in `cp/traffic.py`:
- allgather-kv (Megatron-Core all_gather CP; LASP-2H's gather for the softmax layers of a hybrid, arXiv
  2502.07563): every rank's K/V before attention on the head-tail layout, gathered again in backward, dK/dV
  reduce-scattered home;
- ring / zigzag-ring: P - 1 K/V hops, each under the previous block's attention; backward K/V and dK/dV hops;
- ulysses (DeepSpeed-Ulysses): all-to-all of q, k, v into head shards and of o back; P must divide the query
  heads per rank; with fewer KV heads than P each rank receives a copy of the KV head its query heads read;
- window-halo (SWA): a query sees the W - 1 keys before it, so a rank receives the K/V of the W - 1 tokens
  before its first (from the previous rank; from several when W - 1 > S/P) and sends their gradient back.
"""

from __future__ import annotations

import math

import numpy as np

from k3sim.cp import docs as D
from k3sim.cp.kinds import AttentionShape
from k3sim.cp.layers import LayerCost, LayerInputs, _comm_rows, _phase
from k3sim.cp.traffic import Collective, Traffic
from k3sim.errors import InputError
from k3sim.kernels.ops import window_pairs

LAYOUTS = {"allgather-kv": "zigzag", "zigzag-ring": "zigzag", "ring": "contiguous", "ulysses": "contiguous",
           "window-halo": "contiguous"}


def check_split(scheme: str, seq_len: int, P: int) -> str:
    """The token layout of `scheme`, after checking that its split of S into P (or 2P) parts is whole."""
    if seq_len <= 0:
        raise InputError(f"sequence length must be positive, got {seq_len}", source="--seq-len")
    if P < 1:
        raise InputError(f"CP degree must be at least 1, got {P}", source="--cp")
    layout = LAYOUTS.get(scheme, "contiguous")
    split = 2 * P if layout == "zigzag" else P
    if seq_len % split:
        raise InputError(f"{'2P' if layout == 'zigzag' else 'P'} = {split} does not divide the sequence length "
                         f"{seq_len} ({scheme} splits it into {split} equal parts)", source="--seq-len")
    return layout


def ulysses_kv_heads(a: AttentionShape, P: int) -> int:
    """KV heads the all-to-all moves per token: all of them when P divides them; when P is a multiple of them, P
    (each destination rank receives a copy of the one KV head its query heads read). Anything else, and a P
    that does not divide the query heads, is refused in one line naming --cp."""
    if a.q_heads % P:
        raise InputError(f"ulysses needs --cp to divide the {a.q_heads} {a.title} query heads per rank, got "
                         f"--cp {P} (use allgather-kv, ring or zigzag-ring)", source="--cp")
    if a.kv_heads % P == 0:
        return a.kv_heads
    if P % a.kv_heads == 0:
        return P
    raise InputError(f"ulysses needs --cp {P} to divide the {a.kv_heads} {a.title} KV heads per rank or be a "
                     "multiple of them", source="--cp")


def halo_tokens(a: AttentionShape, seq_len: int, P: int) -> int:
    """Tokens before a rank's first that its queries see: W - 1, at most everything before the last rank."""
    return min(int(a.window) - 1, (P - 1) * (seq_len // P)) if P > 1 else 0


def attention_traffic(scheme: str, a: AttentionShape, seq_len: int, P: int) -> tuple[Traffic, Traffic]:
    """(forward, backward) per rank, one layer (module docstring)."""
    L = seq_len // P
    kv = L * a.kv_bytes_per_token
    fwd, bwd = Traffic(), Traffic()
    if scheme == "allgather-kv":
        fwd.add(Collective("all_gather", kv, what="K/V of every rank"), P)
        bwd.add(Collective("reduce_scatter", kv, what="dK/dV back to their owners"), P)
    elif scheme in ("ring", "zigzag-ring"):
        fwd.add(Collective("send_recv", kv, count=P - 1, what="K/V block per hop"), P)
        bwd.add(Collective("send_recv", kv, count=P - 1, what="K/V block per hop"), P)
        bwd.add(Collective("send_recv", kv, count=P, what="dK/dV accumulator per hop, last one home"), P)
    elif scheme == "ulysses":
        D_, e = a.head_dim, a.act_bytes
        i, o = (a.q_heads + 2 * ulysses_kv_heads(a, P)) * D_, a.q_heads * D_
        fwd.add(Collective("all_to_all", L * i * e, what="q, k, v -> head shards"), P)
        fwd.add(Collective("all_to_all", L * o * e, what="o -> sequence shards"), P)
        bwd.add(Collective("all_to_all", L * o * e, what="do"), P)
        bwd.add(Collective("all_to_all", L * i * e, what="gradients of q, k, v"), P)
    elif scheme == "window-halo":
        n = halo_tokens(a, seq_len, P)
        if n > 0:
            hops = math.ceil(n / L)
            fwd.add(Collective("send_recv", n * a.kv_bytes_per_token / hops, count=hops,
                               what=f"K/V halo: the {n} tokens before the rank"), P)
            bwd.add(Collective("send_recv", n * a.kv_bytes_per_token / hops, count=hops,
                               what="dK/dV of the halo back"), P)
    else:
        raise InputError(f"unknown strategy '{scheme}' for {a.title} layers", source="--strategy")
    return fwd, bwd


def _pair_seconds(x: LayerInputs, a: AttentionShape, T: int, H: int, Hkv: int,
                  window: int | None) -> tuple[float, float, str]:
    """Seconds per (query, key) pair at length T, forward (gqa_prefill_fwd) and backward (sdpa, H = Hq)."""
    W = T if window is None else min(int(window), T)
    f, src = x.clock("gqa_prefill_fwd", T=T, Hq=H, Hkv=Hkv, D=a.head_dim, window=W)
    sf, _ = x.clock("sdpa_causal_fwd", T=T, H=H, D=a.head_dim)
    sfb, src_b = x.clock("sdpa_causal_fwd_bwd", T=T, H=H, D=a.head_dim)
    return f / window_pairs(T, W), max(sfb - sf, 0.0) / window_pairs(T, T), src if src == src_b else f"{src}/{src_b}"


BWD_LABEL = "sdpa_causal_fwd_bwd - fwd at H = Hq: GQA's backward costed as MHA compute"


def ring_gqa_layer(x: LayerInputs, a: AttentionShape, scheme: str) -> LayerCost:
    P, L = x.P, x.L
    layout = LAYOUTS[scheme]
    fwd_tr, bwd_tr = attention_traffic(scheme, a, x.seq_len, P)
    pf, pb, src = _pair_seconds(x, a, L, a.q_heads, a.kv_heads, None)
    pairs = D.pair_matrix(x.bounds, x.seq_len, P, layout)
    hop, hop_src = x.comm.time(fwd_tr.collectives[0]) if P > 1 else (0.0, "none")
    hop /= max(P - 1, 1)
    tf = tb = cf = cb = 0.0
    for j in range(P):
        step_pairs = max(pairs[r, (r - j) % P] for r in range(P))
        m = hop if j < P - 1 else 0.0
        tf += max(step_pairs * pf, m)
        tb += max(step_pairs * pb, 2 * m)                 # K/V and dK/dV hops
        cf += step_pairs * pf
        cb += step_pairs * pb
    tb += hop                                             # dK/dV's last hop home
    rows_f = [("attention blocks (slowest rank per step)", cf, src, "compute"),
              (f"send_recv K/V x{P - 1}, overlapped", (P - 1) * hop, hop_src, "comm")]
    rows_b = [(f"attention blocks bwd ({BWD_LABEL})", cb, src, "compute"),
              (f"send_recv K/V + dK/dV x{P - 1} (+1 home), overlapped", (2 * (P - 1) + 1) * hop * (P > 1),
               hop_src, "comm")]
    notes = ["each hop overlaps the previous block's attention; exposed = max(0, hop - block compute)"]
    return LayerCost(a.kind, scheme, layout, x.comm.link, _phase(fwd_tr, rows_f, tf), _phase(bwd_tr, rows_b, tb),
                     notes)


def allgather_gqa_layer(x: LayerInputs, a: AttentionShape) -> LayerCost:
    P, L = x.P, x.L
    fwd_tr, bwd_tr = attention_traffic("allgather-kv", a, x.seq_len, P)
    pf, pb, src = _pair_seconds(x, a, L, a.q_heads, a.kv_heads, None)
    work = D.pair_matrix(x.bounds, x.seq_len, P, "zigzag").sum(axis=1).max()
    gather = _comm_rows(x, fwd_tr)
    rows_f = [("attention, local queries x all keys", work * pf, src, "compute"), *gather]
    rows_b = [(f"attention bwd ({BWD_LABEL})", work * pb, src, "compute"),
              *[(f"re-{c} (K/V not kept across fwd/bwd)", t, sr, k) for c, t, sr, k in gather],
              *_comm_rows(x, bwd_tr)]
    bwd_tr.send_bytes += fwd_tr.send_bytes
    bwd_tr.recv_bytes += fwd_tr.recv_bytes
    bwd_tr.messages += fwd_tr.messages
    notes = ["head-tail (zigzag) layout balances the causal work; the gather is not overlapped"]
    return LayerCost(a.kind, "allgather-kv", "zigzag", x.comm.link, _phase(fwd_tr, rows_f), _phase(bwd_tr, rows_b),
                     notes)


def ulysses_gqa_layer(x: LayerInputs, a: AttentionShape) -> LayerCost:
    P, S = x.P, x.seq_len
    fwd_tr, bwd_tr = attention_traffic("ulysses", a, S, P)
    H, Hkv = a.q_heads // P, max(ulysses_kv_heads(a, P) // P, 1)
    pf, pb, src = _pair_seconds(x, a, S, H, Hkv, None)
    work = D.attention_pairs(x.bounds, (0, S), (0, S))
    rows_f = [("attention, all tokens, Hq/P heads", work * pf, src, "compute"), *_comm_rows(x, fwd_tr)]
    rows_b = [(f"attention bwd ({BWD_LABEL})", work * pb, src, "compute"), *_comm_rows(x, bwd_tr)]
    return LayerCost(a.kind, "ulysses", "contiguous", x.comm.link, _phase(fwd_tr, rows_f), _phase(bwd_tr, rows_b),
                     ["q, k, v and o cross in two all-to-alls each way; the attention itself is local"])


def window_pairs_per_rank(bounds: np.ndarray | None, seq_len: int, P: int, W: int) -> np.ndarray:
    """(query, key) pairs of each rank's queries under a window of W keys (itself and W - 1 before it), documents
    masked: sum over its tokens t of t - max(document start, t - W + 1) + 1."""
    L = seq_len // P
    if bounds is None or len(bounds) == 2:
        return np.array([window_pairs((r + 1) * L, W) - window_pairs(r * L, W) for r in range(P)], dtype=float)
    t = np.arange(seq_len, dtype=np.int64)
    start = bounds[np.searchsorted(bounds, t, side="right") - 1]
    return (t - np.maximum(start, t - W + 1) + 1).reshape(P, L).sum(axis=1).astype(float)


def window_halo_layer(x: LayerInputs, a: AttentionShape) -> LayerCost:
    P, L = x.P, x.L
    fwd_tr, bwd_tr = attention_traffic("window-halo", a, x.seq_len, P)
    pf, pb, src = _pair_seconds(x, a, L, a.q_heads, a.kv_heads, a.window)
    work = window_pairs_per_rank(x.bounds, x.seq_len, P, int(a.window)).max()
    rows_f = [(f"windowed attention, local queries (W = {a.window})", work * pf, src, "compute"),
              *_comm_rows(x, fwd_tr)]
    rows_b = [(f"windowed attention bwd ({BWD_LABEL})", work * pb, src, "compute"), *_comm_rows(x, bwd_tr)]
    notes = ["nothing beyond the window crosses ranks: only the halo, not overlapped"]
    return LayerCost(a.kind, "window-halo", "contiguous", x.comm.link, _phase(fwd_tr, rows_f),
                     _phase(bwd_tr, rows_b), notes)


def attention_layer(x: LayerInputs, a: AttentionShape, scheme: str) -> LayerCost:
    """One GQA or SWA layer under `scheme` (`cp/kinds.SCHEMES`)."""
    if scheme in ("ring", "zigzag-ring"):
        return ring_gqa_layer(x, a, scheme)
    return {"allgather-kv": allgather_gqa_layer, "ulysses": ulysses_gqa_layer,
            "window-halo": window_halo_layer}[scheme](x, a)
