"""A stand-in for a vLLM server in the orchestration tests (test_seed_job.py,
test_backends_job.py, test_acceptance_loop.py): answers /health and /v1/completions on
127.0.0.1:PORT until stopped, logging each completion as vLLM's server does (the line the
orchestrators count). RUNNER_HEAD starts each test's stand-in runner.

    python tests/unit/standin_vllm.py PORT
"""

from __future__ import annotations

import http.server
import sys

ANSWERED = 'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK'

# The start of each test's stand-in for on-device.sh (`run CMD...`): the command in $args and
# `value OPTION "$@"`, an option's value ("--opt v" or "--opt=v")
RUNNER_HEAD = r"""#!/bin/bash
shift  # "run"
args="$*"
value() { local want=$1; shift; while [ $# -gt 0 ]; do
  case $1 in "$want") echo "$2"; return;; "$want"=*) echo "${1#*=}"; return;; esac; shift; done; }
"""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")
        print(ANSWERED, flush=True)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
