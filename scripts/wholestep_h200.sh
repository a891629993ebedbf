#!/usr/bin/env bash
# Whole-step measurement on one H200 (device kind nvidia-h200): decode steps under one CUDA graph,
# mixed prefill steps and training fwd/fwd+bwd of random-weight models with the exact per-rank shapes
# (k3sim/calibration/wholestep). Carry `.whl` (fla-core). Results go to $OUT/wholestep-<mode>.tgz
# (CSV rows written as they are measured, provenance.yaml, manifest.json, the log).
#   smoke: every part at one or two small points (Kimi-Linear layers 1-4 with embedding and LM head,
#          the K3 TP8 slice, the training slices), numerical self-checks on; about 3 minutes.
#   serve: decode (Kimi-Linear-48B whole, K3 TP8 slice with MXFP4 then bf16 experts) and mixed prefill
#          (Kimi-Linear-48B) on the brief's grids (run.py SERVE_PLAN); about 7 minutes, one device call.
#   train: training fwd and fwd+bwd of the two layer slices (run.py TRAIN_PLAN); up to 9 minutes, most
#          of it fla's forward+backward compiles (one family per KDA head count: 32, then 12).
# The compiled-kernel cache comes back as wholestep.txz.*; put those files in .tcache/ and carry it to
# skip fla's compiles in a re-run. Extra arguments go to run.py (e.g. --check, --plan ...).
set -u
mode=${1:?usage: wholestep_h200.sh smoke|serve|train [run.py options]}
shift
case "$mode" in smoke|serve|train) ;; *) echo "mode must be smoke, serve or train, got '$mode'" >&2; exit 2 ;; esac
export PYTHONUNBUFFERED=1 FLA_FLASH_KDA=0 TRITON_CACHE_DIR=/tmp/tcache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/tcache /tmp/ws
if ls .tcache/wholestep.txz.* >/dev/null 2>&1; then cat .tcache/wholestep.txz.* | xz -dc | tar xf - -C /tmp/tcache; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv
day=$(date -u +%Y%m%d)
out=/tmp/ws/$day-wholestep-$mode
R="python3 -m k3sim.calibration.wholestep.run --out $out"
if [ "$mode" = smoke ]; then
  timeout 190 $R --check --batches 1,64 --contexts 4096 --chunks 1024 --prefixes 0,8192 --ride-decodes 32 \
    --micro-batches 1 \
    --plan kimi-linear-48b-l1-4h:decode=30,k3-tp8-ep8-l5-8@mxfp4:decode=25,kimi-linear-48b-l1-4h:prefill=45,kimi-linear-48b-l5-8:train=60 \
    "$@" 2>&1 | tee /tmp/ws/log-$mode.txt
elif [ "$mode" = serve ]; then
  timeout 450 $R --check --plan serve "$@" 2>&1 | tee /tmp/ws/log-$mode.txt
else
  timeout 540 $R --check --plan train "$@" 2>&1 | tee /tmp/ws/log-$mode.txt
fi
for f in $out/*.csv; do echo "$f $(grep -c ',ok,' $f) ok $(grep -c ',failed,' $f) failed"; done
cp /tmp/ws/log-$mode.txt $out/ 2>/dev/null
tar czf $OUT/wholestep-$mode.tgz -C /tmp/ws $(basename $out)
if [ "$mode" != smoke ]; then
  # compiled kernels and fla's autotune choices, for a faster re-run (carry as .tcache/)
  find /tmp/tcache -type f \( -name '*.llir' -o -name '*.ptx' -o -name '*.ttir' -o -name '*.ttgir' -o -name '*.source' \) -delete
  tar cf - -C /tmp/tcache . | xz -T0 -6 | split -b 15m - $OUT/wholestep.txz.
fi
ls -la $OUT
