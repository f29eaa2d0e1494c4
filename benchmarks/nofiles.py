"""Benchmark only: our connector with its file path cut off (no gather, no copy, no file).

`extract-nofiles` against `plain` is what extraction costs without files (the auxiliary hidden
states, the hidden-state cache, one-layer KV-cache groups, the spec-decode step); `extract`
against `extract-nofiles` is the file path. vLLM < 0.22 only (our connector).
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.vllm_patches.connector import HybridHiddenStatesConnector


class NoFilesConnector(HybridHiddenStatesConnector):
    def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
        return None
