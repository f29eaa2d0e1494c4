"""GPU: the KV capacity vLLM logs at start-up for the tiny hybrid with extraction is at least
0.95x what its true bytes allow (hidden-states-own-page-size; issue target).

Same KV memory (`kv_cache_memory_bytes` = 2 GiB) for both engines; "true bytes allow" is
M / (M / C0 + h): C0 the capacity without extraction, h = n_ids x hidden_size x 2 bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# tests/gpu is on sys.path; importing it skips this module too without a GPU.
from test_hidden_states_match import IDS, multimodal_model, run_engine, write_report

__all__ = ["multimodal_model"]  # the module-scoped model fixture, shared

pytestmark = pytest.mark.gpu

MEMORY = 2 * 1024**3  # engine_main's kv_cache_memory_bytes


def test_kv_capacity_is_what_the_true_bytes_allow(multimodal_model: Path, tmp_path: Path) -> None:
    hidden = json.loads((multimodal_model / "config.json").read_text())["text_config"][
        "hidden_size"
    ]
    spec = dict(model=str(multimodal_model), prefix_caching=False, language_model_only=True)
    (tmp_path / "plain").mkdir()
    (tmp_path / "hs").mkdir()
    plain = run_engine({**spec, "ids": None, "batches": []}, tmp_path / "plain", "capacity-plain")
    ours = run_engine({**spec, "ids": IDS, "batches": []}, tmp_path / "hs", "capacity-extract")
    c0, c1 = plain["kv_cache_tokens"], ours["kv_cache_tokens"]
    assert c0 and c1, "no 'GPU KV cache size' line in the engine logs"
    per_token = len(IDS) * hidden * 2
    allowed = MEMORY / (MEMORY / c0 + per_token)
    ratio = c1 / allowed
    write_report(
        "kv-capacity",
        {
            "vllm": ours["vllm"],
            "plain_tokens": c0,
            "extraction_tokens": c1,
            "true_bytes_allow": int(allowed),
            "ratio": ratio,
            "plugin_lines": ours["plugin_lines"],
        },
    )
    print(f"[kv-capacity] plain {c0:,} extraction {c1:,} allowed {allowed:,.0f} ratio {ratio:.3f}")
    assert ratio >= 0.95
