#!/bin/bash
# The extraction benchmark on the GPU machine, from the repository root there, once vLLM and
# this project are staged and installed (benchmarks/README.md gives the whole sequence):
#   bash benchmarks/device.sh            # the plugin as installed (needed on vLLM 0.20.1 hybrids)
#   bash benchmarks/device.sh upstream   # SPECULATORS_HYBRID_DISABLE=1: vLLM as released (0.25.0)
# More arguments go to benchmarks/extraction.py (e.g. --models hybrid, --cuda-graphs off).
# The real size (no checkpoint, dummy weights; README: about 3 engines fit in one call):
#   bash benchmarks/device.sh plugin --models hybrid --size qwen3.6-27b --workload fixed \
#     --modes plain extract --cuda-graphs off     # then --modes extract-instep; --workload chat
# Back in $OUT/bench: one JSON per engine, table.md, logs.tgz (the engines' full logs); <= 8 files.
# Time on an H200 (vLLM 0.20.1): ~6 min for the 4 engines (their start-up dominates) plus ~1 min
# to build the models once per warm machine.
set -uo pipefail
case "${1:-plugin}" in
  plugin) flag=on ;;
  upstream) flag=off ;;
  *) echo "usage: bash benchmarks/device.sh [plugin|upstream] [extraction.py args...]" >&2; exit 2 ;;
esac
shift || true
# Caches kept on the warm machine: Triton's autotuning results too, so every engine after the
# first skips the autotuning (the same kernel configs for each mode side by side). Engine start on
# an H100 (2026-12-05): cold 147-163 s with CUDA graphs, warm 28-37 s (before: ~260 s / ~95 s).
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
export TRITON_HOME=${TRITON_HOME:-/tmp/stash/triton-home} VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/stash/vllm-cache}
out=${OUT:-/tmp/out}/bench
work=/tmp/spec-hybrid-bench
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
df -h /tmp | tail -1
timeout "${BENCH_TIMEOUT:-540}" bash .device/bin/on-device.sh run \
  python3 benchmarks/extraction.py --plugin "$flag" --out "$out" --work "$work" "$@" \
  2>&1 | tee "$work/driver.log"
rc=$?
tar czf "$out/logs.tgz" -C "$work" driver.log runs 2>/dev/null
exit $rc
