"""A real exec, in subprocesses: `python -m vllm.entrypoints.cli.main` resolves to a fake vLLM
(tests/launchers/fake_vllm first on PYTHONPATH) that records its PID, argv and VLLM_PLUGINS.
The command and the way it is exec'd are the launcher's own; only the module it runs is fake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import FORCES_NO_CHUNKED, GENERATIONS, env, models, record, run  # noqa: E402

from speculators_hybrid import (
    launch,  # noqa: E402
    switches,  # noqa: E402
)

WRAPPER = ["-m", "speculators_hybrid.launch"]
SOURCES = ["builtin", *GENERATIONS]


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return models(tmp_path_factory.mktemp("models"))


def launcher_args(source: str) -> list[str]:
    return [] if source == "builtin" else ["--launcher", str(GENERATIONS[source])]


def stock_run(source: str, args: list[str], tmp_path: Path) -> dict:
    """Run the stock launcher (its double) itself and record what it exec'd."""
    out = tmp_path / "stock.json"
    script = GENERATIONS["main" if source == "builtin" else source]
    proc, _, stderr = run([str(script), *args], env(out))
    assert proc.returncode == 0, stderr
    return record(out)


@pytest.mark.parametrize("source", SOURCES)
def test_plain_target_execs_the_stock_argv_in_the_same_process(source, targets, tmp_path):
    args = [str(targets["plain"]), "--hidden-states-path", str(tmp_path / "hs")]
    args += ["--", "--max-model-len", "64"]
    out = tmp_path / "ours.json"
    proc, stdout, stderr = run([*WRAPPER, *launcher_args(source), *args], env(out))
    assert proc.returncode == 0, stderr
    ours = record(out)
    assert ours["pid"] == proc.pid  # exec'd in place: the wrapper's PID is vLLM's
    assert ours["argv"] == stock_run(source, args, tmp_path)["argv"]  # byte-identical
    assert ours["argv"][0] == sys.executable and ours["VLLM_PLUGINS"] is None
    assert stdout.startswith("Running command:\n")


@pytest.mark.parametrize("source", SOURCES)
def test_hybrid_multimodal_target_execs_the_adjusted_command(source, targets, tmp_path):
    args = [str(targets["hybrid-mm"]), "--", "--max-model-len", "64"]
    out = tmp_path / "ours.json"
    extra = {"VLLM_PLUGINS": "other"}
    proc, stdout, stderr = run([*WRAPPER, *launcher_args(source), *args], env(out, **extra))
    assert proc.returncode == 0, stderr
    ours, stock = record(out), stock_run(source, args, tmp_path)
    assert ours["pid"] == proc.pid
    # the planned command (this interpreter's vLLM, if any, decides the chunked-prefill flag)
    planned, _ = launch.plan([*launcher_args(source), *args])
    assert ours["argv"] == planned.argv and planned.argv[-1] == "--language-model-only"
    common = [a for a in stock["argv"] if a != "--no-enable-chunked-prefill"]
    assert [a for a in ours["argv"][:-1] if a != "--no-enable-chunked-prefill"] == common
    assert ("--no-enable-chunked-prefill" in stock["argv"]) == (source in FORCES_NO_CHUNKED)
    assert ours["VLLM_PLUGINS"] == "other,speculators_hybrid"
    assert "vision tower is not built" in stderr


def test_dry_run_execs_nothing(targets, tmp_path):
    out = tmp_path / "ours.json"
    args = [*WRAPPER, *launcher_args("0.6.x"), str(targets["hybrid-text"]), "--dry-run"]
    proc, stdout, _ = run(args, env(out))
    assert proc.returncode == 0 and not out.exists()
    assert stdout.count("Running command:") == 0 and stdout.count(launch.DRY_RUN_BANNER) == 1


SHELL_NOISE = {"FAKE_VLLM_OUT", "_", "SHLVL", "PWD", "OLDPWD"}


@pytest.mark.parametrize("source", ["builtin", "0.5.0", "0.7.x"])
@pytest.mark.parametrize("name", ["hybrid-text", "plain"])
def test_the_dry_run_line_starts_what_launch_starts(source, name, targets, tmp_path):
    """The printed line, run by a shell from the same environment, gives the server the argv
    and the environment `launch` itself would (VLLM_PLUGINS fixed, prefill-only set)."""
    args = [*launcher_args(source), str(targets[name]), "--", "--max-model-len", "64"]
    extra = {"VLLM_PLUGINS": "other", "SPECULATORS_HYBRID_TEST_UNSET": "x"}
    proc, stdout, stderr = run([*WRAPPER, "--dry-run", *args], env(tmp_path / "no.json", **extra))
    assert proc.returncode == 0, stderr
    banner, line = stdout.splitlines()[-2:]
    assert banner == launch.DRY_RUN_BANNER
    shell_out = tmp_path / "shell.json"
    done = subprocess.run(["sh", "-c", line], env=env(shell_out, **extra), check=False)
    assert done.returncode == 0
    ours = tmp_path / "ours.json"
    proc, _, stderr = run([*WRAPPER, *args], env(ours, **extra))
    assert proc.returncode == 0, stderr
    shell, real = record(shell_out), record(ours)
    assert shell["argv"] == real["argv"]
    assert {k: v for k, v in shell["env"].items() if k not in SHELL_NOISE} == {
        k: v for k, v in real["env"].items() if k not in SHELL_NOISE
    }
    hybrid = name != "plain"
    assert line.startswith("env ") == hybrid  # plain: the launcher's command as it is
    assert real["env"]["VLLM_PLUGINS"] == ("other,speculators_hybrid" if hybrid else "other")
    assert real["env"].get(switches.PREFILL_ONLY) == ("1" if hybrid else None)


def test_the_dry_run_line_unsets_what_the_launcher_drops(tmp_path):
    cmd = launch.Command("python3", ["python3", "-c", "pass"], {"KEEP": "1", "NEW": "a b"})
    line = launch.shell_line(cmd, {"KEEP": "1", "GONE": "2"})
    assert line == "env -u GONE 'NEW=a b' python3 -c pass"
    assert launch.shell_line(launch.Command("x", ["x"], {"A": "1"}), {"A": "1"}) == "x"


LAUNCHER_SHAPES = {
    "execve": "os.execve(cmd[0], cmd, {**os.environ, 'VLLM_PLUGINS': 'x'})",
    "execv": "os.execv(cmd[0], cmd)",
    "subprocess": "sys.exit(subprocess.run(cmd).returncode)",
}


@pytest.mark.parametrize("shape", list(LAUNCHER_SHAPES))
def test_other_ways_a_launcher_may_start_vllm(shape, targets, tmp_path):
    """A launcher that execs with its own env, without PATH lookup, or through subprocess."""
    script = tmp_path / "launch_vllm.py"
    script.write_text(
        "import json, os, subprocess, sys\n"
        "ids = {'eagle_aux_hidden_state_layer_ids': [2, 4, 5, 8]}\n"
        "spec = {'method': 'extract_hidden_states', 'draft_model_config': {'hf_config': ids}}\n"
        "cmd = [sys.executable, '-m', 'vllm.entrypoints.cli.main', 'serve', sys.argv[1],\n"
        "       '--speculative_config', json.dumps(spec)]\n"
        "subprocess.run([sys.executable, '-c', 'pass'], check=True)  # not vLLM: runs\n"
        f"{LAUNCHER_SHAPES[shape]}\n"
    )
    out = tmp_path / "ours.json"
    proc, _, stderr = run(
        [*WRAPPER, "--launcher", str(script), str(targets["hybrid-text"])], env(out)
    )
    assert proc.returncode == 0, stderr
    ours = record(out)
    assert ours["pid"] == proc.pid and ours["argv"][3:5] == ["serve", str(targets["hybrid-text"])]
    assert ours["VLLM_PLUGINS"] == ("x,speculators_hybrid" if shape == "execve" else None)


def test_a_failed_exec_is_a_clear_error(targets, tmp_path):
    script = tmp_path / "launch_vllm.py"
    script.write_text(
        "import os, sys\n"
        "os.execvp('no-such-python-here', ['no-such-python-here', '-m', 'vllm', 'serve',\n"
        "          sys.argv[1]])\n"
    )
    proc, _, stderr = run(
        [*WRAPPER, "--launcher", str(script), str(targets["plain"])], env(tmp_path / "x.json")
    )
    assert proc.returncode == 2 and "cannot exec no-such-python-here" in stderr
    assert "Traceback" not in stderr
