"""`safetensors_file.write`, the writer of every hidden-state file, read back by safetensors itself
(what speculators' trainer uses) and by our numpy reader (what `check` uses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from speculators_hybrid import safetensors_file  # noqa: E402

META = {"writer": "speculators-hybrid", "layer_ids": "[2, 32, 61, 64]"}


def every_dtype() -> dict[str, torch.Tensor]:
    base = torch.arange(-6, 6, dtype=torch.float32).reshape(3, 4)
    tensors = {}
    for name in safetensors_file.DTYPE:
        dtype = getattr(torch, name.removeprefix("torch."))
        if dtype == torch.bool:
            tensors[name] = base > 0
        elif not dtype.is_floating_point and not dtype.is_signed:
            tensors[name] = base.abs().to(dtype)
        else:
            tensors[name] = base.to(dtype)
    return tensors


def test_every_dtype_reads_back_with_safetensors(tmp_path):
    tensors = every_dtype()
    path = str(tmp_path / "f.safetensors")
    safetensors_file.write(path, tensors, META)
    back = load_file(path)
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype, name
        assert torch.equal(back[name].view(torch.uint8), tensor.view(torch.uint8)), name
    with safe_open(path, "pt") as f:
        assert f.metadata() == META


def test_hidden_state_file_reads_back_with_our_reader(tmp_path):
    hidden = torch.randn(2048, 4, 64).to(torch.bfloat16)
    ids = torch.arange(2048, dtype=torch.int64)
    path = str(tmp_path / "hs_0.safetensors")
    safetensors_file.write(path, {"hidden_states": hidden, "token_ids": ids}, META)
    with safetensors_file.SafetensorsFile(path) as f:
        assert f.metadata() == META
        rows = f.get_slice("hidden_states")[100:103]
        assert (rows == hidden[100:103].float().numpy()).all()
        assert (f.get_tensor("token_ids") == ids.numpy()).all()


def test_scalar_empty_and_strided_tensors(tmp_path):
    strided = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2]  # not contiguous
    tensors = {
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "strided": strided,
    }
    path = str(tmp_path / "f.safetensors")
    safetensors_file.write(path, tensors)  # no metadata: no __metadata__ entry
    back = load_file(path)
    assert back["scalar"].shape == () and back["scalar"].item() == 7
    assert back["empty"].shape == (0, 4)
    assert torch.equal(back["strided"], strided)
    with safe_open(path, "pt") as f:
        assert not f.metadata()


def test_the_data_starts_8_byte_aligned(tmp_path):
    path = tmp_path / "f.safetensors"
    safetensors_file.write(str(path), {"x": torch.ones(3, dtype=torch.int8)}, {"k": "v"})
    length = int.from_bytes(path.read_bytes()[:8], "little")
    assert length % 8 == 0
    assert path.stat().st_size == 8 + length + 3


def test_a_dtype_safetensors_lacks_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "f.safetensors"
    with pytest.raises(ValueError, match="complex64"):
        safetensors_file.write(str(path), {"z": torch.zeros(2, dtype=torch.complex64)})
    assert not path.exists()


def test_a_contiguous_cpu_tensor_is_written_from_its_own_memory():
    hidden = torch.randn(16, 4, 8).to(torch.bfloat16)
    raw, owner = safetensors_file._raw(hidden)
    assert owner is hidden and raw.nbytes == hidden.numel() * 2
    assert bytes(raw) == hidden.view(torch.uint8).numpy().tobytes()
    strided = hidden[:, ::2]
    raw, owner = safetensors_file._raw(strided)  # copied first; the copy is kept alive
    assert owner is not strided
    assert bytes(raw) == strided.contiguous().view(torch.uint8).numpy().tobytes()


def test_a_write_the_kernel_takes_in_parts_is_finished(tmp_path, monkeypatch):
    import os

    real, calls = os.writev, []

    def at_most_1000_bytes(fd, buffers):
        calls.append(len(buffers))
        return real(fd, [buffers[0][:1000]])  # part of the first buffer only

    monkeypatch.setattr(os, "writev", at_most_1000_bytes)
    tensors = {"hidden_states": torch.randn(300, 4, 8).to(torch.bfloat16), "ids": torch.arange(5)}
    path = str(tmp_path / "f.safetensors")
    safetensors_file.write(path, tensors, META)
    assert len(calls) > 3
    back = load_file(path)
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
