"""Expert-parallel dispatch and combine as DeepEP-class kernels: the all-to-all of one MoE layer.

    t = latency(phase, EP) + max over links (busiest rank's bytes on the link / (f_link x link bandwidth))

One rank holds T tokens; each picks `topk` of the E routed experts, which sit (with R redundant slots) on `ep`
ranks of G GPUs per node. What crosses which link depends on the kernel (deepseek-ai/DeepEP, V1 kernels,
`csrc/kernels/legacy/`, read 2026-12):
- normal (`internode.cu`, `intranode.cu`; training and prefill): hierarchical. A token crosses the network once
  per distinct destination node other than its own (RDMA to the GPU of the same local index there, one NIC per
  GPU), then that GPU forwards it over NVLink to each distinct destination rank of its node. Inside one node
  (ep <= G) a token goes once to each distinct destination rank over NVLink. Combine is the reverse (partial
  sums reduced per rank and per node before they travel back), so its copies are dispatch's, in bf16.
- low_latency (`internode_ll.cu`; decode): one message per (token, expert) pair, no deduplication per rank
  (each of the token's top-k warps writes its own message to its expert's slot, `num_bytes_per_msg` = 16-byte
  header + the token), no forwarding. Intra-node destinations go over NVLink since DeepEP PR #173 (default
  `allow_nvlink_for_low_latency_mode=True`, 2025-05-23), which is what the current V1 table measures; the
  table before it (pure RDMA, 2025-02 README) is a held-out check. CUDA-graph compatible; a token count per
  rank above the buffer (`LL_MAX_TOKENS_PER_RANK`) is refused. Combine returns one bf16 message per pair.
- nccl: the plain `all_to_all` of `k3sim.comm.collective_time` over the (token, expert) copies (Megatron's
  all-to-all dispatcher sends one copy per routed pair), for comparison.

Bytes per token copy: `kernels.ops.ep_copy_bytes` (fp8 D + 4 ceil(D/128), bf16 2 D). The busiest link sets the
time: for each link kind (RDMA: the GPU's NIC; NVLink: its scale-up port) the larger of the busiest rank's send
and receive under the routing distribution (`Routing`); RDMA and NVLink run at once, so the slower link wins.

Routing (`routing`): uniform top-k without replacement (closed form, hypergeometric) or the one routing
distribution of `k3sim.comm.routing`, which the step's expert load reads too: Zipf(s) popularity over a seeded
ranking of the experts, each expert's picks per token capped at one (`top_k_inclusion`), a token's top-k set
drawn from the conditional Poisson design with exactly these inclusion probabilities (`cps_weights`; capped
experts are in every set), its hit and mass probabilities by an exact elementary-symmetric-polynomial
recursion (no sampling, so no sampling noise on the busiest rank; the mass of a rank is its experts' capped
expected picks). Experts sit contiguously E/ep per rank (DeepEP: dst_rank = expert // num_local_experts); with
redundant slots, the routing module's EPLB placement by the capped expected load (`eplb_placement`, the one
the expert load uses), a pick of a replicated expert split evenly over its replicas. Node-limited routing
(DeepSeek-V3 group-limited gating, arXiv 2412.19437 sec. 2.1.2: at most M nodes per token, chosen first, then
the experts inside them): min(M, topk) nodes per token, each receiving its best expert, the remaining picks
uniform over the chosen nodes' experts (exact for uniform routing on equal nodes; within 1 % of a seeded
simulation of DeepEP's test gating in destination nodes and ranks per token, tests/comm/test_ep.py); with Zipf
or redundancy a mean-field form of the same (`_node_limited`).

Calibration: an external calibration with provenance, `hardware_profiles/external/deepep-v1-h800/` (the two
DeepEP V1 tables on H800 transcribed from DeepEP's README.md and docs/legacy.md; docs/sources.md). Fitted at first use (memoised, ~0.1 s, numpy only): one achieved fraction of
NVLink and one of RDMA bandwidth (the profile's link figures: H800 200 GB/s NVLink, 50 GB/s NIC per direction)
shared by both kernel families, and a latency a + b log2(EP) per phase, shared by the families (the normal
table is at one token count, so it cannot separate its own latency from its bandwidth; its rows still enter the
fit). Six parameters on 20 rows (2026-12-02): f_nvl 0.662, f_rdma 0.881, dispatch 27.6 us + 0 x log2(EP),
combine 2.0 us + 5.2 us x log2(EP); relative error of the fit at most 6.1 %, leave-one-out mean 3.5 % (max
7.8 %), leave-EP-out mean 4.6 % (max 11.7 %); the pre-NVLink low-latency table, held out, within 9.3 %
(`k3sim check deepep` prints them all; `k3sim/validation/ep_comm.py`). The DeepEP V2 figures are held out
and fit at EP 8 x 4 (3-4 %), not at EP 8 x 2 on SM90 (+94 % dispatch): V1's NVLink forwarding there would
take 1.73 ms at 100 % of H800's NVLink against V2's 1.36 ms, so V2 reaches the ranks of a node another way
and is not this model. Other profiles: the fractions times their own link bandwidths, the latency unchanged (a
modelling choice, said in each answer's detail). What the fit shows: the low-latency dispatch's growth from
77 us at EP 8 to 194 us at EP 256 is bandwidth, not latency (the share of a token's messages that leave the
node grows from 0 to 31/32, onto a NIC 3x slower than NVLink at these fractions); and the normal kernels'
low figure at EP 16 (43 GB/s) is the NVLink forwarding: a token reaching a node goes on to ~2.9 of its other
ranks, so a forwarding GPU moves 5.7 copies per source token over NVLink against 1 over its NIC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from k3sim.comm.routing import cps_weights, eplb_placement, rank_groups
from k3sim.errors import InputError
from k3sim.kernels.ops import EP_OPS, EP_PARAMS, ep_copy_bytes

class EPParamError(InputError):
    """A refusal of this model's parameters (T, kernel, dtype_bytes, ...): a command renames its field to the
    option that set it (`k3sim.commands.scale`)."""


KERNEL_CODES = {"normal": 0, "low_latency": 1, "nccl": 2}
KERNEL_NAMES = {v: k for k, v in KERNEL_CODES.items()}
PHASES = ("dispatch", "combine")
# The low-latency buffer in tokens per rank: SGLang's default (python/sglang/srt/environ.py
# SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK = EnvInt(128)), DeepEP's test default
# (tests/legacy/test_low_latency.py --num-tokens 128) and below its docs' advice "less than 256" (docs/legacy.md).
LL_MAX_TOKENS_PER_RANK = 128
LL_HEADER_BYTES = 16  # internode_ll.cu: num_bytes_per_msg = sizeof(int4) + the token (source index + 3 reserved ints)
# SMs a kernel holds while it runs (`comm_sms`):
NORMAL_SMS = 20  # DeepSeek-V3 report sec. 3.2.2 ("only 20 SMs" for its all-to-all); DeepEP V1 Buffer.num_sms = 20
# NCCL runs one CTA (one SM) per channel; an all-to-all uses the p2p channels, 16 on an H800 8-GPU node
# (NCCL_DEBUG log "16 coll channels, 0 nvls channels, 16 p2p channels" in NVIDIA/nccl issue #892). Not measured
# on the H200s (the lent machines had one GPU when this was written); taken for every profile.
NCCL_P2P_CHANNELS = 16
CALIBRATION = "external/deepep-v1-h800"
# Work bound of the weighted routing recursion (experts x (ranks + nodes + 1) x (topk + 1) multiply-adds, in
# numpy over the ranks): 2^26 is ~1 s on one core (80 M took 1.3 s); K3 at EP 320 (896 experts, 64 redundant,
# top-16) needs 5.5 M (0.19 s, once per layout: memoised).
ROUTING_WORK_MAX = 2 ** 26
TOPK_WEIGHTED_MAX = 512  # e_k of the weighted design stays inside float64 up to k ~ 700 (weights scaled to sum k)
# An expert whose picks per token are this close to 1 is taken as in every token's set (the design's weight
# would be infinite); 1e-9 picks per token is below a thousandth of a copy at a million tokens.
CERTAIN_PICK = 1e-9


# ---- routing statistics -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Routing:
    """Per-token destination statistics of one routing distribution on one placement (independent of T, D):
    `hit_rank[r]` = P(a token has at least one of its experts on rank r), `hit_node[n]` the same per node,
    `mass_rank[r]` = expected (token, expert) pairs on rank r (sums to topk). Ranks are node-major, `per_node`
    to a node (G, or ep inside one node)."""

    nodes: int
    per_node: int
    hit_rank: Any
    hit_node: Any
    mass_rank: Any
    how: str

    def normal_copies(self) -> tuple[float, float]:
        """Token copies per source token on the busiest rank's NIC and NVLink port (max of send and receive)
        for the normal kernels: RDMA one copy per distinct other destination node (sent by the source; received
        by the GPU of the same local index there, from its peer on every other node), NVLink one per distinct
        destination rank of the node other than the forwarding GPU (sent by the forwarder, received by the rank
        from the node's G - 1 other forwarders, each relaying its peers on every node)."""
        import numpy as np

        n, g = self.nodes, self.per_node
        H = np.asarray(self.hit_node, float)
        h = np.asarray(self.hit_rank, float).reshape(n, g)
        rdma = 0.0 if n == 1 else max(H.sum() - H.min(), (n - 1) * H.max())
        nvl = 0.0 if g == 1 else max(n * float((h.sum(1) - h.min(1)).max()), (g - 1) * n * float(h.max()))
        return float(rdma), float(nvl)

    def ll_copies(self, nvlink: bool = True) -> tuple[float, float]:
        """(token, expert) messages per source token on the busiest NIC and NVLink port for the low-latency
        kernels: every pair off the source GPU is one message; with `nvlink` (DeepEP's default since PR #173)
        pairs inside the node go over NVLink, without it (the 2025-02 kernels) over the NIC too. The self copy
        is local."""
        import numpy as np

        n, g = self.nodes, self.per_node
        m = np.asarray(self.mass_rank, float).reshape(n, g)
        k, node_mass, ep = float(m.sum()), m.sum(1), n * g
        if not nvlink:
            return float(max(k - m.min(), (ep - 1) * m.max())), 0.0
        rdma = max(k - node_mass.min(), (ep - g) * m.max()) if n > 1 else 0.0
        nvl = max(float((node_mass - m.min(1)).max()), (g - 1) * float(m.max())) if g > 1 else 0.0
        return float(rdma), float(nvl)


def _avoid_ratio(x: int, a: float, k: int) -> float:
    """C(x - a, k) / C(x, k): the chance that k distinct picks, uniform over x experts, all miss a set of a."""
    out = 1.0
    for i in range(k):
        if x - a - i <= 0:
            return 0.0
        out *= (x - a - i) / (x - i)
    return out


def _uniform(E: int, ep: int, G: int, M: int, k: int) -> Routing:
    """Uniform routing, E/ep experts on every rank: closed form. Unlimited: P(rank hit) = 1 - C(E - a, k) / C(E, k)
    (a = E/ep), per node with a G. Node-limited to M < nodes: H = min(M, k) nodes per token (uniform), each
    with one pick uniform in the node, the other k - H uniform over the U = H a_node experts of the chosen
    nodes less their first picks: P(rank hit | its node chosen) = 1 - (1 - a/a_node) C(U-H-a, k-H)/C(U-H, k-H)."""
    import numpy as np

    nodes, g = (ep // G, G) if ep > G else (1, ep)
    a, a_n = E // ep, (E // ep) * g
    if M == 0 or M >= nodes:
        H, h, how = 1 - _avoid_ratio(E, a_n, k), 1 - _avoid_ratio(E, a, k), ""
    else:
        hn = min(M, k)
        U = hn * a_n
        H = hn / nodes
        h = H * (1 - (1 - a / a_n) * _avoid_ratio(U - hn, a, k - hn))
        how = f", node-limited to {M} of {nodes} nodes"
    return Routing(nodes, g, np.full(ep, h), np.full(nodes, H), np.full(ep, k * a / E),
                   f"uniform top-{k} of {E} experts ({a} per rank){how} (closed form)")


def _design(w, k: int, groups: list[list[tuple[int, float]]]):
    """For each group (a list of (expert, share)): P(no pick of a token lands in it) and the expected picks
    landing in it, under the conditional-Bernoulli design P(S) ~ prod_{e in S} w_e, |S| = k.

    P(miss g) = e_k(w_e (1 - c_ge)) / e_k(w) (c_ge: the group's share of expert e) and E[picks in g] =
    d/dt e_k(w_e (1 + t c_ge)) / e_k(w) at t = 0, both by the recursion e_j += w_e e_{j-1} over the experts,
    run for every group at once (the derivative alongside). Weights are scaled to sum k so e_k stays in range."""
    import numpy as np

    E, n = len(w), len(groups)
    ws = np.asarray(w, float) * (k / float(np.sum(w)))
    mods: list[list[tuple[int, float]]] = [[] for _ in range(E)]
    for gi, grp in enumerate(groups):
        for e, c in grp:
            mods[e].append((gi, c))
    miss = np.zeros((n, k + 1))
    miss[:, 0] = 1.0
    base = np.zeros(k + 1)
    base[0] = 1.0
    deriv = np.zeros((n, k + 1))
    for e in range(E):
        we = np.full(n, ws[e])
        ce = np.zeros(n)
        for gi, c in mods[e]:
            ce[gi] += c
        deriv[:, 1:] += ws[e] * deriv[:, :-1] + (ws[e] * ce)[:, None] * base[None, :-1]
        miss[:, 1:] += (we * (1.0 - ce))[:, None] * miss[:, :-1]
        base[1:] += ws[e] * base[:-1]
    return np.clip(miss[:, k] / base[k], 0.0, 1.0), deriv[:, k] / base[k]


def _node_limited(w, k: int, M: int, rank_groups, nodes: int, g: int):
    """Node-limited routing with weighted experts, mean-field: H = min(M, k) nodes per token drawn by the
    conditional-Bernoulli design over the nodes' popularity W_n (P(chosen) = rho_n); in a chosen node a rank
    of share s_r = W_r / W_n of its popularity is hit by the node's first pick or by its share of the
    x_n = (k - H) W_n / (W_n + (H - 1) mean W of the other chosen nodes) further picks, each independently:
    P(hit) = rho_n (1 - (1 - s_r)^(1 + x_n)); mass rho_n s_r (1 + x_n), scaled to sum k. At uniform weights
    this is the closed form's model to within 0.5 % (the closed form draws the further picks without
    replacement). `w`: the experts' capped per-draw probabilities (`routing.inclusion_probabilities`)."""
    import numpy as np

    W_r = np.array([sum(float(w[e]) * c for e, c in grp) for grp in rank_groups]).reshape(nodes, g)
    W_n = W_r.sum(1)
    hn = min(M, k)
    miss, _ = _design(W_n, hn, [[(n, 1.0)] for n in range(nodes)])
    rho = 1.0 - miss
    others = (rho * W_n).sum() - rho * W_n
    mean_other = others / np.maximum(rho.sum() - rho, 1e-300)
    x = (k - hn) * W_n / np.maximum(W_n + (hn - 1) * mean_other, 1e-300)
    s = W_r / np.maximum(W_n[:, None], 1e-300)
    hit = rho[:, None] * (1.0 - (1.0 - s) ** (1.0 + x[:, None]))
    mass = rho[:, None] * s * (1.0 + x[:, None])
    mass *= k / mass.sum()
    return hit.ravel(), rho, mass.ravel()


@lru_cache(maxsize=256)
def routing(E: int, R: int, ep: int, G: int, nodes_max: int, topk: int, zipf_milli: int, seed: int) -> Routing:
    """The routing statistics of one layout (memoised: independent of T, D, dtype and phase). Arguments are
    checked by `ep_time`; a direct call expects them valid (ep <= E + R, ep <= G or a multiple of G)."""
    if R == 0 and zipf_milli == 0 and E % ep == 0:
        return _uniform(E, ep, G, nodes_max, topk)
    return _weighted(E, R, ep, G, nodes_max, topk, zipf_milli, seed)


def _capped_design(q, k: int, groups: list[list[tuple[int, float]]]):
    """`_design` for inclusion probabilities `q` (picks per token, summing to k, at most 1): experts at 1
    (within `CERTAIN_PICK`) are in every token's set, the others the conditional-Bernoulli (conditional
    Poisson) design of the remaining picks whose weights give exactly their inclusion probabilities
    (`routing.cps_weights`)."""
    import numpy as np

    q = np.asarray(q, float)
    certain = q >= 1.0 - CERTAIN_PICK
    free = np.flatnonzero(~certain)
    index = {int(e): i for i, e in enumerate(free)}
    kk = k - int(certain.sum())
    miss_c, mass_c = np.ones(len(groups)), np.zeros(len(groups))
    free_groups: list[list[tuple[int, float]]] = []
    for gi, grp in enumerate(groups):
        free_groups.append([(index[e], c) for e, c in grp if not certain[e]])
        for e, c in grp:
            if certain[e]:
                miss_c[gi] *= 1.0 - c
                mass_c[gi] += c
    if kk <= 0 or not len(free):
        return np.clip(miss_c, 0.0, 1.0), mass_c
    t = q[free] * (kk / q[free].sum())
    miss, mass = _design(cps_weights(t, kk), kk, free_groups)
    return np.clip(miss * miss_c, 0.0, 1.0), mass + mass_c


def _weighted(E: int, R: int, ep: int, G: int, M: int, k: int, zipf_milli: int, seed: int) -> Routing:
    """Zipf popularity, redundant slots or an uneven split: the routing module's distribution and placement
    (`k3sim.comm.routing.eplb_placement`) under the conditional Poisson design (`_capped_design`)."""
    import numpy as np

    nodes, g = (ep // G, G) if ep > G else (1, ep)
    p, expert_of, rank_of, reps = eplb_placement(E, ep, k, R, zipf_milli / 1000.0, seed)
    ranks = rank_groups(expert_of, rank_of, reps, ep)
    node_groups = []
    for nd in range(nodes):
        acc: dict[int, float] = {}
        for grp in ranks[nd * g:(nd + 1) * g]:
            for e, c in grp:
                acc[e] = acc.get(e, 0.0) + c
        node_groups.append(sorted(acc.items()))
    limited = 0 < M < nodes
    if limited:
        hit, hit_node, mass = _node_limited(p, k, M, ranks, nodes, g)
    else:
        miss, mass_all = _capped_design(k * np.asarray(p), k, ranks + node_groups)
        hit, hit_node, mass = 1.0 - miss[:ep], 1.0 - miss[ep:], mass_all[:ep]
    dist = "uniform" if zipf_milli == 0 else f"zipf({zipf_milli / 1000:g}, seed {seed})"
    extra = f", {R} redundant slot(s) placed as EPLB by capped expected load" if R else ""
    lim = f", node-limited to {M} of {nodes} nodes (mean-field)" if limited else ""
    return Routing(nodes, g, np.asarray(hit), np.asarray(hit_node), np.asarray(mass),
                   f"{dist} top-{k} of {E} experts on {ep} ranks{extra}{lim} (conditional Poisson design of the "
                   "capped inclusion probabilities, exact recursion)")


# ---- calibration ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TableRow:
    """One published figure as a time: `seconds` (from the latency column, or logical bytes / the bandwidth
    column, bytes counted as DeepEP's benchmark counts them), and the model's link terms at fraction 1:
    `rdma_s` / `nvl_s` = the busiest rank's bytes on the NIC / NVLink over the link's bandwidth."""

    table: str
    kernel: str
    phase: str
    ep: int
    tokens: int
    seconds: float
    rdma_s: float
    nvl_s: float
    role: str           # "fit" (calibration input) or "check" (held out)
    reported: str       # the figure as published
    hardware: str       # the machine the row was measured on (its link figures: provenance.yaml)

    @property
    def log2_ep(self) -> float:
        return math.log2(self.ep)


@dataclass(frozen=True)
class Calibration:
    """f_nvl, f_rdma: achieved fractions of the profile's NVLink / NIC bandwidth; latency[phase] = (a_s, b_s):
    a + b log2(EP) seconds. `rows`: the rows it was fitted on; `rms_rel`: their rms relative error."""

    f_nvl: float
    f_rdma: float
    latency: dict[str, tuple[float, float]]
    rows: int
    rms_rel: float
    name: str = CALIBRATION
    notes: tuple[str, ...] = field(default=())

    def latency_s(self, phase: str, ep: int) -> float:
        a, b = self.latency[phase]
        return a + b * math.log2(max(ep, 1))

    def predict(self, row: TableRow) -> float:
        return self.latency_s(row.phase, row.ep) + max(row.rdma_s / self.f_rdma, row.nvl_s / self.f_nvl)


def data_dir() -> Path:
    """The calibration's directory: under the profiles directory in use, else the project's copy."""
    from k3sim.configs.profiles import PROFILES_DIR, profiles_dir

    here = profiles_dir() / CALIBRATION
    return here if here.is_dir() else PROFILES_DIR / CALIBRATION


def _read_csv(path: Path) -> list[dict[str, str]]:
    import csv
    import io

    from k3sim.reader import MAX_CONFIG_BYTES, read_text

    return list(csv.DictReader(io.StringIO(read_text(path, what="calibration table", max_bytes=MAX_CONFIG_BYTES))))


def _provenance(root: Path) -> dict:
    from k3sim.configs.loaders import read_mapping

    return read_mapping(root / "provenance.yaml", what="calibration provenance")


def _link_terms(kernel: str, phase: str, rt: Routing, T: int, copy: int, up: float, out: float,
                nvlink: bool = True) -> tuple[float, float, float, float]:
    """(rdma_s, nvl_s, rdma_bytes, nvl_bytes) of the busiest rank at fraction 1."""
    if kernel == "normal":
        rc, nc = rt.normal_copies()
    else:
        rc, nc = rt.ll_copies(nvlink)
        copy += LL_HEADER_BYTES if phase == "dispatch" else 0
    rb, nb = rc * T * copy, nc * T * copy
    return rb / out, nb / up, rb, nb


def table_rows(root: Path | None = None) -> list[TableRow]:
    """Every transcribed figure of the calibration directory as a `TableRow` (CSV formats: its README)."""
    root = data_dir() if root is None else Path(root)
    links = _provenance(root)["links"]
    rows: list[TableRow] = []
    for name, kernel, role in (("v1_normal", "normal", "fit"), ("v1_low_latency", "low_latency", "fit"),
                               ("v1_low_latency_rdma_only", "low_latency", "check"), ("v2_normal", "normal", "check")):
        for rec in _read_csv(root / f"{name}.csv"):
            hw = rec.get("hardware", "h800")
            up, out = float(links[hw]["scaleup_bytes_per_s"]), float(links[hw]["scaleout_bytes_per_s"])
            for phase in PHASES:
                rows.append(_row(name, kernel, role, phase, rec, up, out, hw))
    return rows


def _row(table: str, kernel: str, role: str, phase: str, rec: dict[str, str], up: float, out: float,
         hw: str) -> TableRow:
    """One CSV record's figure of one phase as a time and the model's link terms (see `TableRow`)."""
    ep, G, T, D = (int(rec[c]) for c in ("ep", "gpus_per_node", "tokens_per_rank", "hidden"))
    k, E, M = int(rec["topk"]), int(rec["experts"]), int(rec["nodes_max"])
    rt = routing(E, 0, ep, G, M, k, 0, 0)
    copy = ep_copy_bytes(phase, D, 1)
    nvlink = rec.get("ll_nvlink", "1") == "1"
    rdma_s, nvl_s, _, _ = _link_terms(kernel, phase, rt, T, copy, up, out, nvlink)
    if f"{phase}_us" in rec:  # the low-latency tables give the time itself
        seconds, reported = float(rec[f"{phase}_us"]) * 1e-6, f"{rec[phase + '_us']} us"
    else:  # a bandwidth: DeepEP's logical bytes over it (tests/legacy/test_internode.py, tests/elastic/test_ep.py)
        meta = int(rec.get("meta_bytes_per_topk_" + phase, 0) or 0) * k
        per_token = rt.hit_node.sum() if rec["counted"] == "nodes" else float(rt.hit_rank.mean()) * ep
        seconds = T * float(per_token) * (copy + meta) / (float(rec[f"{phase}_GBps"]) * 1e9)
        sms = f", {rec['sms']} SMs" if rec.get("sms") else ""
        reported = f"{rec[phase + '_GBps']} GB/s ({rec['counted']}{sms})"
    return TableRow(table, kernel, phase, ep, T, seconds, rdma_s, nvl_s, role, reported, hw)


def _nnls2(X0, X1, Y):
    """Least squares of Y ~ a X0 + b X1 with a, b >= 0, for every row of a batch at once (columns: samples).
    Returns (a, b, cost) arrays over the batch: the unconstrained solution where feasible, else the better of
    a-only, b-only and zero."""
    import numpy as np

    s00, s01, s11 = (X0 * X0).sum(1), (X0 * X1).sum(1), (X1 * X1).sum(1)
    y0, y1 = (X0 * Y).sum(1), (X1 * Y).sum(1)
    det = s00 * s11 - s01 * s01
    ok = np.abs(det) > 1e-12 * np.maximum(s00 * s11, 1e-300)
    safe = np.where(ok, det, 1.0)
    a, b = (s11 * y0 - s01 * y1) / safe, (s00 * y1 - s01 * y0) / safe
    cands = [(np.where(ok, a, -1.0), np.where(ok, b, -1.0)),
             (np.maximum(y0 / np.maximum(s00, 1e-300), 0.0), np.zeros_like(a)),
             (np.zeros_like(a), np.maximum(y1 / np.maximum(s11, 1e-300), 0.0)), (np.zeros_like(a), np.zeros_like(a))]
    best_a, best_b, best_c = None, None, None
    for ca, cb in cands:
        feasible = (ca >= 0) & (cb >= 0)
        cost = np.where(feasible, ((Y - ca[:, None] * X0 - cb[:, None] * X1) ** 2).sum(1), np.inf)
        if best_c is None:
            best_a, best_b, best_c = ca, cb, cost
        else:
            take = cost < best_c
            best_a, best_b, best_c = np.where(take, ca, best_a), np.where(take, cb, best_b), np.minimum(cost, best_c)
    return best_a, best_b, best_c


def fit(rows: list[TableRow]) -> Calibration:
    """The six parameters on `rows` (relative least squares): f_nvl and f_rdma by a grid search (0.01 steps,
    then 0.0005 around the best), the latency (a, b >= 0) of each phase by linear least squares given them
    (variable projection: the time is linear in a and b once the fractions are fixed)."""
    import numpy as np

    if not rows:
        raise ValueError("no calibration rows")
    t = np.array([r.seconds for r in rows])
    A, B = np.array([r.rdma_s for r in rows]), np.array([r.nvl_s for r in rows])
    L = np.array([r.log2_ep for r in rows])
    phase = np.array([r.phase for r in rows])

    def cost(fn, fr):
        tau = np.maximum(A[None] / fr[:, None], B[None] / fn[:, None])
        total, lat = np.zeros(len(fn)), {}
        for ph in PHASES:
            sel = phase == ph
            if not sel.any():
                lat[ph] = (np.zeros(len(fn)), np.zeros(len(fn)))
                continue
            ts = t[sel]
            a, b, c = _nnls2(np.broadcast_to(1.0 / ts, (len(fn), sel.sum())),
                             np.broadcast_to(L[sel] / ts, (len(fn), sel.sum())), (ts - tau[:, sel]) / ts)
            total, lat[ph] = total + c, (a, b)
        return total, lat

    grid = np.arange(0.02, 1.0 + 1e-9, 0.01)
    fn, fr = (x.ravel() for x in np.meshgrid(grid, grid, indexing="ij"))
    c, _ = cost(fn, fr)
    i = int(np.argmin(c))
    fine_n = np.clip(np.arange(fn[i] - 0.01, fn[i] + 0.01 + 1e-9, 0.0005), 0.005, 1.0)
    fine_r = np.clip(np.arange(fr[i] - 0.01, fr[i] + 0.01 + 1e-9, 0.0005), 0.005, 1.0)
    fn, fr = (x.ravel() for x in np.meshgrid(fine_n, fine_r, indexing="ij"))
    c, lat = cost(fn, fr)
    i = int(np.argmin(c))
    latency = {ph: (float(lat[ph][0][i]), float(lat[ph][1][i])) for ph in PHASES}
    return Calibration(float(fn[i]), float(fr[i]), latency, len(rows), float(math.sqrt(c[i] / len(rows))))


@lru_cache(maxsize=4)
def _calibration_at(root: str) -> Calibration:
    return fit([r for r in table_rows(Path(root)) if r.role == "fit"])


def calibration() -> Calibration:
    """The fit on the calibration directory's "fit" rows (memoised per directory)."""
    return _calibration_at(str(data_dir()))


# ---- the model ------------------------------------------------------------------------------------------------

def _check(phase: str, p: Mapping[str, int], hw: Any) -> None:
    """Bad input the registry's ranges cannot see, each naming the parameter with its fix."""
    if phase not in PHASES:
        raise EPParamError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}", field="phase")
    kernel, ep, G, E, R = p["kernel"], p["ep"], p["G"], p["E"], p["R"]  # kernel: 0..2 by its registry range
    if ep > E + R:
        raise EPParamError(f"ep={ep} exceeds the {E + R} expert slots (E={E} + R={R}): every EP rank holds at least "
                         f"one expert; use ep <= {E + R} or add redundant slots (R)", field="ep")
    if ep > G and ep % G:
        raise EPParamError(f"ep={ep} does not fill whole nodes of G={G} GPUs: use a multiple of {G} (or ep <= {G})",
                         field="ep")
    nodes = ep // G if ep > G else 1
    if p["nodes_max"] > nodes:
        raise EPParamError(f"nodes_max={p['nodes_max']} exceeds the {nodes} node(s) that ep={ep} spans at G={G}: use "
                         f"0 (unlimited) or at most {nodes}", field="nodes_max")
    if kernel == 1 and p["T"] > LL_MAX_TOKENS_PER_RANK:
        raise EPParamError(f"T={p['T']} tokens per rank exceeds the low-latency buffer of {LL_MAX_TOKENS_PER_RANK} "
                         "(DeepEP num_max_dispatch_tokens_per_rank, SGLang's default): use the normal kernel "
                         "(--ep-kernel normal, kernel=0), more attention-DP ranks or fewer tokens per step", field="T")
    if phase == "dispatch" and p["dtype_bytes"] == 1 and not (dict(hw.peak_flops_per_s or {}).get("fp8")):
        raise EPParamError(f"fp8 dispatch (dtype_bytes=1) on profile '{hw.name}', which has no fp8 peak: use "
                         "dtype_bytes=2 (bf16, --dispatch-dtype bf16) or a profile with fp8", field="dtype_bytes")
    weighted = not (R == 0 and p["zipf_milli"] == 0 and E % ep == 0)
    if weighted and p["topk"] > TOPK_WEIGHTED_MAX:
        raise EPParamError(f"topk={p['topk']} above {TOPK_WEIGHTED_MAX} with Zipf routing or redundant slots (the "
                         "weighted recursion's range): use uniform routing (zipf_milli=0, R=0)", field="topk")
    nodes_groups = nodes if not 0 < p["nodes_max"] < nodes else 0
    work = E * (ep + nodes_groups + 1) * (p["topk"] + 1)
    if weighted and work > ROUTING_WORK_MAX:
        raise EPParamError(f"E x ep x topk = {work:,} is above the weighted routing's work bound {ROUTING_WORK_MAX:,} "
                         "(~1 s): use uniform routing (zipf_milli=0, R=0, E a multiple of ep) or fewer experts or "
                         "ranks", field="E")


def _profile(hardware: Any) -> Any:
    """The profile: a name or path through the kernel predictor's per-process cache (a YAML parse costs ~40 ms)."""
    import os

    from k3sim.configs.profiles import load_profile
    from k3sim.kernels.predict import profile_predictor

    return profile_predictor(hardware).hw if isinstance(hardware, (str, os.PathLike)) else load_profile(hardware)


def _validated(phase: str, params: Mapping[str, object], hw: Any) -> dict[str, int]:
    from k3sim.kernels.ops import get_op, validate_params

    op = next((o for o, ph in EP_OPS.items() if ph == phase), None)
    if op is None:
        raise EPParamError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}", field="phase")
    p = validate_params(get_op(op), params)
    _check(phase, p, hw)
    return p


def ep_time(phase: str, params: Mapping[str, object], hardware: Any = "h200"):
    """Seconds of one EP dispatch or combine (`phase`) of the integer `params` (`kernels.ops.EP_PARAMS`) on
    `hardware`; returns `kernels.predict.KernelTime` (seconds, source naming the calibration, detail, method =
    "<kernel>:<limiting link>"). Raises InputError naming the parameter for bad input."""
    from k3sim.kernels.predict import KernelTime

    hw = _profile(hardware)
    p = _validated(phase, params, hw)
    kernel, ep = KERNEL_NAMES[p["kernel"]], p["ep"]
    copy = ep_copy_bytes(phase, p["D"], p["dtype_bytes"])
    dtype = "fp8 + fp32 scales" if copy != 2 * p["D"] else "bf16"
    if ep == 1:
        return KernelTime(0.0, "model", f"ep=1: the tokens stay on the GPU, no all-to-all ({kernel} {phase})", "local")
    rt = routing(p["E"], p["R"], ep, p["G"], p["nodes_max"], p["topk"], p["zipf_milli"], p["seed"])
    if kernel == "nccl":
        return _nccl(phase, p, hw, rt, copy, dtype)
    cal = calibration()
    up, out = float(hw.scaleup_bandwidth_bytes_per_s), float(hw.scaleout_bandwidth_bytes_per_s or 0.0)
    if rt.nodes > 1 and out <= 0:
        raise EPParamError(f"ep={ep} spans {rt.nodes} nodes but profile '{hw.name}' has no scale-out bandwidth: "
                         f"use ep <= G or a profile with scaleout_bandwidth_bytes_per_s", field="ep")
    rdma_s, nvl_s, rb, nb = _link_terms(kernel, phase, rt, p["T"], copy, up, out or 1.0)
    tr, tn = rdma_s / cal.f_rdma, nvl_s / cal.f_nvl
    lat = cal.latency_s(phase, ep)
    limiter = "rdma" if tr >= tn else "nvlink"
    a, b = cal.latency[phase]
    detail = (f"{kernel} {phase} over {ep} ranks ({rt.nodes} node(s) of {rt.per_node}), T={p['T']} tokens/rank, "
              f"{copy} B/copy ({dtype}); busiest rank: RDMA {rb:.4g} B / ({cal.f_rdma:.3f} x {out:.3g} B/s) = "
              f"{tr * 1e6:.1f} us, NVLink {nb:.4g} B / ({cal.f_nvl:.3f} x {up:.3g} B/s) = {tn * 1e6:.1f} us; latency "
              f"{a * 1e6:.1f} + {b * 1e6:.2f} x log2({ep}) us = {lat * 1e6:.1f} us; routing: {rt.how}; calibration "
              f"{cal.name} (DeepEP V1 tables, H800): fractions carried to {hw.name}'s links, latency unchanged")
    if kernel == "normal":
        detail += "; not CUDA-graph capturable (the CPU waits for the receive counts): the kernel's GPU time"
    return KernelTime(lat + max(tr, tn), f"model: {cal.name} calibration", detail, f"{kernel}:{limiter}", "graph")


def _nccl(phase: str, p: Mapping[str, int], hw: Any, rt: Routing, copy: int, dtype: str):
    """The plain NCCL all-to-all of the same (token, expert) copies, through the one collective model; the
    per-rank buffer is the busiest rank's copies (Zipf: the hottest rank receives more than T x topk)."""
    import dataclasses

    import numpy as np

    from k3sim.comm.model import collective_time

    mean = p["topk"] / p["ep"]
    skew = max(1.0, float(np.max(rt.mass_rank)) / mean)
    nbytes = int(math.ceil(p["T"] * p["topk"] * copy * skew))
    kt = collective_time("all_to_all", nbytes, p["ep"], hw, gpus_per_node=p["G"], convention="barrier")
    note = (f"; nccl {phase}: all_to_all of T x topk x {copy} B ({dtype}) x {skew:.3f} (busiest rank / mean) = "
            f"{nbytes} B per rank, one copy per (token, expert) pair; routing: {rt.how}")
    return dataclasses.replace(kt, detail=kt.detail + note, method=f"nccl:{kt.method}", convention="graph")


def comm_sms(kernel: str, hardware: Any = "h200") -> int:
    """SMs the kernel holds while it runs, the cost on compute it overlaps: normal 20 (DeepSeek-V3's training
    setting, DeepEP V1's default `Buffer.num_sms`); low_latency 0 while in flight (the receive hook leaves the
    network to run in the background without SMs, DeepEP docs/legacy.md); nccl one SM per p2p channel
    (`NCCL_P2P_CHANNELS`). At most the profile's SMs."""
    name = str(kernel).replace("-", "_")
    if name not in KERNEL_CODES:
        raise EPParamError(f"unknown EP kernel {kernel!r} (known: {', '.join(KERNEL_CODES)})", field="kernel")
    sms = int(getattr(_profile(hardware), "num_sms", 0) or 0)
    held = {"normal": NORMAL_SMS, "low_latency": 0, "nccl": NCCL_P2P_CHANNELS}[name]
    return min(held, sms) if sms else held


__all__ = ["CALIBRATION", "EP_PARAMS", "KERNEL_CODES", "LL_MAX_TOKENS_PER_RANK", "Calibration", "Routing",
           "TableRow", "calibration", "comm_sms", "ep_time", "fit", "routing", "table_rows"]
