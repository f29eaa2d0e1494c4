"""Prefill steps of a hybrid target skip the accepted-count copy and its wait (vLLM 0.20-0.23).

Why: with a speculative config (extraction runs one) and a hybrid target, vLLM copies each
step's accepted-token counts to the host after sampling, and the next step's input preparation
waits for that copy, that is for the whole previous step on the GPU, where async scheduling
would prepare step N+1 while step N runs. Extraction is all prefill. At the real size it gave
no gain side by side (benchmarks/results/README.md, the accepted-count patch), so the GPU's idle
gaps in extraction wait for something else; kept as upstream's behaviour from 0.24.0 on.
How: a step that scheduled no draft token samples one token per request, so every count it
copies is 1; where the host already holds 1 for every request of the batch the copy changes
nothing, so it is skipped (no copy, no event, nothing to wait for). Steps with draft tokens (a
request that decodes), a batch still holding another count, and prefix caching's state copies
(Mamba modes 'align' and 'all') run as vLLM wrote them.
Upstream: vLLM PR 45100 (0.24.0) no longer waits under async scheduling (non-align).
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target, argument

RUNNER = "vllm.v1.worker.gpu_model_runner"
STATE_COPIES = ("align", "all")  # Mamba cache modes whose update also copies states


def changes_nothing(runner: Any, output_token_ids: Any, scheduler_output: Any) -> bool:
    """True when vLLM's update would write 1 over 1 for every request and copy no state."""
    if runner.cache_config.mamba_cache_mode in STATE_COPIES:
        return False
    if scheduler_output.scheduled_spec_decode_tokens or output_token_ids.shape[-1] != 1:
        return False  # a draft token: counts of 1 or 2
    held = runner.input_batch.num_accepted_tokens_cpu[: output_token_ids.shape[0]]
    return bool((held == 1).all())


def _skip_in_prefill(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    tokens = argument(args, kwargs, 0, "output_token_ids")
    scheduler_output = argument(args, kwargs, 1, "scheduler_output")
    hybrid_spec = instance.speculative_config and instance.model_config.is_hybrid
    if hybrid_spec and changes_nothing(instance, tokens, scheduler_output):
        return None
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="no-accepted-count-wait-in-prefill",
    project="vllm",
    versions=">=0.20,<0.24",
    fixed_upstream="vLLM PR 45100, released in 0.24.0",
    why=__doc__ or "",
    targets=(
        Target(
            RUNNER,
            "GPUModelRunner._update_states_after_model_execute",
            _skip_in_prefill,
            ("9b493398da63197b", "4de829555ed47aa8"),  # 0.20.0-0.21.0, 0.22.0-0.23.0
        ),
    ),
)
