"""backup-tokens-without-sync: vLLM's own extraction proposer's
`prepare_next_token_ids_padded` (vLLM 0.20-0.21) on the CPU, with vLLM's InputBatch and request
states, stock and patched: the same next tokens and counts for sampled, rejected,
out-of-vocabulary and discarded requests.
That the patched method queues its copy without waiting is shown on the GPU
(tests/gpu/test_backup_tokens_gpu.py).
"""

from __future__ import annotations

import pytest
import torch
from conftest import PATCHED_VLLM, needs, set_shim

pytestmark = needs("backup-tokens-without-sync")

VOCAB = 1000
PROMPTS = {"a": [5, 6, 7], "b": [8, 9], "c": [10, 11, 12, 13], "d": [14]}


def batch_and_requests() -> tuple:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    batch = InputBatch(
        max_num_reqs=8,
        max_model_len=64,
        max_num_batched_tokens=64,
        device=torch.device("cpu"),
        pin_memory=False,
        vocab_size=VOCAB,
        block_sizes=[16],
        kernel_block_sizes=[16],
    )
    requests = {}
    for rid, prompt in PROMPTS.items():
        requests[rid] = CachedRequestState(
            req_id=rid,
            prompt_token_ids=prompt,
            mm_features=[],
            sampling_params=SamplingParams(max_tokens=1),
            generator=None,
            block_ids=([0],),
            num_computed_tokens=0,
            output_token_ids=[],
        )
        batch.add_request(requests[rid])
    return batch, requests


def next_tokens(on: bool, sampled: list[int], discarded: list[bool]) -> tuple:
    from vllm.v1.spec_decode.extract_hidden_states import ExtractHiddenStatesProposer

    batch, requests = batch_and_requests()
    set_shim(on)
    try:
        method = ExtractHiddenStatesProposer.prepare_next_token_ids_padded
        assert hasattr(method, "__wrapped__") is (on and not PATCHED_VLLM)  # the shim's, or vLLM's
        proposer = object.__new__(ExtractHiddenStatesProposer)  # the method reads no state
        tokens, counts = method(
            proposer, torch.tensor(sampled).view(-1, 1), requests, batch, torch.tensor(discarded)
        )
    finally:
        set_shim(True)
    return tokens.tolist(), counts.tolist(), tokens.dtype, counts.dtype


@pytest.mark.parametrize(
    ("sampled", "discarded"),
    [
        ([21, 22, 23, 24], [False] * 4),
        ([21, -1, VOCAB, 24], [False] * 4),  # rejected, out of the vocabulary
        ([21, 22, 23, 24], [False, True, False, True]),  # discarded (a partial prompt)
    ],
    ids=["sampled", "invalid", "discarded"],
)
def test_the_patched_method_gives_vllms_tokens_and_counts(sampled, discarded):
    stock = next_tokens(False, sampled, discarded)
    assert next_tokens(True, sampled, discarded) == stock
    tokens, counts = stock[:2]
    last = [prompt[-1] for prompt in PROMPTS.values()]  # the backup: each request's last token
    for i, (token, count) in enumerate(zip(tokens, counts, strict=True)):
        valid = 0 <= sampled[i] < VOCAB
        assert count == int(valid)
        assert token == (sampled[i] if valid and not discarded[i] else last[i])
