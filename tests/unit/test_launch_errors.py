"""Bad input to `launch`: one clear line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import GENERATIONS, env, models, run  # noqa: E402

from speculators_hybrid import launch  # noqa: E402
from speculators_hybrid.launcher import LaunchError  # noqa: E402


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return models(tmp_path_factory.mktemp("models"))


SCRIPTS = {
    "never-execs": "print('hello')\n",
    "raises": "raise RuntimeError('boom')\n",
    "syntax": "def (:\n",
    "exits": "import sys\nsys.exit('no GPU')\n",
    "not-vllm": "import os\nos.execvp('ls', ['ls'])\n",
}
CONFIGS = {"bad-json": "{", "no-layers": json.dumps({"model_type": "qwen3"})}
MAIN = str(GENERATIONS["main"])
# name: (arguments, with {tmp} and {plain} filled in; what the error says)
CASES = {
    "missing model dir": (["{tmp}/nope"], "does not exist"),
    "no config.json": (["{tmp}/empty"], "has no config.json"),
    "bad config.json": (["{tmp}/bad-json"], "cannot read"),
    "no num_hidden_layers": (["{tmp}/no-layers"], "no integer num_hidden_layers"),
    "hub id not cached": (["nobody/nothing"], "not a local directory"),
    "launcher missing": (["--launcher", "{tmp}/x.py", "{plain}"], "cannot read launcher"),
    "launcher is a dir": (["--launcher", "{tmp}", "{plain}"], "cannot read launcher"),
    "launcher not .py": (["--launcher", "{plain}/config.json", "{plain}"], "not a Python script"),
    "launcher without path": (["--launcher"], "--launcher needs a PATH"),
    "never execs": (["--launcher", "{tmp}/never-execs.py", "{plain}"], "without exec'ing"),
    "launcher raises": (["--launcher", "{tmp}/raises.py", "{plain}"], "RuntimeError: boom"),
    "syntax error": (["--launcher", "{tmp}/syntax.py", "{plain}"], "failed: SyntaxError"),
    "sys.exit(msg)": (["--launcher", "{tmp}/exits.py", "{plain}"], "exited: no GPU"),
    "launcher's model missing": (["--launcher", MAIN, "{tmp}/nope"], "nope does not exist"),
    "not a vllm command": (["--launcher", "{tmp}/not-vllm.py", "{plain}"], "not `vllm serve"),
}


def case(name: str, tmp_path: Path, targets: dict[str, Path]) -> tuple[list[str], str]:
    (tmp_path / "empty").mkdir(exist_ok=True)
    for stem, text in SCRIPTS.items():
        (tmp_path / f"{stem}.py").write_text(text)
    for stem, text in CONFIGS.items():
        (tmp_path / stem).mkdir(exist_ok=True)
        (tmp_path / stem / "config.json").write_text(text)
    args, message = CASES[name]
    return [a.format(tmp=tmp_path, plain=targets["plain"]) for a in args], message


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_clear_line_and_exit_2(name, targets, tmp_path, capsys):
    args, message = case(name, tmp_path, targets)
    assert launch.main([*args, "--dry-run"] if args != ["--launcher"] else args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("speculators-hybrid launch: error: ")


def test_no_traceback_from_the_command_line(targets, tmp_path):
    args, _ = case("launcher raises", tmp_path, targets)
    proc, stdout, stderr = run(["-m", "speculators_hybrid.launch", *args], env(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in stderr and stdout == ""


@pytest.mark.parametrize("source", list(GENERATIONS))
def test_the_launchers_own_help_and_usage_errors(source, capsys):
    path = str(GENERATIONS[source])
    assert launch.main(["--launcher", path, "--help"]) == 0
    assert "usage:" in capsys.readouterr().out
    assert launch.main(["--launcher", path]) == 2  # MODEL missing: argparse's own error
    assert "required: model" in capsys.readouterr().err


def test_split_args_takes_only_ours_before_the_separator():
    split = launch.split_args
    assert split(["--launcher", "L", "M", "--dry", "--port", "1"]) == (
        "L",
        True,
        ["M", "--port", "1"],
    )
    assert split(["M", "--launcher=L", "--", "--dry-run", "--launcher", "x"]) == (
        "L",
        False,
        ["M", "--", "--dry-run", "--launcher", "x"],
    )
    assert split(["M", "--d", "--dtype", "half"]) == (None, True, ["M", "--dtype", "half"])
    with pytest.raises(LaunchError):
        split(["M", "--launcher"])


def test_add_cli_registers_launch_with_every_token_for_main(monkeypatch):
    parser = argparse.ArgumentParser(prog="speculators-hybrid")
    sub = parser.add_subparsers(dest="command", required=True)
    launch.add_cli(sub)
    seen: list[list[str]] = []
    monkeypatch.setattr(launch, "main", lambda argv: seen.append(argv) or 0)
    for argv in (["-h"], ["--launcher", "L", "M", "--", "--x", "--"], ["--", "-x"]):
        args = parser.parse_args(["launch", *argv])
        assert args.func(args) == 0 and seen[-1] == argv
