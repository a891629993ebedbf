"""The state folds of recurrent layers other than KDA under context parallelism: traffic and time per rank.

Both folds have KCP's shape (`cp/layers.kcp_layer`, fla `fla/ops/cp/KCP.md`): every rank computes the summary
of its last local document (pre-process), the ranks all-gather the summaries, each folds those of the ranks its
first document spans into its initial state, then runs the chunked kernel on its tokens; the backward mirrors
it (the summaries of the gradient, folded from the later ranks). Nothing overlaps (fla runs KCP this way;
LASP-2 overlaps the gather with intra-chunk work, which this model does not take). Per kind (`cp/kinds.py`):

- delta-rule fold (GDN, "kcp"): summary (S~, M), H x d_k x (d_v + d_k) per rank, H the value heads. The local
  kernel is the measured `chunk_gdn_fwd` {T, H, Hk} (and its forward+backward). The pre-process and the merge
  are fla's, one code path for GDN and KDA (`KCP.md`: GDN's scalar gate enters the same kernels as USE_G): the
  KCP parts measured alone (`cp/kcp_parts.py`) at H value heads where the profile has them, with the fitted
  fixed cost per call; else KCP's FLOP ratio (0.90, `flops.kcp_preprocess_factor`: per value head GDN's chunk
  products are KDA's, `kernels.ops.chunk_gdn_flop`) x chunk_gdn_fwd of the segment and H x d_k^3 matmul fold
  steps, as `kcp_layer` does without parts.
- decayed-sum fold (Mamba2, Mamba-1, lightning, "lasp2"): summary S~ and one cumulative decay per head (per
  channel for Mamba-1; none for lightning, whose decay is fixed). Pre-process: the local state pass, the
  2 K V FLOP per token and head of SSD's chunk-state step out of the chunked forward's 2C(K + V) + 4KV
  (`kernels.ops.ssd_flop_per_token_head`; Dao & Gu, arXiv 2405.21060 sec. 6) x the chunk op over the segment.
  Fold: a rank-prefix scan, elementwise: the last rank reads the earlier ranks' states and writes one (HBM
  bytes through the predictor's `hbm_read`).
"""

from __future__ import annotations

from k3sim.cp import docs as D
from k3sim.cp.kinds import RecurrentShape
from k3sim.cp.layers import FOLD_PASSES, LayerCost, LayerInputs, _comm_rows, _phase
from k3sim.cp.traffic import Collective, Traffic


def fold_traffic(s: RecurrentShape, P: int, conv_halo: bool = True) -> tuple[Traffic, Traffic]:
    """(forward, backward) per rank, one layer: the summaries' all-gather (the gradient's in backward, the same
    size) and the conv halo of W-1 rows to the next rank (its gradient back)."""
    what = {"matrix": f"(S~, M) per rank: {s.heads} x {s.dk} x ({s.dv} + {s.dk})",
            "scalar": f"(S~, cumulative decay) per rank: {s.heads} x {s.dk} x {s.dv} + {s.heads} fp32",
            "fixed": f"S~ per rank: {s.heads} x {s.dk} x {s.dv} (the fixed decay is known to every rank)"}[s.transition]
    fwd, bwd = Traffic(), Traffic()
    fwd.add(Collective("all_gather", s.fragment_bytes, what=what), P)
    bwd.add(Collective("all_gather", s.fragment_bytes, what="gradient of " + what), P)
    if conv_halo and s.halo_bytes:
        fwd.add(Collective("send_recv", s.halo_bytes, what="conv halo: last W-1 conv inputs"), P)
        bwd.add(Collective("send_recv", s.halo_bytes, what="conv halo gradient"), P)
    return fwd, bwd


def state_recv_bytes(s: RecurrentShape, P: int) -> float:
    """Forward bytes of the summaries alone (no conv halo) that one rank receives."""
    return fold_traffic(s, P, conv_halo=False)[0].recv_bytes


def _chunk(x: LayerInputs, s: RecurrentShape, T: int) -> tuple[float, float, str]:
    """(forward, backward, source) of the kind's chunked kernel over T tokens: backward = fwd+bwd - fwd."""
    f, src = x.clock(s.op, T=T, **s.params)
    fb, src2 = x.clock(s.op + "_bwd", T=T, **s.params)
    return f, max(fb - f, 0.0), src if src == src2 else f"{src}/{src2}"


def state_pass_factor(s: RecurrentShape) -> float:
    """Local state pass of a scalar-decay layer as a share of its chunked forward, by FLOP: 2KV / (2C(K+V) + 4KV)
    at the op's K, V (0.29 for Mamba2 at K = 128, V = 64; 0.33 for K = V = 128)."""
    from k3sim.kernels.ops import KDA_CHUNK, ssd_flop_per_token_head

    K, V = s.params["K"], s.params["V"]
    return 2.0 * K * V / ssd_flop_per_token_head(KDA_CHUNK, K, V)


def _pre(x: LayerInputs, s: RecurrentShape, seg_lens: list[int], direction: str) -> tuple[float, str, str]:
    """Slowest rank's pre-process over its exported segment: (seconds, what, source)."""
    if not seg_lens:
        return 0.0, "none needed", "none"
    if s.transition != "matrix":
        k = state_pass_factor(s)
        got = [x.clock(s.op, T=t, **s.params) for t in seg_lens]
        return k * max(g[0] for g in got), f"{k:.2f} x {s.op} (FLOP ratio: the local state pass)", got[0][1]
    if x.pre_model == "parts":
        got = [x.parts.pre(direction, int(t), s.heads, K=s.dk, V=s.dv) for t in seg_lens]
        t, how = max(got)
        name = "chunk_cp_fwd_h" if direction == "fwd" else "chunk_cp_bwd_dh"
        return t, f"fla {name} measured alone (fla's one pre-process for GDN and KDA)", how
    k = x.kcp_pre_factor
    got = [x.clock(s.op, T=t, **s.params) for t in seg_lens]
    return k * max(g[0] for g in got), f"{k:.2f} x {s.op} (FLOP ratio)", got[0][1]


def _merge(x: LayerInputs, s: RecurrentShape, steps: int) -> tuple[float, str, str]:
    """Seconds of the slowest rank's fold over `steps` earlier (later, backward) ranks: (seconds, how, source)."""
    if s.transition != "matrix":
        if steps <= 0:
            return 0.0, "rank-prefix scan", "none"
        t, src = x.clock("hbm_read", bytes=(steps + 1) * s.state_bytes)
        return t, f"rank-prefix scan, {steps + 1} states through HBM", src
    if x.pre_model == "parts":
        return x.parts.fit_merge.seconds(steps), "chunk_cp_merge", "model (chunk_cp_merge measured alone)"
    step, src = x.clock("gemm_bf16", M=s.heads * s.dk, N=s.dv, K=s.dk)
    return steps * step * FOLD_PASSES[s.state_dtype], f"H x {s.dk}^3 matmul", src


def fold_layer(x: LayerInputs, s: RecurrentShape, scheme: str) -> LayerCost:
    """One recurrent layer's fold (`scheme` "kcp" or "lasp2", `cp/kinds.SCHEMES`), forward and backward, per rank
    (module docstring)."""
    P, L = x.P, x.L
    fwd_tr, bwd_tr = fold_traffic(s, P, x.conv_halo)
    t_f, t_b, src = _chunk(x, s, L)
    rows_f = [(f"{s.op}, local tokens", t_f, src, "compute")]
    rows_b = [(f"{s.op} bwd, local tokens", t_b, src, "compute")]
    if P > 1:
        pre, post = D.fold_steps(x.bounds, x.seq_len, P)
        last_seg, first_seg = D.segment_lengths(x.bounds, x.seq_len, P)
        need_f = [last_seg[r] for r in range(P - 1) if pre[r + 1] > 0]
        need_b = [first_seg[r] for r in range(1, P) if post[r - 1] > 0]
        for rows, segs, steps, direction in ((rows_f, need_f, int(pre.max()), "fwd"),
                                             (rows_b, need_b, int(post.max()), "bwd")):
            t, what, psrc = _pre(x, s, segs, direction)
            m, how, msrc = _merge(x, s, steps)
            side = "last" if direction == "fwd" else "first"
            rows += [(f"pre-process: summary of the {side} segment, {what}", t, psrc, "compute"),
                     (f"fold: {steps} steps of {how}", m, msrc, "compute")]
        if s.transition == "matrix" and x.pre_model == "parts":
            hw = x.clock.hardware
            cf, cfb = x.parts.fixed_s(hw, False), x.parts.fixed_s(hw, True)
            src_c = "model (fitted on the 2-GPU fla KCP rows of KDA: the same CP code path)"
            rows_f.append(("KCP fixed cost per call", cf, src_c, "compute"))
            rows_b.append(("KCP fixed cost per call (fwd+bwd constant less the fwd one, at least 0)",
                           max(0.0, cfb - cf), src_c, "compute"))
    rows_f += _comm_rows(x, fwd_tr)
    rows_b += _comm_rows(x, bwd_tr)
    notes = ["no overlap: the main kernel waits for the folded initial state"]
    if s.transition == "matrix":
        notes.append("KCP on GDN: the transition M = prod a (I - b k k^T) per value head (fla fla/ops/cp/KCP.md)")
    else:
        notes.append("exact: a scalar decay commutes with the state, so the initial state is the decayed sum of "
                     "the earlier ranks' states (LASP-2, arXiv 2502.07563; SSD state passing, arXiv 2405.21060)")
    if s.op_note:
        notes.append(s.op_note)
    return LayerCost(s.kind, scheme, "contiguous", x.comm.link, _phase(fwd_tr, rows_f), _phase(bwd_tr, rows_b),
                     notes)
