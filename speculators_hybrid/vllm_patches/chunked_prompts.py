"""Chunked prefill and prefix-cache hits for hybrid extraction on vLLM 0.22-0.23.

Why: vLLM 0.22-0.23's `ExampleHiddenStatesConnector` reads a new request's hidden states in the
forward of its first step, through that step's slot mapping, for as many tokens as the prompt
has. A prompt prefilled in several chunks would get rows of the other requests of that step, so
`VllmConfig` refuses chunked prefill with it; after a prefix-cache hit the file holds only the
newly computed tokens (vLLM issue 44485). Without chunked prefill a hybrid model cannot cache
prefixes (Mamba "align" mode needs it), and every prompt must fit one step.
How: for `extract_hidden_states` on a hybrid model with chunked prefill on (vLLM's default),
before vLLM builds its config, our connector (connector.py, the same file contract) is named in
place of the stock one, as keep-hma-for-extraction does on 0.20-0.21; with
`--no-enable-chunked-prefill` the stock one stays. Ours writes each file once, in the step that
completes the prompt, from the request's whole hidden-group block table, so chunks and cached
tokens are read where they were written. vLLM's refusal names the stock class only.
Upstream: vLLM 0.24.0 (the connector reads the whole block table when the request finishes;
chunked prefill allowed again). Remove with 0.22-0.23 support.
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target
from speculators_hybrid.vllm_patches._targets import CONFIG, POST_INIT
from speculators_hybrid.vllm_patches.hma_config import name_our_connector


def _before_post_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    scheduler = getattr(instance, "scheduler_config", None)
    if getattr(scheduler, "enable_chunked_prefill", False):  # where vLLM would refuse
        name_our_connector(instance, "prompts in several chunks and prefix-cache hits")
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="hidden-states-chunked-prompts",
    project="vllm",
    versions=">=0.22,<0.24",
    fixed_upstream="vLLM 0.24.0 (the connector reads the whole block table; chunked prefill on)",
    why=__doc__ or "",
    targets=(
        Target(
            CONFIG,
            "VllmConfig.__post_init__",
            _before_post_init,
            POST_INIT,
        ),
    ),
)
