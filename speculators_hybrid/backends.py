"""speculators' hidden-state backends (`--hidden-states-backend`, from the `hs-connectors`
package) on hybrid targets: which vLLM releases each works on with the plugin, and how.

The one owner of these facts: `launch` refuses a backend before the server starts where it
cannot work, the support page's backend table is made from `BACKENDS`, and the CPU tests
(tests/cpu/test_backend_matrix*.py) prove each cell they claim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from speculators_hybrid import support

FP8_FORMAT = "fp8"  # kv_connector_extra_config["hidden_states_format"]: the file's encoding
FORMAT_KEY = "hidden_states_format"


@dataclass(frozen=True)
class Backend:
    name: str  # as `--hidden-states-backend` names it
    connector: str  # the kv_connector hs-connectors' registry puts in the command
    module: str | None  # its kv_connector_module_path
    first: str  # the first vLLM release of the matrix it works on, with the plugin
    how: str  # what serves it there
    before: str = ""  # why it cannot work before `first`

    def works_on(self, vllm: str) -> bool:
        return Version(vllm) >= Version(self.first)


BACKENDS: tuple[Backend, ...] = (
    Backend(
        "file",
        "ExampleHiddenStatesConnector",
        None,
        support.OLDEST,
        "the plugin's connector before 0.24 (0.22-0.23: with chunked prefill), vLLM's with the "
        "plugin's patches from 0.24",
    ),
    Backend(
        "fp8",
        "FP8HiddenStatesConnector",
        "hs_connectors.fp8_hidden_states_connector",
        support.OLDEST,
        "the connector that writes `file`'s files, writing hs-connectors' fp8 format "
        "(hidden-states-fp8-files): hs-connectors' class needs vLLM >= 0.22 and skips the "
        "plugin's writer",
    ),
    Backend(
        "mooncake",
        "MooncakeHiddenStatesConnector",
        "hs_connectors.mooncake_hidden_states_connector",
        "0.22.0",
        "hs-connectors' connector unchanged, reading the hidden-state group the plugin plans",
        "it finds the hidden-state group by vLLM's HiddenStateCacheSpec, new in vLLM 0.22.0 "
        "(before it, vLLM also turns the hybrid KV cache manager off for any connector)",
    ),
)
BY_NAME = {b.name: b for b in BACKENDS}
BY_CONNECTOR = {b.connector: b for b in BACKENDS}


def of_transfer_config(transfer: dict[str, Any]) -> Backend | None:
    """The backend a kv-transfer config names (None: another connector)."""
    backend = BY_CONNECTOR.get(str(transfer.get("kv_connector")))
    if backend is None or transfer.get("kv_connector_module_path") != backend.module:
        return None
    return backend


def of_command(raw: str | None) -> Backend | None:
    """The backend of a `--kv-transfer-config` JSON value (None: none, unreadable, another)."""
    try:
        transfer = json.loads(raw) if raw else None
    except ValueError:
        return None
    return of_transfer_config(transfer) if isinstance(transfer, dict) else None


def refusal(backend: Backend, vllm: str | None) -> str | None:
    """Why `backend` cannot extract from a hybrid target on vLLM `vllm` (None: it can, or the
    version is unknown or older than the matrix)."""
    try:
        release = Version(Version(vllm or "").base_version)
    except InvalidVersion:
        return None
    if release < Version(support.OLDEST) or backend.works_on(str(release)):
        return None
    others = " or ".join(b.name for b in BACKENDS if b.works_on(str(release)))
    return (
        f"--hidden-states-backend {backend.name} cannot work on vLLM {vllm} with a hybrid "
        f"target: {backend.before}; the first release it works on is vLLM {backend.first} "
        f"(here use --hidden-states-backend {others})"
    )
