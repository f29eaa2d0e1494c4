#!/usr/bin/env bash
# The main job on a small default, offline, CPU only: vLLM 0.20.1's own KV-cache planner for
# hidden-state extraction from a built-in Qwen3.6-27B-like hybrid config, without and with
# our patches. Installs vLLM (CPU torch) into .venv-demo on the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=${VLLM_VERSION:-0.20.1}
python3 -m pip install -q --disable-pip-version-check 'uv>=0.5'
if [ ! -x .venv-demo/bin/speculators-hybrid ] || ! .venv-demo/bin/python -c "import vllm" 2>/dev/null; then
  python3 -m uv venv -q .venv-demo
  UV_FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels} python3 -m uv pip install -q --python .venv-demo/bin/python \
    --overrides tests/requirements/torch-cpu.txt --excludes tests/requirements/gpu-only.txt \
    "vllm==$VLLM_VERSION" 'transformers>=5.6' -e .
fi
VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR} exec .venv-demo/bin/speculators-hybrid doctor --demo "$@"
