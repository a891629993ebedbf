"""Which layers each pipeline rank holds, and how a layer's parameters split over TP/EP."""

from __future__ import annotations

from k3sim.configs.model import ModelConfig
from k3sim.configs.parallel import Parallelism


def chunk_layers(num_layers: int, chunks: int) -> list[list[int]]:
    """Contiguous near-equal split of layers (0-based) into `chunks`; the first `L % chunks` get one more."""
    base, extra = divmod(num_layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (1 if c < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def rank_layers(model: ModelConfig, par: Parallelism) -> list[list[int]]:
    """Layers of each pipeline rank. With v virtual stages, rank r holds chunks r, r+pp, ... (loop
    placement, as Megatron's interleaved 1F1B and torchtitan's K3 AttnRes cache require)."""
    chunks = chunk_layers(model.num_layers, par.pp * par.virtual_stages)
    return [sum((chunks[c] for c in range(r, len(chunks), par.pp)), []) for r in range(par.pp)]


def expert_tp(par: Parallelism) -> int:
    """Expert tensor parallelism: if EP is narrower than TP, each expert is split over tp/ep ranks
    (Megatron expert-tensor-parallel); otherwise experts are whole on a rank."""
    return par.tp // par.ep if par.ep < par.tp and par.tp % par.ep == 0 else 1
