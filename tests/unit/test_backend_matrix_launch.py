"""`launch` refuses a hidden-state backend where it cannot work on a hybrid target, in one line,
before the server starts, naming the first release it works on (speculators_hybrid/backends.py);
the kv-transfer configs here are hs-connectors 0.9.0's (tests/cpu/test_backend_matrix.py checks
them against the real package)."""

from __future__ import annotations

import json
import sys

import pytest

from speculators_hybrid import backends
from speculators_hybrid.launcher import LaunchError, adjust, target
from speculators_hybrid.launcher.command import Command
from speculators_hybrid.models import write_config

MOONCAKE = {
    "kv_connector": "MooncakeHiddenStatesConnector",
    "kv_role": "kv_producer",
    "kv_connector_module_path": "hs_connectors.mooncake_hidden_states_connector",
    "kv_connector_extra_config": {"mooncake": {"master_server_address": "127.0.0.1:50051"}},
}
FP8 = {
    "kv_connector": "FP8HiddenStatesConnector",
    "kv_role": "kv_producer",
    "kv_connector_module_path": "hs_connectors.fp8_hidden_states_connector",
    "kv_connector_extra_config": {"shared_storage_path": "/tmp/hs"},
}


def command(model: str, transfer: dict) -> Command:
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1}
    spec["draft_model_config"] = {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 8]}}
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    argv += ["--speculative_config", json.dumps(spec), "--kv-transfer-config", json.dumps(transfer)]
    return Command(argv[0], argv)


@pytest.mark.parametrize("vllm", ["0.20.1", "0.21.0"])
def test_mooncake_is_refused_before_022_in_one_line(tmp_path, vllm):
    model = str(write_config(tmp_path / "m", "tiny", False))
    with pytest.raises(LaunchError) as err:
        adjust.for_target(command(model, MOONCAKE), target.load(model), [], vllm, lambda _: None)
    message = str(err.value)
    assert "\n" not in message and "mooncake" in message
    assert "the first release it works on is vLLM 0.22.0" in message
    assert "use --hidden-states-backend file or fp8" in message


@pytest.mark.parametrize(("transfer", "vllm"), [(MOONCAKE, "0.22.1"), (FP8, "0.20.1")])
def test_backends_that_work_are_not_refused(tmp_path, transfer, vllm):
    model = str(write_config(tmp_path / "m", "tiny", False))
    adjust.for_target(command(model, transfer), target.load(model), [], vllm, lambda _: None)


def test_the_backends_are_told_by_connector_and_module():
    assert backends.of_command(json.dumps(MOONCAKE)) is backends.BY_NAME["mooncake"]
    assert backends.of_command(json.dumps({**FP8, "kv_connector_module_path": "x.y"})) is None
    assert backends.of_command("{") is None and backends.of_command(None) is None
