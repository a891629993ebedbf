"""Import NVIDIA AIConfigurator's measured H200 collective tables as an external calibration run.

Run with the interpreter that has `aiconfigurator-core` (its wheel carries the tables; Apache-2.0):
    /tmp/aicv/bin/python scripts/import_aiconfigurator_comm.py hardware_profiles/measured/h200/<run>
Sources (inside aiconfigurator_core/systems/data/h200_sxm/comm/):
- nccl/2.29.2/nccl_perf.parquet: nccl-tests (all_reduce_perf, all_gather_perf, reduce_scatter_perf,
  alltoall_perf) on 2, 4 and 8 H200s, `-w 40 -n 100..1000 -c 0`, back-to-back calls in the stream,
  time per call in ms; `message_size` = nccl-tests size in bytes / 2 (fp16 elements), i.e. the whole
  buffer (AIConfigurator collector/collect_nccl.py).
- vllm/0.24.0/custom_allreduce_perf.parquet: vLLM's custom all-reduce (one-shot / two-shot over NVLink
  IPC buffers) under CUDA-graph capture (`kernel_source` vLLM_custom_graph), bf16, 2/4/8 GPUs.
Conversion to k3sim's per-rank `bytes` (kernels.ops.wire_bytes): all_reduce and all_to_all = the whole
buffer; all_gather and reduce_scatter = the buffer / gpus (one rank's shard).
Rows are `timer=graph`: back-to-back nccl-tests calls keep the GPU busy (host launch of a few us under
10-16 us of collective), so per-call time is GPU execution time as a graph replay sees it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
       "alltoall": "all_to_all"}
COLS = "bytes,gpus,seconds,seconds_p20,seconds_p80,reps,status,error,timer,source"


def main(out: str) -> None:
    import aiconfigurator_core
    import pandas as pd

    root = Path(aiconfigurator_core.__file__).parent / "systems/data/h200_sxm/comm"
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = pd.read_parquet(root / "nccl/2.29.2/nccl_perf.parquet")
    n = n[n.nccl_dtype == "half"]
    for aic, ours in OPS.items():
        rows = []
        for r in n[n.op_name == aic].sort_values(["num_gpus", "message_size"]).itertuples():
            total = int(r.message_size) * 2
            b = total // r.num_gpus if ours in ("all_gather", "reduce_scatter") else total
            if b < 1:
                continue
            s = float(r.latency) * 1e-3
            rows.append(f"{b},{r.num_gpus},{s:.6e},{s:.6e},{s:.6e},1,ok,,graph,aiconfigurator nccl 2.29.2")
        (out_dir / f"{ours}.csv").write_text(COLS + "\n" + "\n".join(rows) + "\n")
    v = pd.read_parquet(root / "vllm/0.24.0/custom_allreduce_perf.parquet")
    v = v[v.kernel_source == "vLLM_custom_graph"].sort_values(["num_gpus", "message_size"])
    rows = [f"{int(r.message_size) * 2},{r.num_gpus},{float(r.latency) * 1e-3:.6e},{float(r.latency) * 1e-3:.6e},"
            f"{float(r.latency) * 1e-3:.6e},1,ok,,graph,aiconfigurator vllm 0.24.0 custom all-reduce (graph)"
            for r in v.itertuples()]
    (out_dir / "custom_all_reduce.csv").write_text(COLS + "\n" + "\n".join(rows) + "\n")
    (out_dir / "provenance.yaml").write_text(
        'gpu_name: "NVIDIA H200"\n'
        "gpu_count_visible: 8\n"
        "gpus_used: 8\n"
        'source: "external: NVIDIA AIConfigurator 0.12.0 measured tables '
        '(aiconfigurator_core/systems/data/h200_sxm/comm: nccl/2.29.2/nccl_perf.parquet, '
        'vllm/0.24.0/custom_allreduce_perf.parquet), Apache-2.0, (c) NVIDIA"\n'
        'license: "Apache-2.0"\n'
        'date_utc: "2026-12-01"\n'
        'command: "' + " ".join([os.path.basename(sys.executable), *sys.argv]) + '"\n'
        'timing: "nccl-tests back-to-back calls (-w 40 -n 100-1000 -c 0), per-call time; vLLM custom all-reduce '
        'under CUDA-graph capture; rows timer=graph (see scripts/import_aiconfigurator_comm.py)"\n'
        'parts: "collectives (external)"\n')
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1])
