"""host_copy: the pieces a file's copy is cut into, the window of pieces queued at once and the
variable that sizes them. The copies themselves need a GPU (tests/gpu/test_host_copy_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from speculators_hybrid import switches  # noqa: E402
from speculators_hybrid.vllm_patches import host_copy  # noqa: E402


@pytest.mark.parametrize("nbytes", [0, 1, 6, 4096, 10_000, 1 << 30])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64, torch.bool])
def test_pieces_cover_the_tensor_once_in_order(nbytes, dtype):
    src = (torch.arange(3 * 5 * 7 * 11) % 5).reshape(3, 5, 7, 11).to(dtype)
    dst = torch.zeros_like(src)
    count = 0
    for dst_piece, src_piece in host_copy.pieces(dst, src, nbytes):
        assert dst_piece.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr()
        if nbytes:
            assert src_piece.numel() * src.element_size() <= max(nbytes, src.element_size())
        assert not dst_piece.any()  # no element copied twice
        dst_piece.copy_(src_piece)
        count += 1
    assert torch.equal(dst, src)
    per_piece = max(1, nbytes // src.element_size()) if nbytes else src.numel()
    assert count == -(-src.numel() // per_piece)


def test_pieces_of_a_strided_or_empty_tensor_are_the_whole_tensor():
    src = torch.arange(24.0).reshape(4, 6).t()
    dst = torch.empty_like(src)
    assert [tuple(p[1].shape) for p in host_copy.pieces(dst, src, 8)] == [(6, 4)]
    empty = torch.empty(0, 5)
    assert len(list(host_copy.pieces(torch.empty_like(empty), empty, 8))) == 1


class Event:
    def __init__(self, log: list[str], name: int) -> None:
        self.log, self.name = log, name

    def record(self, stream: object) -> None:
        self.log.append(f"record {self.name}")

    def synchronize(self) -> None:
        self.log.append(f"wait {self.name}")


def test_the_window_waits_for_the_piece_queued_two_before():
    log: list[str] = []
    names = iter(range(10))
    window = host_copy.Window(2, lambda: Event(log, next(names)))
    for piece in range(5):
        window.before_piece()
        log.append(f"copy {piece}")
        window.after_piece(stream=None)
    assert log == [
        "copy 0", "record 0",
        "copy 1", "record 1",
        "wait 0", "copy 2", "record 0",
        "wait 1", "copy 3", "record 1",
        "wait 0", "copy 4", "record 0",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0), ("", 0), ("0", 0), ("16", 16 << 20), ("0.5", 1 << 19)],
)
def test_chunk_size_from_the_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(switches.COPY_CHUNK_MIB, raising=False)
    else:
        monkeypatch.setenv(switches.COPY_CHUNK_MIB, value)
    assert host_copy.chunk_bytes() == expected


@pytest.mark.parametrize("value", ["-1", "four", "nan", "inf", "1048576"])
def test_a_bad_chunk_size_says_what_to_set(monkeypatch, value):
    monkeypatch.setenv(switches.COPY_CHUNK_MIB, value)
    with pytest.raises(
        ValueError, match=f"{switches.COPY_CHUNK_MIB} must be a number of MiB from 0"
    ):
        host_copy.chunk_bytes()
