"""fla's KCP (KDA context parallelism) timed from its parts on ONE GPU.

fla 0.6.0 (`fla/ops/cp/chunk_delta_h.py`) adds three things to each rank's local `chunk_kda`:
  1. forward pre-process `chunk_cp_fwd_h` on the LAST document piece of the rank's segment (skipped on the
     last rank): it composes the segment's affine summary h_out = M h_in + h_local, [H, K, V+K] fp32.
     Its grid is (cdiv(V,64) + cdiv(K,64), H) = (4, H) programs, each walking the piece's 64-token chunks
     one after another, so at few heads per rank it fills few SMs and its time is set by the piece length.
  2. an all-gather of those summaries (H*K*(K+V)*4 bytes per rank) and
  3. `chunk_cp_merge`, folding the summaries of the `pre_num_ranks` ranks before it into its initial state.
The backward mirrors it: `chunk_cp_bwd_dh` on the FIRST document piece (skipped on the first rank), an
all-gather, and a merge in the other direction.

None of these needs a second GPU: the kernels take a local tensor and a (gathered) summary buffer.
Ops written (CSV per op, layout as in DEVELOPING.md "Measured data"):
  kcp_pre_fwd  (T, H, docs, L): chunk_cp_fwd_h over the last of `docs` equal pieces of a T-token buffer,
               L = T // docs tokens processed (docs = 1: no document boundary in the segment)
  kcp_pre_bwd  (T, H, docs, L): chunk_cp_bwd_dh over the first piece
  kcp_merge    (H, ranks, forward): chunk_cp_merge of `ranks` gathered summaries (ranks = gpus - 1 at most)
Inputs are random with K3's shapes (K = V = 128, bf16 k/w/u/q/do/dv, fp32 chunk-cumulated log2 gates):
these kernels have no data-dependent control flow, so the values do not change the time.
"""

from __future__ import annotations

import time
from pathlib import Path

from k3sim.calibration.records import OpWriter
from k3sim.calibration.timing import time_cuda

HEAD_DIM = 128
# Harness choices (measurement points, not model inputs): tokens per rank 8K..512K, and K3's KDA heads
# per rank under TP 8, 4, 2, 1 (12 first: the case K3 runs at).
KCP_PART_T = [8192, 32768, 131072, 524288, 16384, 65536, 262144]
KCP_PART_HEADS = [12, 96, 24, 48]
KCP_PART_DOCS = [1, 8]
KCP_MERGE_RANKS = [1, 3, 7]


def _buffers(T: int, H: int):
    """One set of buffers per head count at the largest T; smaller T take a leading slice (contiguous,
    since the batch dimension is 1)."""
    import torch

    shape = (1, T, H, HEAD_DIM)

    def r():
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    gk = torch.empty(shape, device="cuda", dtype=torch.float32).uniform_(-4.0, 0.0)
    return dict(k=r(), w=r(), u=r(), q=r(), do=r(), gk=gk)


def _cu(start: int, end: int):
    import torch

    return torch.tensor([start, end], device="cuda", dtype=torch.long)


def measure_parts(out_dir: Path, deadline: float, heads: list[int] | None = None,
                  lengths: list[int] | None = None, docs_list: list[int] | None = None) -> int:
    """Time the pre-process (fwd, bwd) and merge kernels; returns the number of rows measured."""
    import torch
    from fla.ops.cp.chunk_bwd import chunk_cp_bwd_dh
    from fla.ops.cp.chunk_fwd import chunk_cp_fwd_h
    from fla.ops.cp.chunk_merge import chunk_cp_merge

    heads = heads or KCP_PART_HEADS
    lengths = lengths or KCP_PART_T
    docs_list = docs_list or KCP_PART_DOCS
    wf = OpWriter(out_dir, "kcp_pre_fwd", ["T", "H", "docs", "L"])
    wb = OpWriter(out_dir, "kcp_pre_bwd", ["T", "H", "docs", "L"])
    wm = OpWriter(out_dir, "kcp_merge", ["H", "ranks", "forward"])
    done = 0
    K = V = HEAD_DIM
    for H in heads:
        if time.monotonic() > deadline:
            break
        try:
            buf = _buffers(max(lengths), H)
        except Exception as err:  # noqa: BLE001 - e.g. out of memory: record and go on
            for T in lengths:
                wf.failed(dict(T=T, H=H, docs=1, L=T), err)
            torch.cuda.empty_cache()
            continue
        hm = torch.zeros((H, K, V + K), device="cuda", dtype=torch.float32)
        for docs in docs_list:
            for T in lengths:  # small T first within each head count: fla autotunes on its first call
                L = T // docs
                params = dict(T=T, H=H, docs=docs, L=L)
                for writer, fwd in ((wf, True), (wb, False)):
                    if time.monotonic() > deadline:
                        writer.failed(params, "skipped: part time budget exhausted")
                        continue
                    try:
                        sl = {n: t[:, :T] for n, t in buf.items()}
                        if fwd:  # last piece: [T - L, T)
                            cu = _cu(T - L, T)
                            fn = (lambda sl=sl, cu=cu: chunk_cp_fwd_h(k=sl["k"], w=sl["w"], u=sl["u"], hm=hm,
                                                                      gk=sl["gk"], cu_seqlens=cu))
                        else:  # first piece: [0, L)
                            cu = _cu(0, L)
                            fn = (lambda sl=sl, cu=cu: chunk_cp_bwd_dh(q=sl["q"], k=sl["k"], w=sl["w"],
                                                                       do=sl["do"], dv=sl["u"], dhm=hm,
                                                                       gk=sl["gk"], scale=K ** -0.5,
                                                                       cu_seqlens=cu))
                        writer.ok(params, time_cuda(fn, budget_s=0.6))
                        done += 1
                    except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                        writer.failed(params, err)
                        torch.cuda.empty_cache()
        for ranks in KCP_MERGE_RANKS:
            for forward in (True, False):
                params = dict(H=H, ranks=ranks, forward=int(forward))
                if time.monotonic() > deadline:
                    wm.failed(params, "skipped: part time budget exhausted")
                    continue
                try:
                    ag = torch.randn((ranks + 1, H, K, V + K), device="cuda", dtype=torch.float32) * 0.01
                    h = torch.zeros((H, K, V), device="cuda", dtype=torch.float32)
                    fn = (lambda ag=ag, h=h, r=ranks, f=forward:
                          chunk_cp_merge(h=h, ag_hm=ag, num_ranks=r, rank=r if f else 0, forward=f))
                    wm.ok(params, time_cuda(fn, budget_s=0.3))
                    done += 1
                except Exception as err:  # noqa: BLE001
                    wm.failed(params, err)
        del buf
        torch.cuda.empty_cache()
    for w in (wf, wb, wm):
        w.close()
    return done
