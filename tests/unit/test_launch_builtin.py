"""The built-in launcher's CLI against main's (its double): same argv for the same input,
`hs_connectors`' backend registry when installed, help and usage errors."""

from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import GENERATIONS, models  # noqa: E402

from speculators_hybrid import launch, switches  # noqa: E402
from speculators_hybrid.launcher import builtin, intercept  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using custom target layer ids")  # main's

CASES = [
    [],
    ["--hidden-states-path", "/data/hs"],
    ["--hidden-states-path=/data/hs", "--hidden-states-backend", "file"],
    ["--target-layer-ids", "3", "5"],
    ["--target-layer-ids", "3", "8", "5"],
    ["--target-layer-ids", "3", "--no-include-last-layer"],
    ["--no-include-last-layer"],
    ["--trust-remote-code", "--port", "8001"],
    ["--port", "8001", "--", "--max-model-len", "64", "--enforce-eager"],
    ["--", "--max-model-len", "64", "--", "--enforce-eager"],
    ["--tensor-parallel-size", "2", "--target-layer-ids", "1", "2", "--", "-tp", "2"],
]


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return models(tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("name", ["plain", "hybrid-mm"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c) or "defaults")
def test_builtin_command_equals_mains(case, name, targets, capsys):
    """The same command, except that given ids come out sorted (main keeps their order)."""
    args = [str(targets[name]), *case]
    ours, parsed = builtin.build(list(args))
    mains = intercept.capture(str(GENERATIONS["main"]), list(args))
    assert ours.layer_ids() == sorted(mains.layer_ids())
    if ours.layer_ids() == mains.layer_ids():
        assert ours.argv == mains.argv
    if "--target-layer-ids" in case:  # launch logs it, instead of main's UserWarning
        assert parsed.ids_note.startswith(f"target layer ids {ours.layer_ids()}")


def test_model_may_come_after_options(targets):
    args = ["--hidden-states-path", "/x", str(targets["plain"]), "--port", "1"]
    ours, _ = builtin.build(list(args))
    assert ours.argv == intercept.capture(str(GENERATIONS["main"]), list(args)).argv


class MemBackend:
    @staticmethod
    def add_launch_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--mem-address", default="localhost:1")

    @staticmethod
    def build_kv_transfer_config(args: argparse.Namespace) -> dict[str, Any]:
        return {
            "kv_connector": "MemConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"address": args.mem_address},
        }


def fake_registry(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    registry = types.SimpleNamespace(registry={"mem": MemBackend})
    for name in names:
        module = types.ModuleType(name)
        module.HiddenStatesBackend = registry  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("source", ["builtin", "main", "0.7.x"])
def test_backends_come_from_the_installed_registry(source, targets, monkeypatch):
    """main (and the built-in) read hs_connectors; 0.7.x reads speculators' vendored copy."""
    fake_registry(
        monkeypatch,
        "hs_connectors",
        "speculators",
        "speculators._vendor",
        "speculators._vendor.hs_connectors",
    )
    args = [str(targets["plain"]), "--hidden-states-backend", "mem", "--mem-address", "h:2"]
    if source == "builtin":
        cmd, _ = builtin.build(list(args))
    else:
        cmd = intercept.capture(str(GENERATIONS[source]), list(args))
    assert cmd.option(("--kv_transfer_config",)) == (
        '{"kv_connector": "MemConnector", "kv_role": "kv_producer", '
        '"kv_connector_extra_config": {"address": "h:2"}}'
    )


def test_without_a_registry_only_file_is_offered(monkeypatch):
    monkeypatch.setitem(sys.modules, "hs_connectors", None)  # import fails, as when absent
    assert builtin.backends() == {"file": builtin.FileBackend}


def test_help_lists_the_launcher_options(capsys):
    assert launch.main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in (
        "--launcher PATH",
        "--hidden-states-backend",
        "--hidden-states-path",
        "--target-layer-ids",
        "--no-include-last-layer",
        "--dry-run",
        "--allow-decode",
        "--prefill-only",
        "--trust-remote-code",
    ):
        assert option in out


def test_missing_model_is_a_usage_error(capsys):
    assert launch.main(["--dry-run"]) == 2
    assert "the following arguments are required: model" in capsys.readouterr().err


def test_an_abbreviated_launcher_option_is_refused(targets, capsys):
    args = [str(targets["plain"]), "--launch", str(GENERATIONS["main"])]
    assert launch.main(args) == 2
    assert "write --launcher PATH in full" in capsys.readouterr().err


def serving_env(argv: list[str]) -> str | None:
    cmd, _ = launch.plan(argv)
    return (cmd.env or {}).get(switches.PREFILL_ONLY)


@pytest.mark.parametrize("source", ["builtin", "main"])
def test_a_hybrid_server_extracts_prompts_only_unless_told(source, targets, monkeypatch, capsys):
    """SPECULATORS_HYBRID_PREFILL_ONLY for vLLM: 1 for a hybrid target by default and with
    --prefill-only (any target), 0 with --allow-decode; neither flag reaches a launcher, and
    after `--` they are vLLM's (unknown there: left alone)."""
    monkeypatch.delenv(switches.PREFILL_ONLY, raising=False)
    first = ["--launcher", str(GENERATIONS["main"])] if source == "main" else []
    hybrid, plain = str(targets["hybrid-mm"]), str(targets["plain"])
    assert serving_env([*first, hybrid]) == "1"
    assert "the default for hybrid targets" in capsys.readouterr().err
    assert serving_env([*first, "--allow-decode", hybrid]) == "0"
    assert "requests that decode are served" in capsys.readouterr().err
    assert serving_env([*first, plain]) is None  # a dense target's command as it was
    assert serving_env([*first, "--prefill-only", plain, "--port", "1"]) == "1"
    for flag in ("--allow-decode", "--prefill-only"):
        cmd, _ = launch.plan([*first, flag, hybrid])
        assert not {"--prefill-only", "--allow-decode"} & set(cmd.argv)
    after, _ = launch.plan([*first, plain, "--", "--prefill-only", "--allow-decode"])
    assert after.argv[-2:] == ["--prefill-only", "--allow-decode"]
    assert (after.env or {}).get(switches.PREFILL_ONLY) is None


def test_the_two_serving_modes_together_are_refused(targets, capsys):
    argv = ["--prefill-only", "--allow-decode", str(targets["hybrid-mm"]), "--dry-run"]
    assert launch.main(argv) == 2
    assert "--prefill-only and --allow-decode contradict each other" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_users_own_switch_is_kept(value, targets, monkeypatch, capsys):
    monkeypatch.setenv(switches.PREFILL_ONLY, value)
    cmd, _ = launch.plan([str(targets["hybrid-mm"])])
    assert (cmd.env or dict(os.environ))[switches.PREFILL_ONLY] == value
    assert "kept from the environment" in capsys.readouterr().err


def test_a_bad_writer_thread_count_is_refused_before_vllm_starts(targets, monkeypatch, capsys):

    monkeypatch.setenv(switches.WRITER_THREADS, "eight")
    assert launch.main([str(targets["hybrid-mm"]), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be a whole number >= 1, got 'eight'" in err
    monkeypatch.setenv(switches.WRITER_THREADS, "16")
    assert launch.main([str(targets["hybrid-mm"]), "--dry-run"]) == 0


def test_a_disabled_patch_that_does_not_exist_is_refused_before_vllm_starts(
    targets, monkeypatch, capsys
):
    from speculators_hybrid import switches

    monkeypatch.setenv(switches.DISABLED_PATCHES, "no-such-patch")
    assert launch.main([str(targets["hybrid-mm"]), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names no patch: no-such-patch" in err
    monkeypatch.setenv(switches.DISABLED_PATCHES, "no-accepted-count-wait-in-prefill")
    assert launch.main([str(targets["hybrid-mm"]), "--dry-run"]) == 0
