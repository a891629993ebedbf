"""Per-stage pipeline costs from the model: layer mix, kernel-predicted forward/backward, P2P over the
link the placement gives, and Block AttnRes's cache-based hand-off (bytes saved vs resending all).

Stage assignment is the memory planner's (`k3sim.memory.layout.chunk_layers`: contiguous, near-equal,
first L % (p v) chunks one layer more), chunk c on device c % p; the embedding runs on the first
chunk, the LM head (and loss) on the last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from k3sim.errors import InputError
from k3sim.pipeline.stagecosts import StageCosts


@dataclass(frozen=True)
class AttnResTraffic:
    """Bytes per micro-batch over all forward hops (the backward carries the same amount of gradient).

    resend_all: every hop carries every block representative committed so far; cached: a hop carries
    only those the receiving rank has not seen (torchtitan kimi_k3 PP_ATTN_RES_CACHE.md: a rank holds
    every block produced at stage s - p or earlier, where it last ran the micro-batch)."""

    block_bytes: float
    hop_blocks_resend_all: tuple[int, ...]
    hop_blocks_cached: tuple[int, ...]

    @property
    def resend_all_bytes(self) -> float:
        return self.block_bytes * sum(self.hop_blocks_resend_all)

    @property
    def cached_bytes(self) -> float:
        return self.block_bytes * sum(self.hop_blocks_cached)

    @property
    def saved_bytes(self) -> float:
        return self.resend_all_bytes - self.cached_bytes


@dataclass
class ModelStageCosts:
    costs: StageCosts
    chunk_layers: list[list[int]]
    hop_bytes: list[float]               # forward hop s -> s+1, bytes per micro-batch (last entry 0)
    hop_cross_node: list[bool]
    attn_res: AttnResTraffic | None
    stage_forward_s: float               # mean forward of one device (all its chunks), s
    rows: list[dict] = field(default_factory=list)


def committed_blocks(layers_done: int, block_size: int | None) -> int:
    """Block representatives that exist after `layers_done` layers: the token embedding plus every
    completed block of `block_size` layers (the running partial block is the hidden state itself)."""
    if not block_size:
        return 0
    return 1 + layers_done // block_size


def attn_res_hops(chunks: list[list[int]], p: int, block_size: int | None) -> tuple[list[int], list[int]]:
    """Blocks carried on each forward hop s -> s+1 (s = 0..S-2), resending all vs cache-based."""
    S = len(chunks)
    done = [0] * S
    acc = 0
    for s, ch in enumerate(chunks):
        acc += len(ch)
        done[s] = acc
    resend, cached = [], []
    for s in range(S - 1):                      # hop into stage s + 1
        have = committed_blocks(done[s], block_size)
        seen = committed_blocks(done[s + 1 - p], block_size) if s + 1 - p >= 0 else 0
        resend.append(have)
        cached.append(have - seen)
    return resend, cached


def cross_node(a: int, b: int, gpus_per_stage: int, gpus_per_node: int) -> bool:
    """Stage GPUs are consecutive ranks: device d holds ranks [d g, (d+1) g). The one hop rule: the
    pipeline engine and the training step model (`training.placement.pp_hop_links`) both use it."""
    if gpus_per_stage >= gpus_per_node:
        return a != b
    return (a * gpus_per_stage) // gpus_per_node != (b * gpus_per_stage) // gpus_per_node


def p2p_seconds(nbytes: float, hw: Any, cross_node: bool, kernel_time: Callable) -> tuple[float, str]:
    """One hop of `nbytes` between adjacent stages, from the one collective model the training step uses
    for its pipeline sends (`k3sim.cp.groups.Collectives.p2p`, through `k3sim.cp.comm.CommModel`):
    inside the scale-up domain the calibrated send_recv; across it, its latency plus the bytes over the
    scale-out NIC."""
    if nbytes <= 0:
        return 0.0, "nothing sent"
    from k3sim.cp.groups import Collectives

    link = "scale-out" if cross_node else "scale-up"
    seconds, src = Collectives(hw, kernel_time).p2p(nbytes, link)
    return seconds, f"send_recv {src} ({link})"


def model_stage_costs(model: Any, hw: Any, p: int, v: int = 1, *, tp: int = 1, ep: int = 1, cp: int = 1,
                      tokens: int = 4096, seq_len: int = 4096, recompute: bool = True,
                      attn_res_cache: bool = True, gpus_per_node: int | None = None,
                      kernel_time: Callable | None = None, layer_costs: Callable | None = None) -> ModelStageCosts:
    """Stage costs of `model` split over p devices x v chunks, one micro-batch of `tokens` tokens.

    `layer_costs` defaults to `k3sim.step.training_layer_costs` (pass a fake in tests); `recompute`
    adds each chunk's forward to its backward (full activation checkpointing, the memory planner's
    default). `attn_res_cache`: hops carry only unseen AttnRes blocks (needs the loop placement that
    interleaving uses; with v = 1 it changes nothing, as torchtitan notes)."""
    from k3sim.memory.activations import checkpointed_layer_bytes_per_token, layer_activation_bytes_per_token
    from k3sim.memory.layout import chunk_layers
    from k3sim.memory.sizes import attn_res_block_bytes_per_token

    if kernel_time is None:
        from k3sim.predict import predict_kernel_time as kernel_time
    if layer_costs is None:
        from k3sim.step import training_layer_costs as layer_costs
    S = p * v
    if S > model.num_layers:
        raise InputError(f"stages x virtual = {S} exceeds the {model.num_layers} layers of {model.name}",
                         source="--stages")
    rows = layer_costs(model, hw, tp=tp, ep=ep, cp=cp, tokens=tokens, seq_len=seq_len, kernel_time=kernel_time)
    by_layer = {r.layer: r for r in rows}
    chunks = chunk_layers(model.num_layers, S)
    fwd, bi, bw, act_bytes, hop_bytes = [], [], [], [], []
    tokens_gpu = tokens / cp
    per_tok_kept = checkpointed_layer_bytes_per_token(model)
    attn_tok = attn_res_block_bytes_per_token(model)
    out_rows = []
    for s, ch in enumerate(chunks):
        members = [by_layer[i] for i in ch]
        if s == 0:
            members = [by_layer[-1]] + members
        if s == S - 1:
            members = members + [by_layer[model.num_layers]]
        f = sum(r.forward_s for r in members)
        fwd.append(f)
        bi.append(sum(r.backward_input_s for r in members) + (f if recompute else 0.0))
        bw.append(sum(r.backward_weight_s for r in members))
        if recompute:
            kept = len(ch) * per_tok_kept
        else:
            kept = sum(layer_activation_bytes_per_token(model, i) for i in ch)
        # AttnRes representatives stay per micro-batch in flight (memory planner); 1/v per chunk
        act_bytes.append((kept + attn_tok / v) * tokens_gpu / tp)
        hop_bytes.append(by_layer[ch[-1]].activation_bytes)
        out_rows.append({"component": f"stage {s} (device {s % p}, chunk {s // p})",
                         "value": {"layers": [i + 1 for i in ch], "forward_s": f, "backward_input_s": bi[-1],
                                   "backward_weight_s": bw[-1]},
                         "source": "k3sim.step.training_layer_costs"
                                   + (" + recompute (forward again)" if recompute else "")})
    attn = None
    block = max((r.attn_res_block_bytes for r in rows), default=0.0)
    if model.attn_res_block_size and block > 0:
        resend, cached = attn_res_hops(chunks, p, model.attn_res_block_size)
        attn = AttnResTraffic(block, tuple(resend), tuple(cached))
        carried = cached if attn_res_cache else resend
        for s in range(S - 1):
            hop_bytes[s] += carried[s] * block
    hop_bytes[-1] = 0.0
    n = gpus_per_node or int(getattr(hw, "scaleup_domain_gpus", 8) or 8)
    g = tp * cp
    cross = [cross_node(s % p, (s + 1) % p, g, n) for s in range(S)]
    sf, sb = [0.0] * S, [0.0] * S
    for s in range(S - 1):
        t, src = p2p_seconds(hop_bytes[s], hw, cross[s], kernel_time)
        sf[s] = t
        sb[s + 1] = t                            # the gradient of a hop has the hop's size
        out_rows.append({"component": f"hop {s}->{s + 1}", "value": {"bytes": hop_bytes[s], "seconds": t,
                         "cross_node": cross[s]}, "source": src})
    costs = StageCosts(tuple(fwd), tuple(bi), tuple(bw), tuple(sf), tuple(sb), tuple(act_bytes),
                       source=f"{model.name} on {hw.name}: tp={tp} ep={ep} cp={cp}, {tokens} tokens/micro-batch",
                       rows=out_rows)
    stage_fwd = sum(fwd) / p
    return ModelStageCosts(costs, chunks, hop_bytes, cross, attn, stage_fwd, out_rows)
