"""Every `SPECULATORS_HYBRID_*` environment variable, named here once; a switch is on when set to
1, true or yes, off when set to 0, false or no (any case); unset (or anything else) is neither.
The code that reads a variable says what it does."""

from __future__ import annotations

import os
import re

ON = ("1", "true", "yes")
OFF = ("0", "false", "no")


def on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ON


def off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in OFF


DISABLE = "SPECULATORS_HYBRID_DISABLE"  # the plugin patches nothing
DISABLED_PATCHES = "SPECULATORS_HYBRID_DISABLED_PATCHES"  # patch ids left out (below)
PREFILL_ONLY = "SPECULATORS_HYBRID_PREFILL_ONLY"  # vllm_patches/prefill_only.py
ASYNC_WRITES = "SPECULATORS_HYBRID_ASYNC_WRITES"  # vllm_patches/writer.py
WRITER_THREADS = "SPECULATORS_HYBRID_WRITER_THREADS"  # vllm_patches/writer.py
COPY_CHUNK_MIB = "SPECULATORS_HYBRID_COPY_CHUNK_MIB"  # vllm_patches/host_copy.py
WIDE_HIDDEN = "SPECULATORS_HYBRID_WIDE_HIDDEN"  # vllm_patches/wide_hidden.py
REFUSE_BAD = "SPECULATORS_HYBRID_REFUSE_BAD"  # vllm_patches/provenance_meta.py
SAFETENSORS_SAVE = "SPECULATORS_HYBRID_SAFETENSORS_SAVE"  # vllm_patches/provenance_meta.py
WHEELS = "SPECULATORS_HYBRID_WHEELS"  # upstream.py: a folder of release wheels


def disabled() -> bool:
    """`SPECULATORS_HYBRID_DISABLE` is on: neither vLLM's nor speculators' patches are armed."""
    return on(DISABLE)


def disabled_patches() -> frozenset[str]:
    """Patch ids turned off by SPECULATORS_HYBRID_DISABLED_PATCHES (comma or space separated),
    to see what one patch does; a run without a patch its vLLM needs is not a supported one."""
    return frozenset(re.split(r"[,\s]+", os.environ.get(DISABLED_PATCHES, "").strip())) - {""}
