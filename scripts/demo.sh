#!/usr/bin/env bash
# The main job on a small default, offline, CPU only: vLLM 0.20.1's own KV-cache planner for
# hidden-state extraction from the published Qwen3.6-27B config (its text part, built in),
# without and with our patches. Installs vLLM (CPU torch) into .venv-demo/ from the lock of the
# tox env vllm-$VLLM_VERSION (default 0.20.1) on the first run; the CPU torch wheel comes from
# PIP_FIND_LINKS (default /opt/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=${VLLM_VERSION:-0.20.1}
LOCK=tests/requirements/locks/vllm-$VLLM_VERSION.txt
if [ ! -f "$LOCK" ]; then
  echo "demo: vLLM $VLLM_VERSION is not in the test matrix (no $LOCK); pick one of:" \
    $(ls tests/requirements/locks | sed -n 's/^vllm-\(.*\)\.txt$/\1/p') >&2
  exit 2
fi
source scripts/tools.sh
DEMO=.venv-demo
if [ ! -f "$DEMO/.complete" ] || [ "$(cat "$DEMO/.complete")" != "$VLLM_VERSION" ]; then
  rm -rf "$DEMO"
  "$TOOLS/bin/uv" venv -q --python python3 "$DEMO"
  UV_FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels} "$TOOLS/bin/uv" pip install -q --python "$DEMO/bin/python" \
    --overrides tests/requirements/torch-cpu.txt --excludes tests/requirements/gpu-only.txt \
    -r "$LOCK" -e .
  echo "$VLLM_VERSION" > "$DEMO/.complete"
fi
exec "$DEMO/bin/speculators-hybrid" doctor --demo "$@"  # quiet by itself; -v shows vLLM's logs
