"""Time of one layer's attention work per CP rank, forward and backward, per strategy.

Kernel times come from the calibrated predictor (`kernel_time`); only the composition is modelled here:
what runs on the critical path, what overlaps with what (ring hops hide under block compute; KCP's
all-gather, Ulysses' all-to-alls and all-gather-KV do not), and the extra work of each scheme (KCP
pre-process and fold, latent up-projection). The slowest rank sets the time: every scheme ends in a
collective or a ring step that waits for all ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from k3sim.cp import docs as D
from k3sim.cp.comm import CommModel, KernelClock
from k3sim.cp.flops import kcp_preprocess_factor, lasp2_local_state_factor
from k3sim.cp.geometry import CPGeometry
from k3sim.cp.traffic import Traffic, layer_traffic

# fla keeps the M chain and the fold in fp32 via TF32x3 (three TF32 MMA passes; PR #740, KCP.md);
# a bf16 state folds in one pass.
FOLD_PASSES = {"bf16": 1.0, "fp32": 3.0}


@dataclass
class PhaseCost:
    """One layer, one direction, per rank. Seconds and bytes (SI)."""

    send_bytes: float
    recv_bytes: float
    messages: int
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    time_s: float
    rows: list[dict] = field(default_factory=list)     # breakdown: component, seconds, source


@dataclass
class LayerCost:
    layer_kind: str
    strategy: str
    layout: str
    link: str
    fwd: PhaseCost
    bwd: PhaseCost
    notes: list[str] = field(default_factory=list)

    @property
    def time_s(self) -> float:
        return self.fwd.time_s + self.bwd.time_s


@dataclass
class LayerInputs:
    g: CPGeometry
    clock: KernelClock
    comm: CommModel
    seq_len: int
    P: int
    bounds: np.ndarray                  # document boundaries [0, ..., S]
    state_dtype: str = "fp32"
    mla_kv: str = "latent"
    kcp_pre_factor: float = field(default_factory=kcp_preprocess_factor)
    conv_halo: bool = True              # False: the KDA op alone, as the calibration harness times it
    intra: Any = None                   # fitted IntraParams (host floor, GPU time of a chunk_kda call)
    pre_model: str = "flop-ratio"       # KCP pre-process: "parts" | "flop-ratio" | "state-pass" (alternative)
    parts: Any = None                   # cp.kcp_parts.Parts: fla's pre-process and merge measured alone

    @property
    def L(self) -> int:
        return self.seq_len // self.P


def _phase(tr: Traffic, rows: list[tuple[str, float, str, str]], time_s: float | None = None) -> PhaseCost:
    """rows: (component, seconds, source, kind) with kind compute | comm; `time_s` None: nothing overlaps,
    the phase takes the sum of its rows."""
    if time_s is None:
        time_s = sum(r[1] for r in rows)
    comp = sum(r[1] for r in rows if r[3] == "compute")
    comm = sum(r[1] for r in rows if r[3] == "comm")
    return PhaseCost(tr.send_bytes, tr.recv_bytes, tr.messages, comp, comm, max(0.0, time_s - comp), time_s,
                     [{"component": c, "seconds": s, "source": src} for c, s, src, _ in rows])


def _comm_rows(x: LayerInputs, tr: Traffic) -> list[tuple[str, float, str, str]]:
    out = []
    for c in tr.collectives:
        s, src = x.comm.time(c)
        out.append((f"{c.op}: {c.what}" + (f" x{c.count}" if c.count > 1 else ""), s, src, "comm"))
    return out


# ---------------------------------------------------------------- KDA layers

def _head_dims(x: LayerInputs) -> dict:
    """The layer's KDA head dims for the kernel predictor, only where they differ from the measured 128
    (the predictor then scales from 128 and says `extrapolated`)."""
    k, v = x.g.kda_head_dim_k, x.g.kda_head_dim_v
    return {} if (k, v) == (128, 128) else {"K": k, "V": v}


def _kda_fwd_bwd(x: LayerInputs, T: int, H: int) -> tuple[float, float, str]:
    f, src = x.clock("chunk_kda_fwd", T=T, H=H, **_head_dims(x))
    fb, src2 = x.clock("chunk_kda_fwd_bwd", T=T, H=H, **_head_dims(x))
    return f, max(fb - f, 0.0), src if src == src2 else f"{src}/{src2}"


def kcp_layer(x: LayerInputs) -> LayerCost:
    g, P, L = x.g, x.P, x.L
    H = g.kda_heads_per_rank
    fwd_tr, bwd_tr = layer_traffic("kcp", "kda", g, x.seq_len, P, _state_bytes(x), x.mla_kv, x.conv_halo)
    t_f, t_b, src = _kda_fwd_bwd(x, L, H)
    rows_f = [("chunk_kda_fwd, local tokens", t_f, src, "compute")]
    rows_b = [("chunk_kda bwd, local tokens", t_b, src, "compute")]
    if P > 1:
        pre, post = D.fold_steps(x.bounds, x.seq_len, P)
        last_seg, first_seg = D.segment_lengths(x.bounds, x.seq_len, P)
        # pre-process: ranks whose last segment a later rank folds (fwd), whose first an earlier one does (bwd)
        need_f = [r for r in range(P - 1) if pre[r + 1] > 0]
        need_b = [r for r in range(1, P) if post[r - 1] > 0]
        pf, pre_label, pre_src = _preprocess(x, [last_seg[r] for r in need_f], H, src)
        pb, _, _ = _preprocess(x, [first_seg[r] for r in need_b], H, src, "bwd")
        if x.pre_model == "parts":  # fla's chunk_cp_merge measured alone (cp/kcp_parts.py)
            mf, mb = x.parts.fit_merge.seconds(int(pre.max())), x.parts.fit_merge.seconds(int(post.max()))
            ssrc, how = "model (chunk_cp_merge measured alone)", "chunk_cp_merge"
        else:
            step, ssrc = x.clock("gemm_bf16", M=H * g.kda_head_dim_k, N=g.kda_head_dim_v, K=g.kda_head_dim_k)
            step *= FOLD_PASSES[x.state_dtype]
            mf, mb, how = int(pre.max()) * step, int(post.max()) * step, f"H x {g.kda_head_dim_k}^3 matmul"
        rows_f += [(f"pre-process (M, S~) of last segment, {pre_label}", pf, pre_src, "compute"),
                   (f"fold: {int(pre.max())} steps of {how}", mf, ssrc, "compute")]
        rows_b += [(f"pre-process (dM, dS~) of first segment, {pre_label}", pb, pre_src, "compute"),
                   (f"fold: {int(post.max())} steps of {how}", mb, ssrc, "compute")]
        if x.pre_model == "parts":  # the rebuilt op's one fitted constant per direction (cp/kcp_parts.py)
            hw = x.clock.hardware
            cf, cfb = x.parts.fixed_s(hw, False), x.parts.fixed_s(hw, True)
            src_c = "model (fitted on the 2-GPU fla KCP rows)"
            rows_f.append(("KCP fixed cost per call", cf, src_c, "compute"))
            rows_b.append(("KCP fixed cost per call (fwd+bwd constant less the fwd one, at least 0)",
                           max(0.0, cfb - cf), src_c, "compute"))
    rows_f += _comm_rows(x, fwd_tr)
    rows_b += _comm_rows(x, bwd_tr)
    notes = ["no overlap: the main kernel waits for the folded initial state (fla runs it this way)"]
    return LayerCost("kda", "kcp", "contiguous", x.comm.link,
                     _phase(fwd_tr, rows_f),
                     _phase(bwd_tr, rows_b), notes)


def _preprocess(x: LayerInputs, seg_lens: list[int], H: int, src: str, direction: str = "fwd") -> tuple[float, str, str]:
    """Slowest rank's pre-process: the S~ state pass plus the M chain over its exported segment.

    "parts" (the default where the profile has them): fla's `chunk_cp_fwd_h` / `chunk_cp_bwd_dh` timed
    alone on one GPU (cp/kcp_parts.py: measured rows, else chunks x tau x waves(H)).

    "flop-ratio": `kcp_pre_factor` (0.90, `flops.kcp_preprocess_factor`) x the GPU time of a chunk_kda
    forward over the segment. The pre-process runs inside the same host call as the main kernel, so with
    fitted intra-device parameters it scales the fitted GPU time, not the measured call time that a
    host-bound short call reports (a host floor in the measurements would otherwise be counted twice;
    the H200 data are GPU times since the 2026-11-30 h/i runs, and their fit has none).
    "state-pass": (1 + mu) x the fitted state-pass time (stages 1 and 2 of `KCP.md` as serial passes over
    the same lanes); kept as the alternative the measurements reject."""
    if not seg_lens:
        return 0.0, "none needed", "none"
    from k3sim.cp.intra_device import gpu_seconds, serial_pass_seconds

    if x.pre_model == "parts":
        got = [x.parts.pre(direction, int(t), H, K=x.g.kda_head_dim_k, V=x.g.kda_head_dim_v) for t in seg_lens]
        s, how = max(got)
        return s, f"fla {'chunk_cp_fwd_h' if direction == 'fwd' else 'chunk_cp_bwd_dh'} measured alone", how
    if x.pre_model == "state-pass":
        if x.intra is None:
            raise ValueError("the state-pass pre-process model needs fitted intra-device parameters")
        return (max(serial_pass_seconds(t, H, x.intra, m_chain=True) for t in seg_lens),
                "(1 + mu) x state pass (intra-device fit)", x.intra.source)
    k = x.kcp_pre_factor
    if x.intra is not None:
        return (k * max(gpu_seconds(t, H, x.intra) for t in seg_lens),
                f"{k:.2f} x chunk_kda_fwd GPU time (FLOP ratio)", x.intra.source)
    return (k * max(x.clock("chunk_kda_fwd", T=t, H=H, **_head_dims(x))[0] for t in seg_lens),
            f"{k:.2f} x chunk_kda_fwd (FLOP ratio)", src)


def lasp2_layer(x: LayerInputs) -> LayerCost:
    g, P, L = x.g, x.P, x.L
    H = g.kda_heads_per_rank
    fwd_tr, bwd_tr = layer_traffic("lasp2", "kda", g, x.seq_len, P, _state_bytes(x))
    t_f, t_b, src = _kda_fwd_bwd(x, L, H)
    k = lasp2_local_state_factor()
    extra = [(f"local state sum K^T V, {k:.2f} x chunk_kda_fwd", k * t_f, src, "compute")] if P > 1 else []
    rows_f = [("chunk kernel, local tokens (chunk_kda_fwd as proxy)", t_f, src, "compute"), *extra,
              *_comm_rows(x, fwd_tr)]
    rows_b = [("chunk kernel bwd, local tokens (proxy)", t_b, src, "compute"), *extra, *_comm_rows(x, bwd_tr)]
    notes = ["reference only: exact for plain linear attention (M = I), not for KDA's delta rule"]
    return LayerCost("kda", "lasp2", "contiguous", x.comm.link, _phase(fwd_tr, rows_f),
                     _phase(bwd_tr, rows_b), notes)


def ulysses_kda_layer(x: LayerInputs) -> LayerCost:
    g, P = x.g, x.P
    fwd_tr, bwd_tr = layer_traffic("ulysses", "kda", g, x.seq_len, P)
    t_f, t_b, src = _kda_fwd_bwd(x, x.seq_len, g.kda_heads_per_rank // P)
    rows_f = [("chunk_kda_fwd, all tokens, H/P heads", t_f, src, "compute"), *_comm_rows(x, fwd_tr)]
    rows_b = [("chunk_kda bwd, all tokens, H/P heads", t_b, src, "compute"), *_comm_rows(x, bwd_tr)]
    notes = ["short conv runs after the all-to-all (per channel, whole sequence): no halo"]
    return LayerCost("kda", "ulysses", "contiguous", x.comm.link, _phase(fwd_tr, rows_f),
                     _phase(bwd_tr, rows_b), notes)


# ---------------------------------------------------------------- MLA layers

def _pair_seconds(x: LayerInputs, T: int, H: int) -> tuple[float, float, str]:
    """Seconds per (query, key) pair, fwd and bwd, from the causal SDPA kernel at length T."""
    Dq = x.g.mla_sdpa_head_dim
    f, src = x.clock("sdpa_causal_fwd", T=T, H=H, D=Dq)
    fb, _ = x.clock("sdpa_causal_fwd_bwd", T=T, H=H, D=Dq)
    n = T * (T + 1) / 2
    return f / n, max(fb - f, 0.0) / n, src


def _expand(x: LayerInputs, tokens: int) -> tuple[float, str]:
    """Latent -> per-head K_nope, V up-projection of `tokens` received tokens (one GEMM)."""
    if tokens <= 0 or x.mla_kv != "latent":
        return 0.0, "none"
    return x.clock("gemm_bf16", M=tokens, N=x.g.mla_up_proj_width, K=x.g.kv_lora_rank)


def ring_layer(x: LayerInputs, strategy: str) -> LayerCost:
    g, P, L = x.g, x.P, x.L
    layout = "zigzag" if strategy == "zigzag-ring" else "contiguous"
    fwd_tr, bwd_tr = layer_traffic(strategy, "mla", g, x.seq_len, P, mla_kv=x.mla_kv)
    pf, pb, src = _pair_seconds(x, L, g.mla_heads_per_rank)
    pairs = D.pair_matrix(x.bounds, x.seq_len, P, layout)
    hop, hop_src = x.comm.time(fwd_tr.collectives[0]) if P > 1 else (0.0, "none")
    hop /= max(P - 1, 1)
    xe, xsrc = _expand(x, L)
    tf = tb = cf = cb = 0.0
    for j in range(P):
        step_pairs = max(pairs[r, (r - j) % P] for r in range(P))
        c_f = step_pairs * pf + (xe if j else 0.0)
        c_b = step_pairs * pb + (3 * xe if j else 0.0)   # re-expand, d latent, d W_up
        m = hop if j < P - 1 else 0.0
        tf += max(c_f, m)
        tb += max(c_b, 2 * m)                             # K/V and dK/dV hops
        cf += c_f
        cb += c_b
    tb += hop                                             # dK/dV's last hop home (P dK/dV sends in all)
    rows_f = [("attention blocks (slowest rank per step)", cf - (P - 1) * xe, src, "compute")]
    rows_b = [("attention blocks bwd (slowest rank per step)", cb - 3 * (P - 1) * xe, src, "compute")]
    if xe:
        rows_f.append(("latent up-projection of received blocks", (P - 1) * xe, xsrc, "compute"))
        rows_b.append(("re-expand + grads of up-projection", 3 * (P - 1) * xe, xsrc, "compute"))
    rows_f.append((f"send_recv K/V ({x.mla_kv}) x{P - 1}, overlapped", (P - 1) * hop, hop_src, "comm"))
    rows_b.append((f"send_recv K/V + dK/dV x{P - 1} (+1 home), overlapped", (2 * (P - 1) + 1) * hop * (P > 1),
                   hop_src, "comm"))
    notes = ["each hop overlaps the previous block's attention; exposed = max(0, hop - block compute)"]
    if layout == "contiguous" and P > 1:
        imb = pairs.sum(axis=1).max() / pairs.sum(axis=1).mean()
        notes.append(f"causal load imbalance: slowest rank does {imb:.2f}x the mean work")
    return LayerCost("mla", strategy, layout, x.comm.link, _phase(fwd_tr, rows_f, tf), _phase(bwd_tr, rows_b, tb),
                     notes)


def allgather_kv_layer(x: LayerInputs) -> LayerCost:
    g, P, L = x.g, x.P, x.L
    fwd_tr, bwd_tr = layer_traffic("allgather-kv", "mla", g, x.seq_len, P, mla_kv=x.mla_kv)
    pf, pb, src = _pair_seconds(x, L, g.mla_heads_per_rank)
    work = D.pair_matrix(x.bounds, x.seq_len, P, "zigzag").sum(axis=1).max()
    xe, xsrc = _expand(x, (P - 1) * L)
    rows_f = [("attention, local queries x all keys", work * pf, src, "compute")]
    rows_b = [("attention bwd", work * pb, src, "compute")]
    if xe:
        rows_f.append(("latent up-projection of gathered tokens", xe, xsrc, "compute"))
        rows_b.append(("re-expand + grads of up-projection", 3 * xe, xsrc, "compute"))
    gather = _comm_rows(x, fwd_tr)
    rows_f += gather
    # backward re-gathers K/V (keeping every rank's gathered K/V for all layers does not fit at long S)
    rows_b += [(f"re-{c} (K/V not kept across fwd/bwd)", t, sr, k) for c, t, sr, k in gather] + _comm_rows(x, bwd_tr)
    bwd_tr.send_bytes += fwd_tr.send_bytes
    bwd_tr.recv_bytes += fwd_tr.recv_bytes
    bwd_tr.messages += fwd_tr.messages
    notes = ["head-tail (zigzag) layout balances the causal work; gather is not overlapped (Megatron all_gather)"]
    return LayerCost("mla", "allgather-kv", "zigzag", x.comm.link, _phase(fwd_tr, rows_f),
                     _phase(bwd_tr, rows_b), notes)


def ulysses_mla_layer(x: LayerInputs) -> LayerCost:
    g, P, S = x.g, x.P, x.seq_len
    fwd_tr, bwd_tr = layer_traffic("ulysses", "mla", g, S, P)
    H = g.mla_heads_per_rank // P
    pf, pb, src = _pair_seconds(x, S, H)
    work = D.attention_pairs(x.bounds, (0, S), (0, S))
    rows_f = [("attention, all tokens, H/P heads", work * pf, src, "compute"), *_comm_rows(x, fwd_tr)]
    rows_b = [("attention bwd", work * pb, src, "compute"), *_comm_rows(x, bwd_tr)]
    notes = ["moves expanded q, k, v (the latent is shared by all heads and cannot be head-scattered)"]
    return LayerCost("mla", "ulysses", "contiguous", x.comm.link, _phase(fwd_tr, rows_f),
                     _phase(bwd_tr, rows_b), notes)


def _state_bytes(x: LayerInputs) -> float:
    from k3sim.configs.dtypes import bytes_per_element

    return bytes_per_element(x.state_dtype)


def layer_cost(strategy: str, layer_kind: str, x: LayerInputs) -> LayerCost:
    if layer_kind == "kda":
        return {"kcp": kcp_layer, "lasp2": lasp2_layer, "ulysses": ulysses_kda_layer}[strategy](x)
    if strategy in ("ring", "zigzag-ring"):
        return ring_layer(x, strategy)
    return {"allgather-kv": allgather_kv_layer, "ulysses": ulysses_mla_layer}[strategy](x)
