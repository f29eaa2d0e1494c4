"""A request that ends before its prompt is computed writes no file (vLLM >= 0.24).

Why: from 0.24 vLLM's `ExampleHiddenStatesConnector` saves at `request_finished`, from the
blocks the request holds then, whatever made it finish. 1,000 requests through vLLM 0.25.0's
scheduler with aborts and preemptions (tests/cpu/test_reliability_load.py) showed two faults:
a request aborted while still waiting (a client that hangs up before its turn) raises
`KeyError` in `self._request_filenames.pop(req_id)` and stops the engine (0.24-0.30; 0.31
returns early there); and a request aborted in the middle of its prompt (chunked prefill), or
while preempted (its blocks freed), gets a save of rows that were never computed: a file of
another request's or no hidden states at a path nobody asked for.
How: before vLLM's `request_finished`: a request the connector never named a file for gets no
save (nothing to write, no blocks to hold); one whose computed tokens fall short of what the
file would hold (the prompt; with `include_output_tokens` every token but the last) gets none
either, its name dropped and its blocks freed at once. Whole prompts are saved as before.
Upstream: none yet (0.31.0 handles the never-scheduled case only).
"""

from __future__ import annotations

import logging
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches.file_names import CONNECTOR

logger = logging.getLogger("vllm.speculators_hybrid")


def tokens_to_save(request: Any) -> int:
    """How many tokens' hidden states the file would hold (as vLLM's request_finished picks)."""
    params = request.kv_transfer_params or {}
    if params.get("include_output_tokens", False):
        return len(request.all_token_ids) - 1
    return len(request.prompt_token_ids or ())


def _whole_prompts_only(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    request = argument(args, kwargs, 0, "request")
    req_id = request.request_id
    if req_id not in instance._request_filenames:  # never scheduled
        instance._pending_saves.pop(req_id, None)
        return False, None
    if request.num_computed_tokens < tokens_to_save(request):
        filename = instance._request_filenames.pop(req_id)
        logger.info(
            "speculators-hybrid: request %s ended after %d of %d tokens (%s): no file %s",
            req_id,
            request.num_computed_tokens,
            tokens_to_save(request),
            request.status.name,
            filename,
        )
        return False, None
    return wrapped(*args, **kwargs)


PATCH = Patch(
    id="hidden-states-whole-prompts-only",
    project="vllm",
    versions=">=0.24",
    fixed_upstream="none yet (0.31.0 returns early for a request never scheduled)",
    why=__doc__ or "",
    targets=(
        Target(
            CONNECTOR,
            "ExampleHiddenStatesConnector.request_finished",
            _whole_prompts_only,
            # 0.24.0-0.30.0; 0.31.0-0.33.0; 0.34.0 (token ids copied by a helper, same saves)
            ("f4b33ca43e5d612a", "afc7a566b47f232a", "c0bf25e4b0286257"),
        ),
    ),
)
