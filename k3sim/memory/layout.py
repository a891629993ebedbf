"""Which layers each pipeline rank holds, and how a layer's parameters split over TP/EP."""

from __future__ import annotations

from k3sim.configs.model import ModelConfig
from k3sim.configs.parallel import Parallelism
from k3sim.errors import InputError


def chunk_layers(num_layers: int, chunks: int) -> list[list[int]]:
    """Contiguous near-equal split of layers (0-based) into `chunks`; the first `L % chunks` get one more."""
    base, extra = divmod(num_layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (1 if c < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def check_chunks(chunks: list[list[int]], num_layers: int, num_chunks: int) -> None:
    """Refuse a chunk list that is not `num_chunks` non-empty runs of consecutive 0-based layers covering
    0 .. num_layers - 1 in order: the pipeline schedules and the AttnRes hand-off assume that order."""
    flat = [i for c in chunks for i in c]
    if len(chunks) != num_chunks or any(not c for c in chunks) or flat != list(range(num_layers)):
        sizes = [len(c) for c in chunks]
        raise InputError(f"a stage split must give pp x virtual_stages = {num_chunks} non-empty chunks of "
                         f"consecutive layers covering all {num_layers} layers in order; got {len(chunks)} "
                         f"chunks of {sizes} layers", source="stage split", field="stage_split")


def rank_layers(model: ModelConfig, par: Parallelism, chunks: list[list[int]] | None = None) -> list[list[int]]:
    """Layers of each pipeline rank. With v virtual stages, rank r holds chunks r, r+pp, ... (loop
    placement, as Megatron's interleaved 1F1B and torchtitan's K3 AttnRes cache require). `chunks`: the
    0-based layers of each of the pp*v chunks (a cost-balanced split, `k3sim.training.partition`); None =
    the uniform split by layer count (`chunk_layers`)."""
    n = par.pp * par.virtual_stages
    if chunks is None:
        chunks = chunk_layers(model.num_layers, n)
    else:
        check_chunks(chunks, model.num_layers, n)
    return [sum((list(chunks[c]) for c in range(r, len(chunks), par.pp)), []) for r in range(par.pp)]


def expert_tp(par: Parallelism) -> int:
    """Expert tensor parallelism: if EP is narrower than TP, each expert is split over tp/ep ranks
    (Megatron expert-tensor-parallel); otherwise experts are whole on a rank."""
    return par.tp // par.ep if par.ep < par.tp and par.tp % par.ep == 0 else 1
