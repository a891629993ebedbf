#!/usr/bin/env bash
# Runs the calibration harness on the device tool's two-GPU H200 machine (nvidia-h200-x2).
# Phase 1: single-GPU parts on both GPUs in parallel (KDA compiles are slow; the two GPUs split them).
# Phase 2: multi-GPU parts (NCCL collectives, fla KCP) on both GPUs under torchrun.
# Results go to $OUT as tarballs (the device tool returns at most 8 files of 16 MiB); the Triton cache
# (compiled kernels and fla's autotune choices) travels back too and is carried into the next phase.
set -u
phase=${1:?phase 1, 2 or 3}
export PYTHONUNBUFFERED=1 FLA_FLASH_KDA=0 TRITON_CACHE_DIR=/tmp/tcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/tcache /tmp/res
if [ -d .tcache ]; then cat .tcache/tcache.tgz.* 2>/dev/null | tar xzf - -C /tmp/tcache 2>/dev/null; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
day=$(date -u +%Y%m%d)
R="python3 -m k3sim.calibration.runner --profile h200"
if [ "$phase" = 1 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 560 $R --out /tmp/res/$day-1gpu-a --budget-s 530 --heads 96,12 \
    --parts kda_fwd,kda_fwd_bwd,kda_decode --part-budgets kda_fwd=210,kda_fwd_bwd=200,kda_decode=110 \
    > /tmp/res/log-a.txt 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 560 $R --out /tmp/res/$day-1gpu-b --budget-s 530 --heads 48,24 \
    --parts kda_fwd,gemm_bf16,hbm,moe,sdpa,gemm_fp8 \
    --part-budgets kda_fwd=200,gemm_bf16=75,hbm=30,moe=70,sdpa=100,gemm_fp8=50 > /tmp/res/log-b.txt 2>&1 &
  wait
elif [ "$phase" = 3 ]; then
  # KCP at longer sequences (phase 2's compiles used most of its budget).
  timeout 470 $R --out /tmp/res/$day-2gpu-b --budget-s 455 --heads 96 --parts kcp \
    --kcp-lengths 131072,262144,524288 --kcp-docs 1,4 > /tmp/res/log-2gpu-b.txt 2>&1
else
  # Single-GPU leftovers first (compiled kernels come from the carried cache), then the two-GPU parts.
  CUDA_VISIBLE_DEVICES=0 timeout 150 $R --out /tmp/res/$day-1gpu-c --budget-s 120 --heads 12,24 \
    --parts kda_fwd > /tmp/res/log-c.txt 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 150 $R --out /tmp/res/$day-1gpu-d --budget-s 120 --heads 48 \
    --parts kda_fwd > /tmp/res/log-d.txt 2>&1 &
  wait
  timeout 410 $R --out /tmp/res/$day-2gpu --budget-s 390 --heads 96 --parts collectives,kcp > /tmp/res/log-2gpu.txt 2>&1
fi
tail -n 30 /tmp/res/log-*.txt
for f in /tmp/res/*/*.csv; do echo "$f $(grep -c ',ok,' $f) ok $(grep -c ',failed,' $f) failed"; done
tar czf $OUT/results-phase$phase.tgz -C /tmp/res .
[ "$phase" = 3 ] || tar czf - -C /tmp/tcache . | split -b 15m - $OUT/tcache.tgz.
ls -la $OUT
