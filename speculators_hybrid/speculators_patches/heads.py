"""A verifier lm_head that applies the verifier's own logit scale after the matmul.

`ScaledLogitsHead` is an `nn.Linear` (same `weight` parameter, same state-dict key) whose
output is then divided by a divisor (Granite's `logits_scaling`) or multiplied by a multiplier
(Falcon-H1's `lm_head_multiplier`): the operations, order and dtype of the transformers models'
own forward (`lm_head(h)`, then `/ logits_scaling` or `* lm_head_multiplier` by a Python
float), so its values equal theirs bit for bit. Imported only inside a process that builds a
speculators model (it needs torch).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Op = Literal["divide", "multiply"]


class ScaledLogitsHead(nn.Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        op: Op,
        factor: float,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if op not in ("divide", "multiply"):
            raise ValueError(f"op must be 'divide' or 'multiply', not {op!r}")
        self.op: Op = op
        self.factor = float(factor)

    @classmethod
    def wrapping(cls, head: nn.Linear, op: Op, factor: float) -> ScaledLogitsHead:
        """A scaled head holding `head`'s own parameters (no copy, no new allocation)."""
        new = cls(
            head.in_features,
            head.out_features,
            op,
            factor,
            bias=head.bias is not None,
            device="meta",
        )
        new.weight = head.weight
        if head.bias is not None:
            new.bias = head.bias
        for flag in ("_is_hf_initialized",):  # transformers' "do not re-initialise" mark
            if flag in vars(head):
                setattr(new, flag, vars(head)[flag])
        new.train(head.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        if self.op == "divide":
            return logits / self.factor
        return logits * self.factor

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, then {self.op} by {self.factor}"
