"""GPU: backup-tokens-without-sync. vLLM's extraction proposer (0.20-0.21) waits for the whole
step on the GPU when it builds its backup tokens; patched, it returns while the GPU still runs
the step, with the same tokens."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from speculators_hybrid.registry import Patcher  # noqa: E402
from speculators_hybrid.versions import installed  # noqa: E402
from speculators_hybrid.vllm_patches import backup_tokens  # noqa: E402

pytestmark = pytest.mark.gpu
if not backup_tokens.PATCH.needed_for(installed("vllm")):
    pytest.skip(f"vLLM {installed('vllm')} copies them without a wait", allow_module_level=True)

PROMPTS = {"a": [5, 6, 7], "b": [8, 9], "c": [10, 11, 12, 13]}


def call_behind_a_busy_gpu() -> tuple[list[int], list[int], bool]:
    """The method called while the GPU runs ~0.5 s of queued work; whether that work was still
    running when it returned."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.spec_decode.extract_hidden_states import ExtractHiddenStatesProposer
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    device = torch.device("cuda", torch.cuda.current_device())
    batch = InputBatch(8, 64, 64, device, True, 1000, [16], [16])
    requests = {}
    for rid, prompt in PROMPTS.items():
        params = SamplingParams(max_tokens=1)
        requests[rid] = CachedRequestState(rid, prompt, [], params, None, ([0],), 0, [])
        batch.add_request(requests[rid])
    sampled = torch.tensor([[21], [-1], [23]], device=device)
    discarded = torch.tensor([False, False, True], device=device)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU cycles: the step
    method = ExtractHiddenStatesProposer.prepare_next_token_ids_padded
    tokens, counts = method(
        object.__new__(ExtractHiddenStatesProposer), sampled, requests, batch, discarded
    )
    busy = not torch.cuda.current_stream().query()
    return tokens.tolist(), counts.tolist(), busy


def test_the_patched_proposer_does_not_wait_for_the_step() -> None:
    stock = call_behind_a_busy_gpu()
    assert not stock[2], "vLLM's own method no longer waits: the patch is not needed"
    patcher = Patcher(version_of=installed)
    patcher.apply([backup_tokens.PATCH])
    try:
        patched = call_behind_a_busy_gpu()
    finally:
        patcher.revert()
    assert patched[2], "the patched method waited for the GPU"
    assert patched[:2] == stock[:2] == ([21, 9, 13], [1, 0, 1])
