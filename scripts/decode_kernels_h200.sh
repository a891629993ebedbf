#!/usr/bin/env bash
# Decode-sized kernel measurements under CUDA-graph replay on the device tool's nvidia-h200
# (issue 10 items 1-3; k3sim/calibration/graph_parts.py): the MXFP4 token-centric expert kernel and
# the grouped-GEMM baselines, the split-K MLA decode kernel (each after a numerical check), the small
# decode kernels, and the single-GPU families re-timed as a graph runs them.
# Usage (device tool, carry .whl): bash scripts/decode_kernels_h200.sh LETTER [PARTS] [BUDGET_S]
# Results: $OUT/graph-LETTER.tgz (the run directory and the log).
set -u
letter=${1:?run letter, e.g. a}
parts=${2:-moe_ffn_check,moe_ffn,mla_check,mla,decode_ops,gemm_bf16,gemm_fp8,kda_decode,moe,hbm}
budget=${3:-245}
export PYTHONUNBUFFERED=1 FLA_FLASH_KDA=0 TRITON_CACHE_DIR=/tmp/tcache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
run=/tmp/res/20261201-1gpu-graph-$letter
mkdir -p /tmp/res
# Time boxes (seconds) per part: the new kernels first, then the re-measured families.
# Run a: moe_ffn_check,moe_ffn,mla_check,mla,decode_ops,gemm_bf16,gemm_fp8,kda_decode,moe,hbm (245 s).
# Run b: moe_ffn_variants,moe_mxfp4,moe_ffn_check,mla_variants,mla_check,mla,decode_ops_fill (150 s).
pb="moe_ffn_check=12,moe_ffn=85,mla_check=8,mla=40,decode_ops=20,gemm_bf16=20,gemm_fp8=10,kda_decode=30,moe=12,hbm=5"
[ "$letter" = b ] && pb="moe_ffn_variants=30,moe_mxfp4=25,moe_ffn_check=6,mla_variants=25,mla_check=5,mla=45,decode_ops_fill=10"
timeout $((budget + 60)) python3 -m k3sim.calibration.graph_parts --out "$run" --parts "$parts" \
  --budget-s "$budget" --part-budgets "$pb" --heads 12,96,48,24 2>&1 | tee /tmp/res/log-graph-$letter.txt
for f in "$run"/*.csv; do echo "$(basename $f) $(grep -c ',ok,' $f) ok $(grep -c ',failed,' $f) failed"; done
tar czf "$OUT/graph-$letter.tgz" -C /tmp/res .
