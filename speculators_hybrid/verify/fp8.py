"""The fp8 backend's format, both ways, in torch: how the trainer reads a file's values back
(`dequantize`) and what the writer would have stored for given states (`round_trip`).

The writer scales each token by its largest magnitude over every layer slot (scale = amax /
448, at least 1e-12) and stores `(x / scale)` as float8 e4m3 beside the float32 scales; the
trainer's reader multiplies in bfloat16. verify's fp8 floor is the model's own low-precision
forward passed through `round_trip`: the error that precision and quantisation alone give.
"""

from __future__ import annotations

import torch

STORED = torch.float8_e4m3fn
READ = torch.bfloat16  # the trainer's reader's dtype
SMALLEST_SCALE = 1e-12


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The values the trainer reads: stored values times their token's scale, in bfloat16."""
    return values.to(READ) * scales.to(READ)


def quantize(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 values, float32 scales [tokens, 1, ...]): one scale per token (dim 0)."""
    wide = states.float()
    largest = wide.abs().amax(dim=tuple(range(1, wide.dim())), keepdim=True)
    scales = (largest / torch.finfo(STORED).max).clamp(min=SMALLEST_SCALE)
    return (wide / scales).to(STORED), scales


def round_trip(states: torch.Tensor) -> torch.Tensor:
    """`states` as the trainer would read them from an fp8 file."""
    return dequantize(*quantize(states))
