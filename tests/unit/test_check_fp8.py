"""`speculators-hybrid check` on files of hs-connectors' fp8 backend, written with its own
quantiser the way its connector's `_write_tensors` writes them (float8 values beside
`hidden_states_scales`): good ones pass and say fp8, malformed ones fail in one line."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
fp8_utils = pytest.importorskip("hs_connectors.fp8_utils")
from safetensors.torch import save_file  # noqa: E402

from speculators_hybrid import check  # noqa: E402

TOKENS, IDS, HIDDEN = 12, 4, 16
SCALES = fp8_utils.SCALES_KEY


def states(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(TOKENS, IDS, HIDDEN, generator=gen).to(torch.bfloat16)


def write_fp8(path, hs=None, metadata=None, **change) -> str:
    """The fp8 connector's file: its quantiser's values and scales; `change` replaces or (with
    False) drops tensors."""
    values, scales = fp8_utils.quantize_tensor_to_fp8(states() if hs is None else hs)
    tensors = {"hidden_states": values, "token_ids": torch.arange(TOKENS), SCALES: scales}
    tensors.update(change)
    save_file({k: v for k, v in tensors.items() if v is not False}, str(path), metadata=metadata)
    return str(path)


def test_fp8_files_pass_and_name_their_backend(tmp_path, capsys):
    for i in range(2):
        write_fp8(tmp_path / f"hs_{i}.safetensors", states(i))
    code = check.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "  backend              fp8 (2)" in out and "dtype                F8_E4M3 (2)" in out
    check.main([str(tmp_path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["backends"] == {"fp8": 2}
    assert [f["backend"] for f in doc["files"]] == ["fp8", "fp8"]


def test_bf16_files_are_the_file_backends(tmp_path):
    path = tmp_path / "hs_0.safetensors"
    save_file({"hidden_states": states(), "token_ids": torch.arange(TOKENS)}, str(path))
    report = check.check_file(str(path))
    assert report.ok and report.backend == "file"


def _scales(value: float, token: int = 3):
    scales = fp8_utils.quantize_tensor_to_fp8(states())[1].clone()
    scales[token] = value
    return scales


MALFORMED = {
    "no_scales": (
        {SCALES: False},
        "bad_format",
        "F8_E4M3 hidden_states without hidden_states_scales: the values cannot be scaled back "
        "(the fp8 backend writes both); write the file again",
    ),
    "flat_scales": (
        {SCALES: torch.ones(TOKENS)},
        "bad_format",
        "hidden_states_scales has shape [12], expected [12, 1, 1] (one scale per token)",
    ),
    "per_slot_scales": (
        {SCALES: torch.ones(TOKENS, IDS, 1)},
        "bad_format",
        "hidden_states_scales has shape [12, 4, 1], expected [12, 1, 1] (one scale per token)",
    ),
    "short_scales": (
        {SCALES: torch.ones(TOKENS - 1, 1, 1)},
        "bad_format",
        "hidden_states_scales has shape [11, 1, 1], expected [12, 1, 1] (one scale per token)",
    ),
    "int_scales": (
        {SCALES: torch.ones(TOKENS, 1, 1, dtype=torch.int32)},
        "bad_format",
        "hidden_states_scales is I32, expected F32",
    ),
    "bf16_with_scales": (
        {"hidden_states": states(), SCALES: torch.ones(TOKENS, 1, 1)},
        "bad_format",
        "hidden_states_scales beside BF16 hidden_states: the fp8 backend stores F8_E4M3",
    ),
    "zero_scale": (
        {SCALES: _scales(0.0)},
        "bad_scales",
        "1 scales are not finite and positive (first at tokens [3])",
    ),
    "negative_scale": (
        {SCALES: _scales(-0.01, 5)},
        "bad_scales",
        "1 scales are not finite and positive (first at tokens [5])",
    ),
    "nan_scale": (
        {SCALES: _scales(float("nan"), 7)},
        "bad_scales",
        "1 scales are not finite and positive (first at tokens [7])",
    ),
    "huge_scale": (
        {SCALES: _scales(1e36, 2)},
        "bad_scales",
        "1 scales overflow bfloat16 when applied (first at tokens [2])",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_fp8_files_fail_in_one_line(case, tmp_path, capsys):
    change, code, message = MALFORMED[case]
    path = write_fp8(tmp_path / f"{case}.safetensors", **change)
    report = check.check_file(path)
    assert [(e["code"], e["message"]) for e in report.errors] == [(code, message)]
    assert check.main([path]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if "FAILED" in line]
    assert failed == [f"FAILED {path}: {message}"]


def test_the_metadata_must_agree_with_the_tensors(tmp_path):
    says_file = write_fp8(tmp_path / "a.safetensors", metadata={"hidden_states_backend": "file"})
    says_fp8 = write_fp8(tmp_path / "b.safetensors", metadata={"hidden_states_backend": "fp8"})
    assert [e["message"] for e in check.check_file(says_file).errors] == [
        "its metadata says the file backend wrote it, but its tensors are the fp8 backend's"
    ]
    assert check.check_file(says_fp8).ok


def test_a_slot_fp8_rounds_to_zero_is_named(tmp_path):
    """One scale per token over every slot: a slot 1e-7 of the token's largest value is stored
    as zeros, which check names, with the reason."""
    hs = states().float()
    hs[:, 0] *= 1e-7
    report = check.check_file(write_fp8(tmp_path / "x.safetensors", hs))
    assert [e["message"] for e in report.errors] == [
        "layer slots [0] are zero for every token (fp8 rounds a slot to zero where it is tiny "
        "beside the token's largest value)"
    ]


def test_nan_in_fp8_values_is_found(tmp_path):
    """A NaN state quantises to NaN values (and a NaN scale): check says so."""
    hs = states()
    hs[4, 2, 1] = float("nan")
    report = check.check_file(write_fp8(tmp_path / "x.safetensors", hs))
    assert {e["code"] for e in report.errors} == {"bad_scales"}
