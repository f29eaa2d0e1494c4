"""Hybrid extraction runs on the V1 model runner (vLLM >= 0.29).

Why: from 0.29.0 a CUDA start picks Model Runner V2 (`vllm/v1/worker/gpu/`) for a hybrid
target with `extract_hidden_states` (0.22-0.28 refused both, so V1 ran). Every GPU proof of this
project (0.20.1, 0.24.0, 0.25.0) and every CPU test of the worker and scheduler (vLLM's
scheduler takes `use_v2_model_runner` too: V2 resumes preempted requests as new ones) is of
the V1 path; V2 has no GPU proof with a hybrid target yet.
How: `VllmConfig._get_v2_model_runner_unsupported_features` also names hidden-state extraction
from a hybrid model, so vLLM's own fallback logs "Model Runner V2 does not yet support ...;
using the V1 model runner instead" and every process (workers, scheduler) picks V1.
`VLLM_USE_V2_MODEL_RUNNER=1` still chooses V2: vLLM reads it before this list.
vLLM 0.34.0 removed the V1 model runner (`gpu_model_runner.py`) and this hook: there every
CUDA start runs V2, and so does hybrid extraction (no GPU proof yet).
Upstream: none; retire once V2 is proven on the GPU for hybrid extraction.
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import is_hybrid_extraction

FEATURE = "hidden-state extraction from a hybrid model"  # as in the diffs of patches/vllm


def _add_hybrid_extraction(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    unsupported = wrapped(*args, **kwargs)
    if is_hybrid_extraction(instance):
        unsupported = [*unsupported, FEATURE]
    return unsupported


PATCH = Patch(
    id="hybrid-extraction-on-model-runner-v1",
    project="vllm",
    versions=">=0.29,<0.34",
    fixed_upstream="none needed from 0.34.0 (vLLM removed the V1 model runner; V2 is the only one)",
    why=__doc__ or "",
    targets=(
        Target(
            "vllm.config.vllm",
            "VllmConfig._get_v2_model_runner_unsupported_features",
            _add_hybrid_extraction,
            # 0.29.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0
            (
                "56966fe7e79267e4",
                "5c8f0367cfbe1166",
                "310116b7d2df5b0a",
                "939fc9ff3b455ec9",
                "db23a0e4f7a5cb06",
            ),
        ),
    ),
)
