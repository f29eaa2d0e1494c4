"""Stands in for `python -m vllm.entrypoints.cli.main` (put fake_vllm/ first on PYTHONPATH):
records how it was started, to the JSON file named by FAKE_VLLM_OUT, and exits."""

import json
import os
import sys

record = {
    "pid": os.getpid(),
    "argv": sys.orig_argv,
    "executable": sys.executable,
    "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS"),
    "env": dict(os.environ),
}
with open(os.environ["FAKE_VLLM_OUT"], "w") as out:
    json.dump(record, out)
