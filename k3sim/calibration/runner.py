"""`k3sim calibrate run`: measure the parts asked for on this machine's GPUs into one run directory.

Single-GPU parts run in this process on the current device; `collectives` and `kcp` run under
torchrun on every visible GPU. Each part has a time budget; rows are written as they are measured,
so a part cut short or a failing kernel never loses what was already measured.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from k3sim.calibration import grids

SINGLE_GPU_PARTS = ["gemm_bf16", "gemm_fp8", "hbm", "moe", "sdpa", "kda_fwd", "kda_fwd_bwd", "kda_decode"]
SINGLE_GPU_PARTS += ["kcp_parts"]  # fla KCP pre-process/merge kernels alone (calibration/kcp_parts.py)
MULTI_GPU_PARTS = ["collectives", "kcp"]
ALL_PARTS = SINGLE_GPU_PARTS + MULTI_GPU_PARTS
# Multi-GPU runs keep NVLink multicast off (device tool KINDS.md: it can take a shared host's GPUs down).
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _check_gpu() -> int:
    from k3sim.errors import InputError

    try:
        import torch
    except ImportError:
        raise InputError("calibrate run needs PyTorch with CUDA (pip install 'k3sim[gpu]')", source="calibrate run", field="torch") from None
    if not torch.cuda.is_available():
        raise InputError("no CUDA GPU visible on this machine; run the harness on the GPU machine", source="calibrate run", field="gpu")
    return torch.cuda.device_count()


def _single_part(part: str, out_dir: Path, deadline: float, heads: list[int] | None,
                 decode_tokens: list[int] | None = None) -> int:
    from k3sim.calibration import kda_ops, torch_ops

    kda_heads = heads or grids.KDA_HEADS
    if part == "gemm_bf16":
        return torch_ops.gemm_bf16(out_dir, deadline)
    if part == "gemm_fp8":
        return torch_ops.gemm_fp8(out_dir, deadline)
    if part == "hbm":
        return torch_ops.hbm(out_dir, deadline)
    if part == "moe":
        return torch_ops.moe_grouped_bf16(out_dir, deadline)
    if part == "sdpa":
        return torch_ops.sdpa(out_dir, deadline)
    if part == "kda_fwd":
        return kda_ops.chunk_fwd(out_dir, deadline, kda_heads, grids.KDA_T)
    if part == "kda_fwd_bwd":
        return kda_ops.chunk_fwd_bwd(out_dir, deadline, kda_heads, grids.KDA_FWD_BWD_T)
    if part == "kda_decode":
        return kda_ops.recurrent_decode(out_dir, deadline, kda_heads, grids.KDA_DECODE_B,
                                        decode_tokens or grids.KDA_DECODE_T)
    if part == "kcp_parts":
        from k3sim.calibration import kcp_parts

        return kcp_parts.measure_parts(out_dir, deadline, heads)
    raise ValueError(part)


def run_calibration(out_dir: Path, parts: list[str], profile: str, time_budget_s: float,
                    heads: list[int] | None = None, part_budgets_s: dict[str, float] | None = None,
                    kcp_lengths: list[int] | None = None, kcp_docs: list[int] | None = None,
                    decode_tokens: list[int] | None = None) -> Path:
    """Measure `parts` into `out_dir` (created); returns it. Raises InputError without a GPU."""
    from k3sim.calibration.records import provenance, write_provenance
    from k3sim.errors import InputError

    unknown = [p for p in parts if p not in ALL_PARTS]
    if unknown:
        raise InputError(f"unknown part(s) {unknown}; choose from {ALL_PARTS}", source="calibrate run", field="parts")
    unknown_budgets = sorted(set(part_budgets_s or {}) - set(parts))
    if unknown_budgets:
        raise InputError(f"budgets given for parts not run: {unknown_budgets}", source="calibrate run",
                         field="part_budgets")
    multi = [p for p in parts if p in MULTI_GPU_PARTS]
    gpus = _check_gpu()
    if multi and gpus < 2:  # checked before anything is measured or written
        raise InputError(f"parts {multi} need at least 2 GPUs, found {gpus}", source="calibrate run", field="parts")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(a) for a in sys.argv)
    info = provenance(command, gpus if multi else 1, parts)
    info["profile"] = profile
    info["kda_options"] = "use_qk_l2norm_in_kernel, use_gate_in_kernel, safe_gate, lower_bound=-5, K=V=128"
    write_provenance(out_dir, info)
    start = time.monotonic()
    budgets = part_budgets_s or {}
    single = [p for p in parts if p in SINGLE_GPU_PARTS]
    for i, part in enumerate(single):
        left = time_budget_s - (time.monotonic() - start)
        share = budgets.get(part, left / (len(single) - i + (1 if multi else 0)))
        deadline = time.monotonic() + min(share, left)
        t0 = time.monotonic()
        n = _single_part(part, out_dir, deadline, heads, decode_tokens)
        print(f"[calibrate] {part}: {n} shapes in {time.monotonic() - t0:.0f}s", flush=True)
    if "gemm_bf16" in parts:
        from k3sim.calibration.torch_ops import flop_rate_check

        info["bf16_8192_cubed_tflops"] = round(flop_rate_check(), 1)
    if multi:
        left = max(30.0, time_budget_s - (time.monotonic() - start))
        env = dict(os.environ, **SAFE_NCCL_ENV)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
               "-m", "k3sim.calibration.distributed", "--out", str(out_dir), "--parts", ",".join(multi),
               "--deadline-s", str(left)]
        if heads:
            cmd += ["--heads", ",".join(map(str, heads))]
        cmd += ["--kcp-lengths", ",".join(map(str, kcp_lengths or grids.KCP_T)),
                "--kcp-docs", ",".join(map(str, kcp_docs or grids.KCP_DOCS))]
        subprocess.run(cmd, env=env, check=False)
    info["elapsed_s"] = round(time.monotonic() - start, 1)
    write_provenance(out_dir, info)
    return out_dir


def _int_list(text: str, option: str) -> list[int]:
    """'96,12' -> [96, 12]; anything else is one line of bad input."""
    from k3sim.errors import InputError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated positive integers, got {text!r}", source=option) from None
    if any(v <= 0 for v in values):
        raise InputError(f"values must be positive, got {text!r}", source=option)
    return values


def _budgets(text: str) -> dict[str, float]:
    """'kda_fwd=200,moe=60' -> {part: seconds}."""
    from k3sim.errors import InputError

    out: dict[str, float] = {}
    for item in (x for x in text.split(",") if x.strip()):
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise InputError(f"expected PART=SECONDS, got {item!r}", source="--part-budgets") from None
        if not 0 < out[name.strip()] < float("inf"):  # NaN and inf too
            raise InputError(f"budget must be a positive number of seconds, got {item!r}", source="--part-budgets")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(SINGLE_GPU_PARTS))
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--heads", default="", help="KDA head counts, e.g. 96,12")
    ap.add_argument("--kcp-lengths", default="", help="global tokens for the KCP part, e.g. 131072,262144")
    ap.add_argument("--kcp-docs", default="", help="packed documents per sequence for the KCP part, e.g. 1,4")
    ap.add_argument("--part-budgets", default="", help="e.g. kda_fwd=200,kda_fwd_bwd=150")
    ap.add_argument("--decode-tokens", default="", help="tokens per request for kda_decode, e.g. 16,32")
    a = ap.parse_args(argv)
    from k3sim.errors import InputError

    try:
        if not 0 < a.budget_s < float("inf"):  # NaN and inf too
            raise InputError(f"must be a positive number of seconds, got {a.budget_s}", source="--budget-s")
        run_calibration(a.out, a.parts.split(","), a.profile, a.budget_s, _int_list(a.heads, "--heads") or None,
                        _budgets(a.part_budgets), _int_list(a.kcp_lengths, "--kcp-lengths") or None,
                        _int_list(a.kcp_docs, "--kcp-docs") or None,
                        _int_list(a.decode_tokens, "--decode-tokens") or None)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
