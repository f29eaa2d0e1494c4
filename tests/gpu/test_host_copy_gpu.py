"""GPU: the paced host copies of host_copy.py give the bytes the GPU holds, after what the step
queued before them, however the tensors are cut, while the GPU rows are freed and reused."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from speculators_hybrid.vllm_patches import host_copy  # noqa: E402

pytestmark = pytest.mark.gpu


def gathered(seed: int) -> dict[str, torch.Tensor]:
    """A file's tensors as the step leaves them: computed just before, on the current stream."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    big = torch.randn(4096, 4096, device="cuda", generator=g)
    for _ in range(20):  # keep the stream busy so a copy not ordered after this reads garbage
        big = torch.tanh(big @ big / 64)  # bounded: no inf, no NaN (NaN != NaN)
    rows = big[:1000, :512].to(torch.bfloat16)
    return {
        "hidden_states": rows.reshape(250, 4, 512),
        "token_ids": torch.arange(250, device="cuda") + seed,
        "strided": rows.t()[:, :7],  # not contiguous: copied whole
        "on_host": torch.tensor([seed]),  # already on the host: passed through
    }


@pytest.mark.parametrize("chunk", [4096, 1 << 20, 1 << 30])
def test_paced_copies_are_the_gpu_bytes(chunk: int) -> None:
    copier = host_copy.PacedCopier(torch.device("cuda", torch.cuda.current_device()), chunk)
    expected, futures = [], []
    for seed in range(6):
        tensors = gathered(seed)
        torch.cuda.current_stream().synchronize()
        expected.append({k: v.cpu() for k, v in tensors.items()})
        tensors = gathered(seed)  # again, not synchronized: the copy must wait for it
        futures.append(copier.submit(tensors))
        del tensors
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda").fill_(255)  # reuse freed memory
    for want, future in zip(expected, futures, strict=True):
        host, ready = future.result(timeout=60)
        ready.synchronize()
        assert host.keys() == want.keys()
        for key, tensor in want.items():
            assert host[key].device.type == "cpu"
            assert torch.equal(host[key], tensor), key
        assert host["hidden_states"].is_pinned()
