"""Extraction's proposer builds its backup tokens without waiting for the GPU (vLLM 0.20-0.21).

Why: after each step's sampling, `ExtractHiddenStatesProposer.prepare_next_token_ids_padded`
builds each request's backup token as `torch.tensor(list, device=cuda)`: a copy from pageable
memory, which makes the host wait until the whole step has run on the GPU. Async scheduling
would have the host prepare step N+1 meanwhile; instead the GPU finds an empty queue at each
step's start and idles while the host prepares it: at the real size the GPU is as busy in
extraction as in plain prefill but idles longer, in the next step's input preparation, while
the host waits inside this call (benchmarks/results/README.md, plain and extraction profiled
side by side). Patched, the call returns while the GPU still runs the step
(tests/gpu/test_backup_tokens_gpu.py), and extraction with files complete comes closer to plain
prefill than with the patch off on the same machine (benchmarks/results/README.md,
`backup-tokens-without-sync` end to end).
How: the same tokens, from pinned memory, copied without a wait (the caching host allocator
keeps the buffer until its copy is done); the rest of the method is its contract (a sampled
token in the vocabulary counts 1 and is the next token unless the request is discarded; else
the backup).
Upstream: vLLM 0.22.0 (the proposer keeps a pinned buffer, copied without a wait).
"""

from __future__ import annotations

from typing import Any

from speculators_hybrid.registry import Patch, Target, argument

PROPOSER = "vllm.v1.spec_decode.extract_hidden_states"


def backup_tokens(requests: dict, batch: Any, device: Any) -> Any:
    """Each request's last token before any draft, on `device`, queued without a wait."""
    import torch

    count = batch.num_reqs
    last = (batch.num_tokens_no_spec[:count] - 1).tolist()
    ids = [requests[batch.req_ids[i]].get_token_id(last[i]) for i in range(count)]
    pinned = device.type == "cuda"
    host = torch.tensor(ids, dtype=torch.int32, pin_memory=pinned)
    return host.to(device, non_blocking=pinned)


def _next_tokens(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    import torch

    sampled = argument(args, kwargs, 0, "sampled_token_ids")[:, 0]
    batch = argument(args, kwargs, 2, "gpu_input_batch")
    discarded = argument(args, kwargs, 3, "discard_request_mask")
    backup = backup_tokens(argument(args, kwargs, 1, "requests"), batch, sampled.device)
    valid = (sampled >= 0) & (sampled < batch.vocab_size)
    keep = valid & ~discarded[: batch.num_reqs]
    return torch.where(keep, sampled.to(torch.int32), backup), valid.to(torch.int32)


PATCH = Patch(
    id="backup-tokens-without-sync",
    project="vllm",
    versions=">=0.20,<0.22",
    fixed_upstream="vLLM 0.22.0 (a pinned buffer, copied without a wait)",
    why=__doc__ or "",
    targets=(
        Target(
            PROPOSER,
            "ExtractHiddenStatesProposer.prepare_next_token_ids_padded",
            _next_tokens,
            ("4958ba96238d97d9",),  # 0.20.0-0.21.0
        ),
    ),
)
