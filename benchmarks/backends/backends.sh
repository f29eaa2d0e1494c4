#!/bin/bash
# The hidden-state backends with a real trainer on the GPU machine, once vLLM, speculators, this
# project and (for mooncake) Mooncake's wheels are staged; README.md in this folder gives the calls.
#   bash benchmarks/backends/backends.sh start    # in the background (setsid)
#   bash benchmarks/backends/backends.sh poll N   # wait up to N s, then copy to $OUT/backends.tgz
#   bash benchmarks/backends/backends.sh check    # the libraries Mooncake's binaries lack here
# start copies this folder, seed_job (its timed runs and poller), acceptance (target.py), the
# store starter (tests/cpu/mooncake_store.py) and the launcher to $BK (default
# /tmp/stash/backends), so a later call replacing the working tree does not touch the run;
# backends.py runs under `timeout $BK_TIMEOUT` (default 660 s) in its own session, each of its
# phases bounded too. Knobs (environment of start): BACKENDS ("file fp8 mooncake"), CHATS
# (500), EPOCHS (1), STEPS (0: the whole epochs), TARGET_S (30, when $ACC/target is absent),
# PORT (8200), ACC (/tmp/stash/acc: the acceptance loop's target is reused).
set -uo pipefail
BK=${BK:-/tmp/stash/backends}
source "$(dirname "$0")/../stash.sh"

case "${1:-}" in
  start)
    shift
    mkdir -p "$BK/code/benchmarks" "$BK/code/tests/cpu" "$BK/work"
    rm -rf "$BK/code/benchmarks/"{backends,seed_job,acceptance} "$BK/work/backends.json" "$BK/done"
    cp -r benchmarks/__init__.py benchmarks/backends benchmarks/seed_job benchmarks/acceptance \
      "$BK/code/benchmarks/"
    cp tests/cpu/mooncake_store.py "$BK/code/tests/cpu/"
    stash_start "$BK" "${BK_TIMEOUT:-660}" backends benchmarks/backends/backends.py "$@"
    ;;
  poll)
    stash_wait "$BK/done" "${2:-60}"
    tar czf "$OUT/backends.tgz" -C "$BK" backends.log work/backends.json work/logs 2>/dev/null
    [ -f "$BK/done" ] && echo "finished: exit $(cat "$BK/done")" || echo "still running"
    [ -f "$BK/work/backends.json" ] && head -c 6000 "$BK/work/backends.json"; echo
    tail -n 8 "$BK/backends.log"
    for f in "$BK"/work/logs/*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 3 "$f"; }; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null
    ;;
  check) stash_runner; bash "$RUNNER" run python3 benchmarks/backends/backends.py "$BK/check" --check ;;
  *) echo "usage: backends.sh start [backends.py options...] | poll SECONDS | check" >&2; exit 2 ;;
esac
