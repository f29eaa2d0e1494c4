#!/usr/bin/env bash
# Run the test matrix (tox.ini): the framework's unit tests, then each vLLM release on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check 'tox>=4.20' 'tox-uv>=1.11'
exec python3 -m tox run "$@"
