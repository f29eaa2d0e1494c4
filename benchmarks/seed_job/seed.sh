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
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export TRITON_CACHE_AUTOTUNING=1 TRITON_HOME=/tmp/stash/triton-home VLLM_CACHE_ROOT=/tmp/stash/vllm-cache
RUNNER=${RUNNER:-/tmp/stash/bin/on-device.sh}

case "${1:-}" in
  start)
    shift
    mkdir -p "$SEED/code/benchmarks" "$SEED/work"
    rm -rf "$SEED/code/benchmarks/"{seed_job,acceptance} "$SEED/work/seed.json" "$SEED/done"
    cp -r benchmarks/__init__.py benchmarks/seed_job benchmarks/acceptance "$SEED/code/benchmarks/"
    [ -f .device/launch_vllm.py ] && cp .device/launch_vllm.py "$SEED/launch_vllm.py"
    if [ -f .device/bin/on-device.sh ]; then mkdir -p /tmp/stash/bin; cp .device/bin/on-device.sh /tmp/stash/bin/; fi
    # the orchestrator runs in the staged environment; its commands each go through $RUNNER too
    RUNNER=$RUNNER setsid bash -c "cd $SEED/code && timeout ${SEED_TIMEOUT:-1320} bash $RUNNER run \
      python3 benchmarks/seed_job/seed.py $SEED/work --launcher $SEED/launch_vllm.py $*; \
      echo \$? > $SEED/done" > "$SEED/seed.log" 2>&1 < /dev/null &
    sleep 2; echo "seed job started (pid $!)"
    ;;
  poll)
    end=$((SECONDS + ${2:-60}))
    while [ $SECONDS -lt $end ] && ! [ -f "$SEED/done" ]; do sleep 5; done
    mkdir -p "${OUT:-/tmp/out}"
    tar czf "${OUT:-/tmp/out}/seed.tgz" -C "$SEED" seed.log work/seed.json work/chats.json \
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
