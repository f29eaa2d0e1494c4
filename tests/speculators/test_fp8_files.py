"""Files written by hs-connectors' own `FP8HiddenStatesConnector._write_tensors` (the fp8
backend's writer, beside vLLM in the speculators >= 0.8.1 envs) are read by `check` as the fp8
backend's, and verify's reader gives the values speculators' trainer gets from them."""

from __future__ import annotations

import os

import pytest
import torch

connector = pytest.importorskip("hs_connectors.fp8_hidden_states_connector")
from hs_connectors.transfer import FP8Transfer  # noqa: E402

from speculators_hybrid import check  # noqa: E402
from speculators_hybrid.verify import fp8  # noqa: E402


class Copied:
    """The connector's copy-to-host event, done already: the tensors are on the CPU."""

    def synchronize(self) -> None:
        pass


def test_the_fp8_connectors_files_are_read_as_the_trainer_reads_them(tmp_path):
    gen = torch.Generator().manual_seed(0)
    states = (torch.randn(9, 3, 64, generator=gen) * torch.arange(1, 10).view(9, 1, 1)).bfloat16()
    path = tmp_path / "hs_0.safetensors"
    lock = os.open(tmp_path / "hs_0.safetensors.lock", os.O_CREAT | os.O_WRONLY)
    tensors = {"hidden_states": states, "token_ids": torch.arange(9)}
    connector.FP8HiddenStatesConnector._write_tensors(tensors, Copied(), str(path), lock)
    os.unlink(tmp_path / "hs_0.safetensors.lock")

    report = check.check_file(str(path))
    assert report.ok and report.backend == "fp8" and report.dtype == "F8_E4M3", report.errors
    assert (report.tokens, report.n_ids, report.hidden) == (9, 3, 64)

    from safetensors.torch import load_file

    stored = load_file(str(path))
    trainer = FP8Transfer(tmp_path).get_cached(0)["hidden_states"]  # speculators' reader
    ours = fp8.dequantize(stored["hidden_states"], stored["hidden_states_scales"])
    assert torch.equal(ours, trainer) and torch.equal(fp8.round_trip(states), trainer)
    values, scales = fp8.quantize(states)  # verify's quantiser: the connector's bytes
    assert torch.equal(values.view(torch.uint8), stored["hidden_states"].view(torch.uint8))
    assert torch.equal(scales, stored["hidden_states_scales"])
