"""How close a file must be to the model: a calibrated rule, per layer id.

Similarity of a row `a` to the truth `b` (both [hidden]):

    s(a, b) = 1 - |a - b|^2 / (2 |a| |b|) = cos(a, b) - (r - 1)^2 / (2 r),   r = |a| / |b|

It is the cosine when the norms agree and falls below it when they do not. The norm term is
needed: a state taken after the final norm points the same way as the one before it when the
norm's weights are uniform (Qwen3.5's `x * (1 + w)` with `w = 0`, as freshly initialised), so
its cosine is 1.0 while its scale is the norm's, not the residual stream's.

The truth is a float32 forward of the model on the file's own tokens. The floor is the same
model's forward in the dtype the server ran in (bf16 by default) against that truth: the error
a correct file is allowed by precision alone. A file of the fp8 backend is also quantised:
its floor is that low-precision forward stored as fp8 and read back as the trainer reads it
(verify/fp8.py), so the floor holds both errors, measured on the file's own tokens. Per id, with
e = 1 - (the worst token's s):

    e_file <= K * e_floor + EPS

K = 3: correct vLLM files of a full-width hybrid stay within about 1.1x of the floor, wrong ones
(a bad prefix-cache hit) around 100x above it; 3 leaves room for kernels, tensor parallelism
and short prompts that differ more, and stays far below the wrong files.
EPS = 1e-4: the allowance where the floor is zero (id 0, the embeddings, is a bf16 lookup
either way) or tiny (transformers' CPU path runs the Gated DeltaNet recurrence in float32,
vLLM's kernels do not); below the smallest floor above id 0 at full width.
docs/verify.md has the measurements behind both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

K = 3.0
EPS = 1e-4


def similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """s(a, b) along the last dim, in float32: [..., hidden] x2 -> [...]."""
    a, b = a.float(), b.float()
    denominator = 2 * a.norm(dim=-1) * b.norm(dim=-1)
    s = 1 - (a - b).pow(2).sum(dim=-1) / denominator.clamp_min(1e-30)
    # a zero row against a non-zero one has no similarity: the worst, as a NaN row is
    return torch.where((denominator == 0) & (s < 1), float("-inf"), s)


def limit(floor: float, k: float = K, eps: float = EPS) -> float:
    """The lowest similarity a file may have where the floor's worst token has `floor`."""
    return 1 - (k * (1 - floor) + eps)


@dataclass
class IdResult:
    """One layer id of one file: its worst token, and the floor it is held to."""

    layer_id: int
    similarity: float  # the file's worst token against float32
    token: int  # where
    floor: float  # the low-precision reference's worst token against float32
    limit: float
    unquantised: float | None = None  # fp8 files: the floor before the reference is stored

    @property
    def ok(self) -> bool:
        return self.similarity >= self.limit  # False for NaN

    @property
    def excess(self) -> float:
        """The file's error over the allowed one (> 1: fails); inf for NaN."""
        allowed = 1 - self.limit
        error = 1 - self.similarity
        return error / allowed if error == error else float("inf")


def compare(
    file: torch.Tensor,
    low: torch.Tensor,
    truth: torch.Tensor,
    layer_ids: list[int],
    k: float = K,
    eps: float = EPS,
    stored: torch.Tensor | None = None,
) -> list[IdResult]:
    """Per id: the file's and the floor's worst token against the truth ([tokens, ids, hidden]).
    `stored`: the low-precision reference as the file's format stores it (fp8), then the floor."""
    s_file = similarity(file.to(truth.device), truth)  # [tokens, ids]
    s_low = similarity(low, truth)
    s_floor = s_low if stored is None else similarity(stored, truth)
    lowest = -float("inf")  # NaN and zero rows count as the worst
    s_file = torch.nan_to_num(s_file, nan=lowest, neginf=lowest)
    results = []
    for slot, layer_id in enumerate(layer_ids):
        worst = int(s_file[:, slot].argmin())
        floor = float(s_floor[:, slot].min())
        unquantised = None if stored is None else float(s_low[:, slot].min())
        results.append(
            IdResult(
                layer_id,
                float(s_file[worst, slot]),
                worst,
                floor,
                limit(floor, k, eps),
                unquantised,
            )
        )
    return results
