#!/bin/bash
# The GPU proofs on vLLM 0.34.0 (Model Runner V2, its only runner), once torch 2.14.0, vLLM and
# this project are staged (README.md beside this file gives the calls), under the staged torch:
#   bash .device/bin/torch-site.sh run bash .device/bin/on-device.sh run bash benchmarks/runner_v2/proofs.sh start
#   bash .device/bin/torch-site.sh run bash .device/bin/on-device.sh run bash benchmarks/runner_v2/proofs.sh poll 560
# start copies tests/gpu, benchmarks and speculators_hybrid to $V2/code (default /tmp/stash/v2),
# so a later call replacing the working tree does not touch a running phase, and runs the phases
# of $PHASES in the background, in order, each in its own process with its own timeout, logging
# to $V2/logs; poll waits up to N s for them, then copies what is done to $OUT/v2.tgz. Phases,
# correctness first (minutes on a warm H100, estimated from earlier runs: README.md):
#   match         tests/gpu/test_hidden_states_match.py: files vs transformers, ids with 0,
#                 prompts over a prefill chunk, prefix caching on with hits (6 engines)
#   kv            tests/gpu/test_kv_capacity.py (2 engines)
#   families-off  tests/gpu/test_hybrid_families.py -k prefix-off (8 families)
#   ratio         benchmarks/extraction.py, the real size, plain and extract, eager: plugin on,
#                 then vLLM as released (--plugin off, SPECULATORS_HYBRID_DISABLE=1); one table
#   families-on   tests/gpu/test_hybrid_families.py -k prefix-on
# A phase that fails or runs out its time is recorded in $V2/status and the next one starts.
set -uo pipefail
V2=${V2:-/tmp/stash/v2}
PHASES=${PHASES:-match kv families-off ratio families-on}
PY=${PY:-python3}  # the staged environment's (the call runs under torch-site.sh and on-device.sh)
# the real size on an H100 (80 GB): 54 GB of weights leave room for 8 GiB of KV
RATIO_ARGS=${RATIO_ARGS:---models hybrid --size qwen3.6-27b --workload fixed --modes plain extract --cuda-graphs off --kv-cache-gib 8 --gpu-memory-utilization 0.92}
source "$(dirname "$0")/../stash.sh"  # the environment, STASH_COMPILE
say() { echo "$(date +%T) $*" | tee -a "$V2/status"; }

limit() {  # phase: its timeout in seconds (twice the estimate, README.md)
  case $1 in
    match) echo "${MATCH_S:-900}" ;; kv) echo "${KV_S:-400}" ;;
    families-off | families-on) echo "${FAMILIES_S:-1200}" ;; ratio) echo "${RATIO_S:-1200}" ;;
  esac
}

pytest_phase() {  # phase file [pytest args]: one report JSON and the engines' logs per phase
  local phase=$1 file=$2; shift 2
  SPECULATORS_HYBRID_GPU_REPORT=$V2/results/$phase.json SPECULATORS_HYBRID_GPU_LOGDIR=$V2/logs/$phase \
    timeout "$(limit "$phase")" "$PY" -m pytest -p no:cacheprovider -s -q -rA "tests/gpu/$file" "$@"
}

ratio() {  # the real size, plugin on then off, into one folder and one table
  local out=$V2/results/ratio budget; budget=$(limit ratio)
  mkdir -p "$out"
  # shellcheck disable=SC2086  # RATIO_ARGS is a list of words
  timeout $((budget / 2)) "$PY" benchmarks/extraction.py --plugin on --out "$out" --work /tmp/spec-hybrid-bench $RATIO_ARGS
  local on=$?
  # shellcheck disable=SC2086
  timeout $((budget / 2)) "$PY" benchmarks/extraction.py --plugin off --out "$out" --work /tmp/spec-hybrid-bench $RATIO_ARGS
  local off=$?
  "$PY" benchmarks/extraction.py --table-only --out "$out" > "$out/table.txt" 2>&1
  return $((on > off ? on : off))
}

run_phase() {
  local phase=$1 t0=$SECONDS rc
  say "$phase: started"
  (
    cd "$V2/code" || exit 9
    case $phase in
      match) pytest_phase match test_hidden_states_match.py ;;
      kv) pytest_phase kv test_kv_capacity.py ;;
      families-off) pytest_phase families-off test_hybrid_families.py -k prefix-off ;;
      families-on) pytest_phase families-on test_hybrid_families.py -k prefix-on ;;
      ratio) ratio ;;
      *) echo "proofs: no phase $phase" >&2; exit 2 ;;
    esac
  ) > "$V2/logs/$phase.log" 2>&1 < /dev/null
  rc=$?
  [ "$rc" = 124 ] && rc="124 (timed out after $(limit "$phase") s)"
  say "$phase: exit $rc, $((SECONDS - t0)) s"
}

case "${1:-}" in
  start)
    [ -f "$V2/done" ] || [ ! -f "$V2/status" ] || { echo "proofs: already running ($V2/status); poll it"; exit 3; }
    rm -rf "$V2"; mkdir -p "$V2/code/tests" "$V2/logs" "$V2/results"
    cp -r benchmarks speculators_hybrid "$V2/code/" && cp -r tests/gpu "$V2/code/tests/" || exit 9
    setsid bash "$V2/code/benchmarks/runner_v2/proofs.sh" all > "$V2/logs/proofs.log" 2>&1 < /dev/null &
    sleep 2; echo "proofs started: $PHASES"
    ;;
  all)
    say "phases: $PHASES"
    t0=$SECONDS; stash_compile "$PY"  # vLLM's and torch's folders
    say "compiled in $((SECONDS - t0)) s"
    for phase in $PHASES; do run_phase "$phase"; done
    say "proofs: finished"; touch "$V2/done"
    ;;
  poll)
    end=$((SECONDS + ${2:-60}))
    while [ $SECONDS -lt $end ] && [ ! -f "$V2/done" ]; do sleep 5; done
    mkdir -p "${OUT:=/tmp/out}"
    tar czf "$OUT/v2.tgz" -C "$V2" results logs status 2>/dev/null
    cat "$V2/status" 2>/dev/null
    grep -h -E "SUMMARY|passed|failed|error" "$V2"/logs/*.log 2>/dev/null | tail -n 30
    cat "$V2/results/ratio/table.txt" 2>/dev/null
    [ -f "$V2/done" ] && echo "proofs: all done" || echo "proofs: still running"
    ;;
  *) echo "usage: proofs.sh start | poll SECONDS | all" >&2; exit 2 ;;
esac
