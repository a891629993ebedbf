#!/usr/bin/env bash
# One-GPU measurement of fla's KCP parts (issue 12 item 1) on the device tool's nvidia-h200 machine:
# the forward pre-process (chunk_cp_fwd_h), the backward's (chunk_cp_bwd_dh) and the merge
# (chunk_cp_merge) alone, at 12, 96, 24, 48 heads (that order), T = 8K..512K tokens per rank, with no
# document boundary in the segment (docs = 1) and with 8 equal documents (the kernel then walks one piece).
# Usage (device tool, repository root): bash scripts/kcp_parts_h200.sh [BUDGET_S]
# Results: $OUT/<date>-1gpu-kcp-a/*.csv + provenance.yaml, and the log.
set -u
budget=${1:-250}
export PYTHONUNBUFFERED=1 FLA_FLASH_KDA=0 TRITON_CACHE_DIR=/tmp/tcache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.total --format=csv
day=$(date -u +%Y%m%d)
run=$OUT/$day-1gpu-kcp-a
timeout $((budget + 25)) python3 -m k3sim.calibration.runner --profile h200 --out "$run" \
  --budget-s "$budget" --parts kcp_parts --heads 12,96,24,48 > "$OUT/log.txt" 2>&1
echo "runner exit $?"
tail -n 20 "$OUT/log.txt"
for f in "$run"/*.csv; do echo "$f $(grep -c ',ok,' "$f") ok $(grep -c ',failed,' "$f") failed"; done
