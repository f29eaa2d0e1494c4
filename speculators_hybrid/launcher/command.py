"""The command a launcher would exec, and the fields we read from it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from speculators_hybrid.launcher import LaunchError

SPEC_FLAGS = ("--speculative_config", "--speculative-config")


@dataclass
class Command:
    """`file` and `argv` as given to `os.exec*`; `env` None means the current environment."""

    file: str
    argv: list[str]
    env: dict[str, str] | None = None
    search_path: bool = True  # execvp-style PATH lookup (execv/execve: no lookup)
    # the options the launcher's own argparse parsers know (None: not a --launcher script)
    launcher_options: frozenset[str] | None = field(default=None, compare=False)

    def model(self) -> str:
        if "serve" not in self.argv or self.argv.index("serve") + 1 >= len(self.argv):
            raise LaunchError(f"the launcher's command is not `vllm serve MODEL ...`: {self.argv}")
        return self.argv[self.argv.index("serve") + 1]

    def option(self, names: tuple[str, ...]) -> str | None:
        """Value of the first of `names` (`--x V` or `--x=V`)."""
        for i, arg in enumerate(self.argv):
            for name in names:
                if arg == name and i + 1 < len(self.argv):
                    return self.argv[i + 1]
                if arg.startswith(name + "="):
                    return arg[len(name) + 1 :]
        return None

    def layer_ids(self) -> list[Any]:
        raw = self.option(SPEC_FLAGS)
        if raw is None:
            raise LaunchError("the launcher's command has no --speculative_config")
        try:
            spec = json.loads(raw)
            return list(spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"])
        except (ValueError, KeyError, TypeError) as exc:
            raise LaunchError(
                f"cannot read eagle_aux_hidden_state_layer_ids from --speculative_config {raw}"
            ) from exc
