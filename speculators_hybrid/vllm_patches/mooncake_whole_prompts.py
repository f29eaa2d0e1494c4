"""A request ending before its prompt is computed puts no Mooncake sample (hs-connectors >= 0.8.1).

Why: hs-connectors' `MooncakeHiddenStatesConnector.request_finished` queues a put for every
request that finishes, whatever made it finish, from the blocks that hold its computed tokens,
sized for its whole prompt. Driven through vLLM 0.25.0's scheduler against a real store
(tests/cpu/test_mooncake_aborts.py), a request aborted in the middle of its prompt (chunked
prefill), or while preempted (no blocks), or before it was scheduled, gets either a full-size
sample under its key whose tail rows were never computed (the blocks it holds already cover the
prompt: the rest of it fits in the last one) or, where they do not, an error marker
(`<key>:error`) and a "Mooncake write failed" error in vLLM's log. Nobody reads or deletes
either: the key is the request's id, which vLLM makes unique per request, and an aborted
request returns no manifest to the trainer. They stay in the store until it evicts.
How: before hs-connectors' `request_finished`: a request whose computed tokens fall short of
what the sample would hold (the prompt; with `include_output_tokens` every token but the last)
gets no put and no manifest; its key is dropped. It still reports a delayed free, as the
connector does for every request: its worker reports every finished request as sent, and vLLM's
scheduler asserts that such a request still holds its blocks. Whole prompts put as before.
Upstream: none yet (hs-connectors 0.9.0).
"""

from __future__ import annotations

import logging
from typing import Any

from speculators_hybrid.registry import Patch, Target, argument
from speculators_hybrid.vllm_patches.whole_prompts import tokens_to_save

logger = logging.getLogger("vllm.speculators_hybrid")

MODULE = "hs_connectors.mooncake_hidden_states_connector"


def _whole_prompts_only(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    request = argument(args, kwargs, 0, "request")
    if request.num_computed_tokens >= tokens_to_save(request):
        return wrapped(*args, **kwargs)
    instance._request_keys.pop(request.request_id, None)
    logger.info(
        "speculators-hybrid: request %s ended after %d of %d tokens (%s): nothing put in "
        "the Mooncake store",
        request.request_id,
        request.num_computed_tokens,
        tokens_to_save(request),
        request.status.name,
    )
    return True, None  # freed when the worker reports it sent, as every request of this connector


PATCH = Patch(
    id="mooncake-whole-prompts-only",
    project="hs-connectors",
    versions=">=0.8.1",
    fixed_upstream="none yet",
    why=__doc__ or "",
    targets=(
        Target(
            MODULE,
            "MooncakeHiddenStatesConnector.request_finished",
            _whole_prompts_only,
            # 0.8.1 (a handle only); 0.9.0 (the transfer manifest)
            ("f362312886b113ec", "0730bd7f8849b201"),
        ),
    ),
)
