#!/bin/bash
# The seed job on the GPU machine, once vLLM, speculators and this project are staged
# (tests/gpu/speculators-deps.txt says how) with speculators' launcher at .device/launch_vllm.py;
# README.md in this folder gives the sequence and the budget.
#   bash benchmarks/seed_job/seed.sh start [seed.py options...]   # in the background (setsid)
#   bash benchmarks/seed_job/seed.sh poll N                       # wait up to N s, copy to $OUT
# start copies this folder, benchmarks/acceptance (the tokenizer) and the launcher to $SEED
# (default /tmp/stash/seed), so a later call replacing the working tree does not touch the run;
# seed.py runs under `timeout $SEED_TIMEOUT` (default 1320 s) in its own session, its phases
# each bounded too. poll copies seed.json, the logs and the GPU samples to $OUT/seed.tgz.
set -uo pipefail
SEED=${SEED:-/tmp/stash/seed}
source "$(dirname "$0")/../stash.sh"

case "${1:-}" in
  start)
    shift
    mkdir -p "$SEED/code/benchmarks" "$SEED/work"
    rm -rf "$SEED/code/benchmarks/"{seed_job,acceptance} "$SEED/work/seed.json" "$SEED/done"
    cp -r benchmarks/__init__.py benchmarks/seed_job benchmarks/acceptance "$SEED/code/benchmarks/"
    stash_start "$SEED" "${SEED_TIMEOUT:-1320}" seed benchmarks/seed_job/seed.py "$@"
    ;;
  poll)
    stash_wait "$SEED/done" "${2:-60}"
    tar czf "$OUT/seed.tgz" -C "$SEED" seed.log work/seed.json work/chats.json \
      work/gpu.jsonl work/logs 2>/dev/null
    [ -f "$SEED/done" ] && echo "finished: exit $(cat "$SEED/done")" || echo "still running"
    [ -f "$SEED/work/seed.json" ] && head -c 4000 "$SEED/work/seed.json"; echo
    tail -n 5 "$SEED/seed.log"
    for f in "$SEED"/work/logs/*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 3 "$f"; }; done
    tail -n 1 "$SEED/work/gpu.jsonl" 2>/dev/null
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null
    ;;
  *) echo "usage: seed.sh start [seed.py options...] | poll SECONDS" >&2; exit 2 ;;
esac
