#!/usr/bin/env bash
# Regenerates the committed reports under reports/ -- the only thing that writes there (issue 19, item 7).
#
#   scripts/reports.sh                 # every report below (slow: tens of minutes on two cores)
#   scripts/reports.sh decode cp       # only these targets
#   scripts/reports.sh --list          # the targets
#
# Every k3sim command run here names its --out explicitly and runs the committed grid whole, so a table
# is rewritten whole, never in part (the README's `prefix-cache --sweep` example with its default grid
# once replaced the committed 145-row conversation table by a 75-row one). Outputs go through
# k3sim.files: each report directory carries a .k3sim-manifest.json, only the files it lists are
# replaced, a hand-written README beside them is never touched, and a file whose only change would be an
# ISO timestamp, or whose bytes are unchanged, keeps its bytes: regenerating unchanged reports leaves
# `git status reports` clean.
#
# Not here (their own inputs): reports/cp/kcp_parts* (`python3 -m k3sim.cp.kcp_parts`),
# reports/decode/aiconfigurator* (benchmarks/aiconfigurator_compare.py), reports/planner and
# reports/prefix_cache/{benchmark.json,eviction.csv} (benchmarks/), reports/serving/fleet8_conversation.md
# (a table written by hand from the two fleet runs). The whole-step checks (targets `training`,
# `decode-check`) re-read the committed GPU runs; they never run a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
K3SIM=(python3 -m k3sim)
CONV=data/traces/conversation_trace.jsonl
SYNTH=data/traces/synthetic_trace.jsonl

# scenario file -> report directory (its `name:`); k3-h200-1node does not fit: its report is written and
# `plan` exits 2, as documented
plans() {
  local s
  for s in default:k3-h200-serve-128k k3-h200-serve-pd:k3-h200-serve-pd k3-gb200-nvl72-serve:k3-gb200-nvl72-serve \
           kimi-linear-48b-h200:kimi-linear-48b-h200 k3-h200-train-32k:k3-h200-train-32k \
           k3-h200-train-1m:k3-h200-train-1m k3-h200-1node:k3-h200-1node; do
    local file=${s%%:*} dir=${s##*:} rc=0
    "${K3SIM[@]}" plan "scenarios/$file.yaml" --out "reports/$dir" >/dev/null || rc=$?
    if [ "$rc" != 0 ] && ! { [ "$file" = k3-h200-1node ] && [ "$rc" = 2 ]; }; then
      echo "plan scenarios/$file.yaml failed (exit $rc)" >&2; return 1
    fi
  done
}

cp_sweep() { "${K3SIM[@]}" cp --sweep --out reports/cp >/dev/null; }

decode() {
  "${K3SIM[@]}" decode --model models/kimi-k3.yaml --tp 8 --pp 2 --ep 8 --context 32768 --sweep-batch \
    --out reports/decode >/dev/null
  "${K3SIM[@]}" decode --model models/kimi-linear-48b.yaml --tp 1 --pp 1 --ep 1 --context 4096 --sweep-batch \
    --out reports/decode >/dev/null
}

prefix_cache() {
  local big=(--hash-blocks 512,1024,2048 --physical-blocks 512,1024,2048,4096,6144
             --capacities none,64e9,256e9,1e12,4e12)
  local small=(--requests 2000 --hash-blocks 64,128,256,512 --physical-blocks 512,1024,2048,4096
               --capacities none,32e9,128e9)
  "${K3SIM[@]}" prefix-cache --trace "$CONV" --sweep "${big[@]}" --name conversation --out reports/prefix_cache >/dev/null
  "${K3SIM[@]}" prefix-cache --trace "$SYNTH" --sweep "${big[@]}" --name synthetic --out reports/prefix_cache >/dev/null
  "${K3SIM[@]}" prefix-cache --workload chat --sweep "${small[@]}" --out reports/prefix_cache >/dev/null
  "${K3SIM[@]}" prefix-cache --workload rag --sweep "${small[@]}" --out reports/prefix_cache >/dev/null
}

serving() {
  # the committed serving reports run one batch at a time per replica (pp micro-batches off, the default before
  # issue 24 turned them on); pp_microbatches/ is the same sweep with them on
  "${K3SIM[@]}" serve --trace "$CONV" --sweep-rate 0.1:1.6:16 --no-pp-microbatches --out reports/serving >/dev/null
  "${K3SIM[@]}" serve --trace "$CONV" --sweep-rate 0.1:1.6:16 --pp-microbatches \
    --out reports/serving/pp_microbatches >/dev/null
  "${K3SIM[@]}" serve --trace "$CONV" --replicas 8 --router prefix-aware --no-pp-microbatches \
    --out reports/serving/fleet8_prefix_aware >/dev/null
  "${K3SIM[@]}" serve --trace "$CONV" --replicas 8 --disaggregate 4:4 --no-pp-microbatches \
    --out reports/serving/fleet8_pd_4_4 >/dev/null
}

calibration() { "${K3SIM[@]}" calibrate validate --hardware h200 --out reports/calibration >/dev/null; }

pipeline() { python3 -m k3sim.pipeline.report --out reports/pipeline >/dev/null; }

RUNS=hardware_profiles/measured/h200
training() {
  local r
  for r in "$RUNS"/20261201-wholestep-train "$RUNS"/20261201-wholestep-train-[b-e]; do
    "${K3SIM[@]}" check train "$r" reports/training >/dev/null
  done
  "${K3SIM[@]}" check train-report reports/training >/dev/null
}

decode_check() { "${K3SIM[@]}" check decode "$RUNS"/20261201-wholestep-serve reports/decode >/dev/null; }

deployed() { "${K3SIM[@]}" check deployed --out reports/deployed >/dev/null; }
train_deployed() { "${K3SIM[@]}" check train-deployed --out reports/training >/dev/null; }

TARGETS=(plans cp decode decode-check prefix-cache serving calibration pipeline training deployed train-deployed)
run_target() {
  case "$1" in
    plans) plans ;; cp) cp_sweep ;; decode) decode ;; prefix-cache) prefix_cache ;; serving) serving ;;
    calibration) calibration ;; pipeline) pipeline ;; training) training ;; decode-check) decode_check ;;
    deployed) deployed ;;
    train-deployed) train_deployed ;;
    *) echo "unknown target '$1' (targets: ${TARGETS[*]})" >&2; exit 2 ;;
  esac
}

if [ "${1:-}" = --list ]; then printf '%s\n' "${TARGETS[@]}"; exit 0; fi
[ $# -gt 0 ] || set -- "${TARGETS[@]}"
for t in "$@"; do  # every name checked before anything runs
  case " ${TARGETS[*]} " in *" $t "*) ;; *) run_target "$t" ;; esac
done
for t in "$@"; do
  echo "reports: $t" >&2
  run_target "$t"
done
git status --short reports >&2 || true
