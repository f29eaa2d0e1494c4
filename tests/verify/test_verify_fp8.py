"""`verify` on files of hs-connectors' fp8 backend: written with its own quantiser, the way its
connector's `_write_tensors` writes them (float8 values beside `hidden_states_scales`), read as
its trainer-side reader reads them, and held to a floor measured on the model's own forward
quantised the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
fp8_utils = pytest.importorskip("hs_connectors.fp8_utils")

from conftest import IDS, Writer, tokens, verify_json, write  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from speculators_hybrid.verify import capture, fp8, rule  # noqa: E402
from speculators_hybrid.verify.files import Verifier  # noqa: E402

SCALES = fp8_utils.SCALES_KEY


def write_fp8(path: Path, prompt: list[int], states: torch.Tensor, **metadata: str) -> Path:
    """A file as hs-connectors' FP8HiddenStatesConnector writes it: its quantiser, then
    safetensors' `save_file` of the tensors with the values replaced and the scales added."""
    values, scales = fp8_utils.quantize_tensor_to_fp8(states)
    tensors = {"hidden_states": values, "token_ids": torch.tensor(prompt), SCALES: scales}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"layer_ids": json.dumps(IDS), **metadata})
    return path


def read_back(path: Path) -> torch.Tensor:
    """The hidden states speculators' trainer gets from the file (hs-connectors' FP8Transfer)."""
    from hs_connectors.transfer import FP8Transfer

    index = int(path.stem.removeprefix("hs_"))
    return FP8Transfer(path.parent).get_cached(index)["hidden_states"]


def test_the_format_is_hs_connectors_own(writer: Writer, tmp_path: Path) -> None:
    """verify's quantiser and reader give hs-connectors' bytes and its reader's values."""
    prompt = tokens(3, 40)
    states = writer.states(prompt, IDS)
    values, scales = fp8.quantize(states)
    theirs, their_scales = fp8_utils.quantize_tensor_to_fp8(states)
    assert values.dtype == theirs.dtype == torch.float8_e4m3fn
    assert torch.equal(values.view(torch.uint8), theirs.view(torch.uint8))
    assert torch.equal(scales, their_scales) and list(scales.shape) == [40, 1, 1]
    path = write_fp8(tmp_path / "hs_0.safetensors", prompt, states)
    read = read_back(path)
    assert read.dtype == torch.bfloat16
    assert torch.equal(fp8.round_trip(states), read)
    assert not torch.equal(values.to(torch.bfloat16), read)  # the scales matter


@pytest.fixture(scope="module")
def fp8_run(
    model_dir: Path, writer: Writer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict]:
    """Good fp8 files of three lengths and bad ones, verified once (JSON)."""
    folder = tmp_path_factory.mktemp("fp8")
    for i, n in enumerate((1, 47, 150)):
        prompt = tokens(i, n)
        write_fp8(folder / f"hs_{i}.safetensors", prompt, writer.states(prompt, IDS))
    prompt = tokens(7, 120)
    good = writer.states(prompt, IDS)
    bad = {
        "hs_10": writer.states(prompt, [i - 1 for i in IDS]),  # a layer off by one
        "hs_11": writer.states(tokens(99, 120), IDS),  # another prompt's rows
        "hs_12": writer.states(prompt, IDS, post_norm=True),
        # about 4e-3 from the truth: over the fp8 allowance (about 2e-3), under a loose 1e-2
        "hs_13": good + 0.09 * _rms(good) * _noise(good.shape),
    }
    for name, states in bad.items():
        write_fp8(folder / f"{name}.safetensors", prompt, states.to(torch.bfloat16))
    code, doc, err = verify_json(folder, "--model", model_dir)
    return {"code": code, "files": {Path(f["path"]).stem: f for f in doc["files"]}, "doc": doc}


def _rms(states: torch.Tensor) -> torch.Tensor:
    """Each (token, slot) vector's root mean square, [tokens, slots, 1]."""
    return states.float().pow(2).mean(dim=-1, keepdim=True).sqrt()


def _noise(shape: torch.Size) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(5))


def test_good_fp8_files_pass_and_say_fp8(fp8_run: dict) -> None:
    """Read with their scales, correct fp8 files pass, about as far from the truth as the
    quantised floor; that floor is coarser than bf16's and the limit follows it."""
    assert fp8_run["doc"]["summary"]["backends"] == {"fp8": 7}
    for name in ("hs_0", "hs_1", "hs_2"):
        f = fp8_run["files"][name]
        assert f["ok"] and f["backend"] == "fp8" and f["dtype"] == "bfloat16", f
        for r in f["per_id"]:
            error, floor = 1 - r["similarity"], 1 - r["floor"]
            assert error <= 1.3 * floor, (name, r)
            assert floor > 1.5 * (1 - r["floor_unquantised"]), (name, r)  # fp8 costs more
            assert 1 - r["limit"] == pytest.approx(rule.K * floor + rule.EPS, rel=1e-6)


@pytest.mark.parametrize("name", ["hs_10", "hs_11", "hs_12", "hs_13"])
def test_bad_fp8_files_fail(fp8_run: dict, name: str) -> None:
    f = fp8_run["files"][name]
    assert fp8_run["code"] == 1 and not f["ok"] and f["backend"] == "fp8", f
    if name == "hs_13":  # fails on the calibrated margin, where a loose constant would pass it
        assert all(0 < 1 - r["similarity"] < 1e-2 for r in f["per_id"]), f
        assert not any(r["ok"] for r in f["per_id"]), f


def test_the_fp8_floor_is_measured_on_the_models_forward(
    reference, writer: Writer, tmp_path: Path
) -> None:
    """Per id, the floor is the model's bf16 forward quantised by hs-connectors and read back by
    its reader, against float32: recomputed here from their functions, not from verify's."""
    prompt = tokens(4, 64)
    path = write_fp8(tmp_path / "hs_0.safetensors", prompt, writer.states(prompt, IDS))
    result = Verifier(reference).verify(path)
    assert result.ok and result.backend == "fp8", result.reasons()
    truth = capture.hidden_states(reference, prompt, IDS, torch.float32)
    low = capture.hidden_states(reference, prompt, IDS, torch.bfloat16)
    stored = fp8_utils.dequantize_fp8_tensor(*fp8_utils.quantize_tensor_to_fp8(low))
    floors = rule.similarity(stored, truth).min(dim=0).values.tolist()
    unquantised = rule.similarity(low, truth).min(dim=0).values.tolist()
    assert [r.floor for r in result.ids] == pytest.approx(floors, abs=1e-7)
    assert [r.unquantised for r in result.ids] == pytest.approx(unquantised, abs=1e-7)


def test_fp8_rounded_values_in_a_bf16_file_fail(writer: Writer, reference, tmp_path) -> None:
    """The fp8 allowance is the fp8 backend's alone: a `file` backend's file holding values
    rounded through fp8 is held to the bf16 floor and fails where fp8 costs most (id 1)."""
    prompt = tokens(6, 64)
    rounded = fp8.round_trip(writer.states(prompt, IDS))
    result = Verifier(reference).verify(write(tmp_path / "hs_0.safetensors", prompt, rounded))
    assert result.backend == "file" and not result.ok
    assert 1 in {r.layer_id for r in result.ids if not r.ok}


def test_malformed_fp8_files_fail_in_one_line(writer: Writer, model_dir: Path, tmp_path) -> None:
    prompt = tokens(8, 16)
    states = writer.states(prompt, IDS)
    values, scales = fp8_utils.quantize_tensor_to_fp8(states)
    ids = torch.tensor(prompt)
    cases = {
        "no_scales": {"hidden_states": values, "token_ids": ids},
        "flat_scales": {"hidden_states": values, "token_ids": ids, SCALES: scales.flatten()},
        "bf16_with_scales": {"hidden_states": states, "token_ids": ids, SCALES: scales},
    }
    for name, tensors in cases.items():
        save_file(tensors, str(tmp_path / f"{name}.safetensors"))
    write_fp8(tmp_path / "says_file.safetensors", prompt, states, hidden_states_backend="file")
    code, doc, err = verify_json(tmp_path, "--model", model_dir, "--ids", *map(str, IDS))
    assert code == 1
    reasons = {Path(f["path"]).stem: f["reasons"] for f in doc["files"]}
    assert reasons == {
        "bf16_with_scales": [
            "hidden_states_scales beside BF16 hidden_states: the fp8 backend stores F8_E4M3"
        ],
        "flat_scales": [
            "hidden_states_scales has shape [16], expected [16, 1, 1] (one scale per token)"
        ],
        "no_scales": [
            "F8_E4M3 hidden_states without hidden_states_scales: the values cannot be scaled "
            "back (the fp8 backend writes both); write the file again"
        ],
        "says_file": [
            "its metadata says the file backend wrote it, but its tensors are the fp8 backend's"
        ],
    }
    for name in reasons:  # one line each, naming the file
        lines = [line for line in err.splitlines() if f"{name}.safetensors" in line]
        assert len(lines) == 1 and lines[0].startswith("FAILED "), err
