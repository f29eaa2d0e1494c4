"""benchmarks/copy_queue.py on the CPU: its pieces cover a tensor once (timing needs a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.copy_queue import pieces  # noqa: E402


@pytest.mark.parametrize("chunk_bytes", [0, 1000, 4096, 1 << 20])
def test_pieces_copy_the_whole_tensor_once(chunk_bytes):
    src = torch.arange(3 * 5 * 7, dtype=torch.int16).reshape(3, 5, 7).to(torch.bfloat16)
    dst = torch.zeros_like(src)
    parts = pieces(dst, src, chunk_bytes)
    for dst_piece, src_piece in parts:
        dst_piece.copy_(src_piece)
    assert torch.equal(dst, src)
    assert sum(p.numel() for p, _ in parts) == src.numel()
    assert all(p.numel() * 2 <= (chunk_bytes or src.numel() * 2) for p, _ in parts)
    assert len(parts) == (1 if chunk_bytes in (0, 1 << 20) else -(-src.numel() * 2 // chunk_bytes))
