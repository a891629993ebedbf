#!/usr/bin/env bash
# The hybrid mixers' kernels (issue 23 item 4) on the device tool's nvidia-h200: k3sim/calibration/hybrid_ops.py.
# Usage (device tool, repository root, carry .whl and .tcache):
#   bash scripts/hybrid_h200.sh RUN_NAME BUDGET_S [hybrid_ops options...]
# .whl holds fla-core 0.6.0 and pydantic's wheels (cp312); .tcache, when present, the Triton cache of an earlier
# call (compiled kernels and autotune choices), xz-packed in 15 MiB parts. Results: $OUT/results.tgz (the run
# directory, the warm-up logs and markers, the log) and the pruned Triton cache as $OUT/tcache.txz.* (what a
# cache hit loads: cubin, metadata, autotune JSON, launcher .so).
set -u
name=${1:?run name}
budget=${2:?budget in seconds}
shift 2
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0 TRITON_CACHE_DIR=/tmp/tcache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/tcache /tmp/r
if ls .tcache/tcache.txz.* >/dev/null 2>&1; then cat .tcache/tcache.txz.* | xz -dc | tar xf - -C /tmp/tcache; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv
timeout $((budget + 40)) python3 -m k3sim.calibration.hybrid_ops --out "/tmp/r/$name" --budget-s "$budget" "$@" \
  > "/tmp/r/$name.log" 2>&1
echo "hybrid_ops exit $?"
grep -E "^\[(hybrid|check|gdn|mamba2|warm)\]|FAILED|Traceback|Error" "/tmp/r/$name.log" | tail -n 70
for f in "/tmp/r/$name"/*.csv; do echo "$f $(grep -c ',ok,' "$f") ok $(grep -c ',failed,' "$f") failed"; done
tail -n 3 /tmp/r/"$name"-warm/*.log 2>/dev/null | tail -n 40
tar czf "$OUT/results.tgz" -C /tmp/r .
find /tmp/tcache -type f \( -name '*.llir' -o -name '*.ptx' -o -name '*.ttir' -o -name '*.ttgir' -o -name '*.source' \) -delete
du -sh /tmp/tcache
tar cf - -C /tmp/tcache . | xz -T0 -6 | split -b 15m - "$OUT/tcache.txz."
ls -la "$OUT"
