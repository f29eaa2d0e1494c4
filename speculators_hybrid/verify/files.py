"""One hidden-state file against the model: contract, layer ids, then the calibrated rule."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from speculators_hybrid.extraction import id_problems, speculators_default
from speculators_hybrid.hidden_files import BACKEND_KEY, SCALES, backend, format_problems
from speculators_hybrid.safetensors_file import DTYPE
from speculators_hybrid.verify import capture, fp8, rule

TRUTH = torch.float32
DTYPES = capture.DTYPES


@dataclass
class FileResult:
    path: str
    layer_ids: list[int] | None = None
    ids_from: str | None = None  # "--ids", "metadata" or "speculators' default"
    tokens: int | None = None
    dtype: str | None = None  # the floor's: the dtype the server is taken to have run in
    backend: str | None = None  # "file" or "fp8": whose format the file is in
    errors: list[dict[str, str]] = field(default_factory=list)
    ids: list[rule.IdResult] = field(default_factory=list)
    seconds: float = 0.0

    def error(self, code: str, message: str) -> None:
        self.errors.append({"code": code, "message": message})

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.ids) and all(r.ok for r in self.ids)

    def worst(self) -> rule.IdResult | None:
        return max(self.ids, key=lambda r: r.excess, default=None)

    def reasons(self) -> list[str]:
        found = [e["message"] for e in self.errors]
        for r in self.ids:
            if not r.ok and r.similarity == -float("inf"):
                found.append(f"id {r.layer_id}: token {r.token} is all zeros or not finite")
            elif not r.ok:
                found.append(
                    f"id {r.layer_id}: similarity {r.similarity:.5f} at token {r.token} < limit "
                    f"{r.limit:.5f} (floor {r.floor:.5f})"
                )
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "layer_ids": self.layer_ids,
            "ids_from": self.ids_from,
            "tokens": self.tokens,
            "dtype": self.dtype,
            "backend": self.backend,
            "errors": self.errors,
            "per_id": [
                {
                    "id": r.layer_id,
                    "ok": r.ok,
                    "similarity": finite(r.similarity),
                    "token": r.token,
                    "floor": finite(r.floor),
                    "floor_unquantised": None if r.unquantised is None else finite(r.unquantised),
                    "limit": finite(r.limit),
                }
                for r in self.ids
            ],
            "reasons": self.reasons(),
            "seconds": round(self.seconds, 3),
        }


def safetensors_name(tensor: torch.Tensor) -> str:
    return DTYPE.get(str(tensor.dtype), str(tensor.dtype))


def finite(value: float) -> float | None:
    """`value`, or None for NaN and Inf (JSON has neither)."""
    return value if value == value and abs(value) != float("inf") else None


def metadata_ids(raw: str | None) -> list[int] | None:
    """`layer_ids` from a file's provenance metadata (a JSON list of ints), or None."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return value
    return None


class Verifier:
    """The model, loaded once, and the per-file check. `ids`: layer ids for every file (else
    each file's metadata, else speculators' default); `dtype`: the server's (None: each file's
    own dtype)."""

    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        device: str = "cpu",
        dtype: str | None = None,
        ids: list[int] | None = None,
    ) -> None:
        if isinstance(model, torch.nn.Module):
            self.model = model.eval()
        else:
            self.model = capture.load_model(model, device)
        self.n = capture.num_layers(self.model)
        self.vocab, self.hidden = self.model.get_input_embeddings().weight.shape
        self.dtype = dtype
        self.ids = ids

    def _layer_ids(self, metadata: dict[str, str], slots: int, result: FileResult) -> None:
        if self.ids is not None:
            ids, source = self.ids, "--ids"
        elif (found := metadata_ids(metadata.get("layer_ids"))) is not None:
            ids, source = found, "metadata"
        else:
            ids, source = speculators_default(self.n), "speculators' default"
        result.layer_ids, result.ids_from = list(ids), source
        problems = id_problems(ids, self.n)
        if problems:
            result.error(
                "bad_ids",
                f"layer ids {ids} (from {source}) do not fit the model's {self.n} decoder layers: "
                f"{'; '.join(problems)}",
            )
        elif len(ids) != slots:
            hint = "" if source == "--ids" else "; give the server's ids with --ids"
            result.error(
                "ids_mismatch",
                f"the file has {slots} layer slots, but {len(ids)} layer ids {ids} come from "
                f"{source}{hint}",
            )

    def _read(self, path: str, result: FileResult) -> tuple[torch.Tensor, list[int]] | None:
        """The file's hidden states and tokens if they fit the contract and the model."""
        from safetensors import safe_open

        try:
            with safe_open(path, framework="pt") as handle:
                metadata = dict(handle.metadata() or {})
                keys = set(handle.keys())
                missing = sorted({"hidden_states", "token_ids"} - keys)
                if missing:
                    result.error("missing_key", f"no {', '.join(missing)} (has {sorted(keys)})")
                    return None
                tokens = handle.get_tensor("token_ids")
                states = handle.get_tensor("hidden_states")
                scales = handle.get_tensor(SCALES) if SCALES in keys else None
        except Exception as exc:  # noqa: BLE001 (truncated, not safetensors, unreadable)
            result.error("unreadable", f"{type(exc).__name__}: {exc}")
            return None
        if tokens.dim() != 1 or tokens.dtype != torch.int64:
            result.error("bad_tokens", f"token_ids is {tokens.dtype} {list(tokens.shape)}")
            return None
        result.tokens = len(tokens)
        if states.dim() != 3 or not states.is_floating_point():
            result.error("bad_shape", f"hidden_states is {states.dtype} {list(states.shape)}")
            return None
        stored = safetensors_name(states)
        result.backend = backend(keys, stored)
        layout = (safetensors_name(scales), list(scales.shape)) if scales is not None else None
        problems = format_problems(
            keys, (stored, list(states.shape)), layout, metadata.get(BACKEND_KEY)
        )
        for problem in problems:
            result.error("bad_format", problem)
        if problems:
            return None
        if scales is not None:  # as the trainer reads them
            states = fp8.dequantize(states, scales)
        rows, slots, width = states.shape
        if rows != len(tokens):
            result.error(
                "length_mismatch",
                f"hidden_states has {rows} token rows, token_ids {len(tokens)} tokens (truncated)",
            )
        if width != self.hidden:
            result.error(
                "width_mismatch",
                f"hidden_states is {width} wide, the model's hidden size is {self.hidden}",
            )
        if 0 in states.shape:
            result.error("empty", f"hidden_states has shape {list(states.shape)}")
        elif len(tokens) and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.vocab:
            result.error(
                "bad_tokens", f"token ids outside the model's vocabulary [0, {self.vocab})"
            )
        self._layer_ids(metadata, slots, result)
        name = str(states.dtype).removeprefix("torch.")
        result.dtype = self.dtype or (
            name if name in capture.DTYPES and scales is None else "bfloat16"
        )
        return (states, tokens.tolist()) if not result.errors else None

    def verify(self, path: str | Path) -> FileResult:
        """Everything about one file; problems are reported, never raised."""
        start = time.monotonic()
        result = FileResult(str(path))
        read = self._read(str(path), result)
        if read is not None:
            states, tokens = read
            ids = result.layer_ids or []
            try:
                truth = capture.hidden_states(self.model, tokens, ids, TRUTH)
                low = capture.hidden_states(self.model, tokens, ids, DTYPES[result.dtype or ""])
                # fp8: the floor is the low-precision forward stored and read back as the
                # writer and the trainer do (one scale per token over every slot of the file)
                stored = fp8.round_trip(low) if result.backend == "fp8" else None
                result.ids = rule.compare(states, low, truth, ids, stored=stored)
            except (RuntimeError, ValueError) as exc:  # out of memory, a kernel's refusal, ...
                first = (str(exc).strip().splitlines() or [""])[0]
                result.error("forward_failed", f"the model's forward failed: {first}")
        result.seconds = time.monotonic() - start
        return result
