"""Multi-GPU measurements, one process per GPU under torchrun: NCCL collectives and fla's KDA
context parallelism (KCP) with a numerical check against the single-GPU kernel.

Rank 0 writes the rows; a collective's time is the slowest rank's median.
Run: torchrun --standalone --nproc_per_node=N -m k3sim.calibration.distributed --out DIR --parts ...

Collectives are timed three ways (`convention` column in every row):
  barrier - each call starts from a host barrier and is timed alone (the 2026-11-30 runs): holds the
            barrier's skew between ranks and the launch;
  stream  - calls back to back in one stream, total / calls, as nccl-tests times them;
  graph   - the calls captured in one CUDA graph and replayed (what a graph-captured step pays).
The barrier rows go to `<op>.csv` (what the kernel store reads today); stream and graph rows to
`<op>.<convention>.csv`, which the store ignores until it learns to choose a convention, so new runs cannot mix
conventions inside one op. On CPU (gloo, for tests) the clock is the host's and "graph" is recorded as failed.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from k3sim.calibration import grids
from k3sim.calibration.records import OpWriter
from k3sim.calibration.timing import Timing, _quantile, time_cuda


_DEVICE = "cuda"  # "cpu" under gloo (tests)
COLLECTIVE_OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")
CONVENTIONS = ("barrier", "stream", "graph")
CONVENTION_REPS = 20     # harness choice: calls per stream/graph timing, and timings per shape (below)
CONVENTION_SAMPLES = 5


def _max_over_ranks(t: Timing) -> Timing:
    import torch
    import torch.distributed as dist

    v = torch.tensor([t.seconds, t.seconds_p20, t.seconds_p80, t.host_s], device=_DEVICE, dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)  # NaN host_s (never timed) stays NaN
    return Timing(float(v[0]), float(v[1]), float(v[2]), t.reps, float(v[3]))


def _past(deadline: float) -> bool:
    """Rank 0's clock decides for all ranks, so no rank skips a collective the others enter."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if time.monotonic() > deadline else 0.0], device=_DEVICE)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _align() -> None:
    """Host-synchronised rendezvous so every rank starts the timed op together."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1, device=_DEVICE))
    if _DEVICE == "cuda":
        torch.cuda.synchronize()


class _RankWriter:
    """OpWriter on rank 0, no-op elsewhere; every rank takes part in the measurement."""

    def __init__(self, rank: int, *args, **kw):
        self.w = OpWriter(*args, **kw) if rank == 0 else None

    def ok(self, *a, **k):
        if self.w:
            self.w.ok(*a, **k)

    def failed(self, *a, **k):
        if self.w:
            self.w.failed(*a, **k)


def _op_fn(op: str, nbytes: int, rank: int, world: int):
    """One collective of a per-rank shard of `nbytes` (nccl-tests' size convention), as a closure."""
    import torch
    import torch.distributed as dist

    dev = _DEVICE
    dt = torch.bfloat16 if dev == "cuda" else torch.float32  # gloo reduces float32
    n = max(1, nbytes // (2 if dev == "cuda" else 4))  # elements in the per-rank shard
    if op == "all_gather":
        x, y = torch.randn(n, device=dev).to(dt), torch.empty(n * world, device=dev, dtype=dt)
        return lambda: dist.all_gather_into_tensor(y, x)
    if op == "reduce_scatter":
        x, y = torch.randn(n * world, device=dev).to(dt), torch.empty(n, device=dev, dtype=dt)
        return lambda: dist.reduce_scatter_tensor(y, x)
    if op == "all_reduce":
        x = torch.randn(n, device=dev).to(dt)
        return lambda: dist.all_reduce(x)
    if op == "all_to_all":
        n = max(world, n - n % world)
        x, y = torch.randn(n, device=dev).to(dt), torch.empty(n, device=dev, dtype=dt)
        return lambda: dist.all_to_all_single(y, x)
    if op == "send_recv":  # every rank sends to the next and receives from the previous (nccl-tests sendrecv)
        x, y = torch.randn(n, device=dev).to(dt), torch.empty(n, device=dev, dtype=dt)
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, y, (rank - 1) % world)]

        def sr():
            for r in dist.batch_isend_irecv(ops):
                r.wait()
        return sr
    raise ValueError(op)


class _Clock:
    """Elapsed seconds of a block: CUDA events on a GPU, the host clock on CPU (gloo)."""

    def __init__(self):
        import torch

        self.cuda = _DEVICE == "cuda"
        self.torch = torch

    def start(self):
        if self.cuda:
            self.a, self.b = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b) * 1e-3
        return time.perf_counter() - self.t0


def time_collective(fn, convention: str, *, reps: int = CONVENTION_REPS, samples: int = CONVENTION_SAMPLES,
                    warmup: int = 3) -> Timing:
    """Per-call seconds of `fn` under one convention (module docstring); this rank's view."""
    import statistics

    import torch

    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    for _ in range(warmup):
        fn()
    if _DEVICE == "cuda":
        torch.cuda.synchronize()
    clock = _Clock()
    xs: list[float] = []
    if convention == "barrier":
        for _ in range(reps * samples // 4 or 1):
            _align()
            clock.start()
            fn()
            xs.append(clock.stop())
    elif convention == "stream":
        for _ in range(samples):
            _align()
            clock.start()
            for _ in range(reps):
                fn()
            xs.append(clock.stop() / reps)
    else:
        if _DEVICE != "cuda":
            raise RuntimeError("CUDA-graph timing needs a GPU (NCCL); not available on this backend")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # NCCL warms up its graph-capturable path outside the capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        for _ in range(samples):
            _align()
            clock.start()
            graph.replay()
            xs.append(clock.stop() / reps)
    return Timing(statistics.median(xs), _quantile(xs, 0.2), _quantile(xs, 0.8), len(xs))


def collectives(out_dir: Path, deadline: float, rank: int, world: int, *, sizes: list[int] | None = None,
                ops: tuple[str, ...] = COLLECTIVE_OPS, conventions: tuple[str, ...] = CONVENTIONS) -> None:
    """Every op x size x convention; rows as they are measured (barrier rows in `<op>.csv`)."""
    for op in ops:
        writers = {c: _RankWriter(rank, out_dir, op if c == "barrier" else f"{op}.{c}", ["bytes", "gpus"],
                                  ["convention"]) for c in conventions}
        for nbytes in sizes or grids.COLLECTIVE_BYTES:
            params = dict(bytes=nbytes, gpus=world)
            for conv, w in writers.items():
                if _past(deadline):
                    w.failed(dict(params, convention=conv), "skipped: part time budget exhausted")
                    continue
                try:
                    fn = _op_fn(op, nbytes, rank, world)
                    w.ok(params, _max_over_ranks(time_collective(fn, conv)), convention=conv)
                except Exception as err:  # noqa: BLE001
                    w.failed(dict(params, convention=conv), err)


def kcp(out_dir: Path, deadline: float, rank: int, world: int, heads: list[int],
        lengths: list[int] = grids.KCP_T, docs_list: list[int] = grids.KCP_DOCS) -> None:
    """One KDA layer under fla's KCP (contiguous split, `docs` equal packed documents), fwd and fwd+bwd.

    Extras: `rel_err` = ||o_cp - o_ref|| / ||o_ref|| against single-GPU chunk_kda on the whole packed
    sequence (checked where the whole sequence fits comfortably), and `single_gpu_seconds` = that
    single-GPU forward's time, for the speed-up."""
    import torch
    import torch.distributed as dist
    from fla.ops.cp import build_cp_context

    from k3sim.calibration.kda_ops import KDA_OPTIONS, _fla, kda_inputs

    chunk_kda, _ = _fla()
    wf = _RankWriter(rank, out_dir, "chunk_kda_cp_fwd", ["T", "H", "gpus", "docs"], ["rel_err", "single_gpu_seconds"])
    wb = _RankWriter(rank, out_dir, "chunk_kda_cp_fwd_bwd", ["T", "H", "gpus", "docs"], [])
    check_limit_tokens = 2 ** 17  # harness choice: the single-GPU reference of the whole sequence fits easily
    for H in heads:
        for docs in docs_list:
            for T in lengths:
                params = dict(T=T, H=H, gpus=world, docs=docs)
                if _past(deadline):
                    wf.failed(params, "skipped: part time budget exhausted")
                    wb.failed(params, "skipped: part time budget exhausted")
                    continue
                try:
                    cu = torch.linspace(0, T, docs + 1, device="cuda").round().to(torch.long)
                    ctx = build_cp_context(cu, group=dist.group.WORLD, cu_seqlens_cpu=cu.cpu())
                    part = T // world
                    check = T <= check_limit_tokens
                    if check:
                        full = kda_inputs(T, H, seed=T + docs)
                        local = {k: (v[:, rank * part:(rank + 1) * part].contiguous() if v.dim() > 2 else v)
                                 for k, v in full.items()}
                    else:
                        local = kda_inputs(part, H, seed=T + docs + 1000 * rank)
                    with torch.no_grad():
                        t = _max_over_ranks(time_cuda(lambda: chunk_kda(**local, **KDA_OPTIONS, cp_context=ctx),
                                                      budget_s=2.0, barrier=_align))
                        o_local, _ = chunk_kda(**local, **KDA_OPTIONS, cp_context=ctx)
                        rel_err, single = float("nan"), float("nan")
                        gathered = [torch.empty_like(o_local) for _ in range(world)]
                        if check:
                            dist.all_gather(gathered, o_local.contiguous())
                        if rank == 0:
                            try:
                                ref_in = full if check else kda_inputs(T, H, seed=T + docs)
                                o_ref, _ = chunk_kda(**ref_in, **KDA_OPTIONS, cu_seqlens=cu)
                                if check:
                                    o_cp = torch.cat(gathered, dim=1).float()
                                    rel_err = float((o_cp - o_ref.float()).norm() / o_ref.float().norm())
                                single = time_cuda(lambda: chunk_kda(**ref_in, **KDA_OPTIONS, cu_seqlens=cu),
                                                   budget_s=2.0).seconds
                                del ref_in
                            except Exception as err:  # noqa: BLE001 - OOM on the whole sequence etc.
                                print(f"[kcp] reference T={T} H={H}: {type(err).__name__}: {err}"[:300], flush=True)
                                torch.cuda.empty_cache()
                    dist.barrier()
                    wf.ok(params, t, rel_err=rel_err, single_gpu_seconds=single)
                    if check:
                        del full
                    torch.cuda.empty_cache()
                except Exception as err:  # noqa: BLE001
                    wf.failed(params, err)
                    torch.cuda.empty_cache()
                    continue
                try:
                    leaves = {k: v.detach().requires_grad_(k in ("q", "k", "v", "g", "beta")) for k, v in local.items()}
                    do = torch.randn_like(leaves["q"])

                    def step():
                        o, _ = chunk_kda(**leaves, **KDA_OPTIONS, cp_context=ctx)
                        o.backward(do)

                    def reset():
                        for v in leaves.values():
                            v.grad = None

                    wb.ok(params, _max_over_ranks(time_cuda(step, before_each=reset, budget_s=3.0, barrier=_align)))
                except Exception as err:  # noqa: BLE001
                    wb.failed(params, err)
                torch.cuda.empty_cache()


def _ints(csv_list: str) -> list[int]:
    return [int(x) for x in csv_list.split(",") if x]


def main() -> None:
    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="collectives,kcp")
    ap.add_argument("--heads", default=",".join(map(str, grids.KCP_HEADS)))
    ap.add_argument("--kcp-lengths", default=",".join(map(str, grids.KCP_T)))
    ap.add_argument("--kcp-docs", default=",".join(map(str, grids.KCP_DOCS)))
    ap.add_argument("--deadline-s", type=float, default=500.0, help="seconds from start for all parts")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    start = time.monotonic()
    parts = a.parts.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(parts):
        # Each part may use the time left, minus a share kept for the parts after it.
        deadline = start + a.deadline_s * (i + 1) / len(parts) if part != parts[-1] else start + a.deadline_s
        if part == "collectives":
            collectives(a.out, deadline, rank, world)
        elif part == "kcp":
            kcp(a.out, deadline, rank, world, _ints(a.heads), _ints(a.kcp_lengths), _ints(a.kcp_docs))
        if rank == 0:
            print(f"[dist] {part} done at {time.monotonic() - start:.0f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
