"""The RMSNorm of Qwen3.5 / Qwen3.6 / Qwen3-Next: `x / rms(x) * (1 + w)`, weight zero-centred.

Same operations, in the same order and precision, as transformers' `Qwen3_5RMSNorm`,
`Qwen3_5MoeRMSNorm` and `Qwen3NextRMSNorm` (normalise in float32, scale by `1 + w`, cast
back), so it gives their values bit for bit. Imported only inside a process that builds a
speculators model (it needs torch).
"""

from __future__ import annotations

import torch
from torch import nn


class OnePlusWeightRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))  # zero = unit gain, as in transformers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        out = out * (1.0 + self.weight.float())
        return out.type_as(x)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, gain=1+w"


def frozen_verifier_norm(dim: int, eps: float, like: torch.Tensor) -> OnePlusWeightRMSNorm:
    """A model's `verifier_norm`: on `like`'s device and dtype, its weight never trained
    (speculators' `load_verifier_weights` fills it from the verifier's final norm)."""
    norm = OnePlusWeightRMSNorm(dim, eps=eps).to(like.device, like.dtype)
    norm.weight.requires_grad_(False)
    return norm
