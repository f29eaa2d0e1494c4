"""Give a `vllm serve` argv (JSON in argv[1]) to the installed vLLM's own CLI parser and config
code on the CPU; print `OK ...` or `FAIL ...`. Checks flags, not KV planning or serving.
vLLM's plugins are loaded as the server loads them (ours is off with SPECULATORS_HYBRID_DISABLE)."""

from __future__ import annotations

import json
import sys

from speculators_hybrid import cpu

cpu.prepare()

from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402

load_general_plugins()  # ours, unless SPECULATORS_HYBRID_DISABLE is set

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # older vLLM
    from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

argv = json.loads(sys.argv[1])
model, *rest = argv[argv.index("serve") + 1 :]
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
args = parser.parse_args(["--model", model, "--max-model-len", "256", *rest])
try:
    config = EngineArgs.from_cli_args(args).create_engine_config()
except Exception as exc:
    print("FAIL", type(exc).__name__, str(exc).replace("\n", " ")[:300])
else:
    mm = config.model_config.multimodal_config
    print(
        "OK",
        json.dumps(
            {
                "chunked_prefill": config.scheduler_config.enable_chunked_prefill,
                "prefix_caching": config.cache_config.enable_prefix_caching,
                "language_model_only": bool(mm and mm.language_model_only),
            }
        ),
    )
