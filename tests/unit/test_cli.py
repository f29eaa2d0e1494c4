"""The command line as a user meets it, run as a subprocess: bad input answers in one line with
exit status 2 (no traceback, before vLLM or torch is imported), `launch`'s own messages, `run`
and `--version`, help text on every option. Doctor's plans: tests/cli (vLLM needed)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import models  # noqa: E402

from speculators_hybrid import __version__  # noqa: E402
from speculators_hybrid.cli import build_parser  # noqa: E402
from speculators_hybrid.versions import installed  # noqa: E402

CLI = [sys.executable, "-m", "speculators_hybrid.cli"]


def cli(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


def one_line_error(done: subprocess.CompletedProcess[str], prefix: str) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(f"speculators-hybrid {prefix}: error: "), line
    return line


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("configs")
    out = dict(models(root))
    for name, text in {
        "malformed": "{bad",
        "empty-object": "{}",
        "list": "[1, 2]",
        "bamba": json.dumps(  # no vLLM release has its EAGLE-3 hidden states
            {
                "architectures": ["BambaForCausalLM"],
                "model_type": "bamba",
                "num_hidden_layers": 8,
                "num_attention_heads": 8,
            }
        ),
    }.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(text)
        out[name] = root / name
    (root / "no-config").mkdir()
    (root / "no-config" / "weights.bin").write_bytes(b"")
    out["no-config"] = root / "no-config"
    return out


DOCTOR_BAD = {  # case: (arguments, what the line says)
    "missing dir": (["/nonexistent/model"], "does not exist"),
    "no config.json": (["{no-config}"], "has no config.json"),
    "malformed JSON": (["{malformed}"], "cannot read"),
    "not an object": (["{list}"], "is not a JSON object"),
    "no layers": (["{empty-object}"], "gives no layer count: no integer num_hidden_layers"),
    "a file": (["{no-config}/weights.bin"], "weights.bin is a file: give the model's folder"),
    "max-model-len 0": (["--demo", "--max-model-len", "0"], "--max-model-len 0: give a number"),
    "max-model-len -5": (["--demo", "--max-model-len", "-5"], "--max-model-len -5: give a"),
    "batched tokens": (["--demo", "--max-num-batched-tokens", "-1"], "-batched-tokens -1: give"),
    "memory -1": (["--demo", "--memory", "-1"], "--memory -1: give the KV-cache memory in GiB"),
    "memory 0": (["--demo", "--memory", "0"], "--memory 0: give the KV-cache memory in GiB"),
    "memory nan": (["--demo", "--memory", "nan"], "--memory nan: give the KV-cache memory"),
    "TP 0": (["--demo", "--tp", "0"], "--tp 0: the tensor parallel size is 1 or more"),
    "TP -2": (["--demo", "--tp", "-2"], "--tp -2: the tensor parallel size is 1 or more"),
    "hub name": (["Some-Org/Not-Downloaded-Model"], "not a local directory"),
    "duplicate ids": (["--demo", "--ids", "2", "2", "32", "64"], "duplicated [2]"),
    "ids out of range": (["{hybrid-text}", "--ids", "1", "9"], "outside [0, 8]: [9]"),
    "TP": (["--demo", "--tp", "3"], "tensor parallel size 3 does not divide"),
    "no model": ([], "give a model or config directory, or --demo"),
    "family": (["{bamba}"], "no vLLM release up to"),
}


@pytest.mark.parametrize("case", DOCTOR_BAD, ids=list(DOCTOR_BAD))
def test_doctor_refuses_bad_input_in_one_line_before_vllm(case, configs):
    args, says = DOCTOR_BAD[case]
    done, took = cli("doctor", *(a.format(**{k: str(v) for k, v in configs.items()}) for a in args))
    assert says in one_line_error(done, "doctor")
    assert took < 10  # no vLLM import (that alone takes 10-20 s)


@pytest.mark.skipif(installed("vllm") is not None, reason="vLLM is installed here")
def test_doctor_without_vllm_says_to_install_it(configs):
    done, _ = cli("doctor", str(configs["hybrid-text"]))
    assert "vLLM is not installed for this Python" in one_line_error(done, "doctor")


def test_doctor_on_an_untested_vllm_says_so_before_any_failure():
    from speculators_hybrid import doctor, support

    last = support.NEWEST
    failed = {"ok": False, "error": "RuntimeError: this CPU cannot plan it"}
    out = {"vllm_version": "99.0.0", "setup": {"max_model_len": 8192}}
    out["plans"] = [failed, failed, failed]
    said = doctor.verdict(out)
    assert said.startswith("vLLM 99.0.0 is not a release speculators-hybrid is tested on (")
    assert f" to {last}); use one of those. Here: RuntimeError: this CPU cannot plan it" in said
    # A tested release that cannot plan the model: the finding is about vLLM, as before.
    said = doctor.verdict({**out, "vllm_version": last})
    assert said == f"vLLM {last} cannot plan this model even without extraction (above)."


def test_launch_dry_run_says_it_runs_nothing(configs):
    done, _ = cli("launch", str(configs["hybrid-text"]), "--dry-run")
    assert done.returncode == 0, done.stderr
    banner, command = done.stdout.splitlines()
    assert banner == "Would run (--dry-run, nothing started):" and " serve " in command


def test_launch_custom_ids_come_sorted_with_our_note_instead_of_a_warning(configs):
    args = ["launch", str(configs["hybrid-text"]), "--target-layer-ids", "5", "1", "--dry-run"]
    done, _ = cli(*args)
    assert done.returncode == 0, done.stderr
    assert '"eagle_aux_hidden_state_layer_ids": [1, 5, 8]' in done.stdout
    assert "Warning" not in done.stderr and "warnings.warn" not in done.stderr
    assert (
        "speculators-hybrid: target layer ids [1, 5, 8] (8, the last layer, added: "
        "--no-include-last-layer leaves it out): give the training script the same ids"
    ) in done.stderr.splitlines()


@pytest.mark.parametrize(
    "name, args, says",
    [
        ("hybrid-text", ["--", "--tensor-parallel-size", "3"], "tensor parallel size 3"),
        ("hybrid-text", ["--", "-tp", "-1"], "tensor parallel size -1: it must be 1 or more"),
        ("bamba", [], "BambaForCausalLM (bamba) has no EAGLE-3"),
        ("hybrid-text", ["--target-layer-ids", "2", "2"], "duplicated [2]"),
    ],
)
def test_launch_refuses_before_exec_in_one_line(name, args, says, configs):
    done, took = cli("launch", str(configs[name]), *args)
    assert says in one_line_error(done, "launch") and took < 10


def test_launch_names_the_folder_of_a_config_file(configs):
    config = configs["hybrid-text"] / "config.json"
    done, _ = cli("launch", str(config), "--dry-run")
    line = one_line_error(done, "launch")
    assert line.endswith(
        f"is a file: give the model's folder, the one holding config.json ({config.parent})"
    )


def test_launch_gives_the_true_reason_for_dropping_a_forced_flag(configs):
    launcher = str(Path(__file__).resolve().parents[1] / "launchers" / "launch_vllm_0_6.py")
    removed = "removed --no-enable-chunked-prefill (forced by this launcher): "
    base = ["launch", "--launcher", launcher, str(configs["hybrid-text"]), "--dry-run"]
    done, _ = cli(*base)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if removed in x]
    assert "extracts with chunked prefill on" in line and "prefix caching" not in line
    assert line.endswith("(pass --no-enable-chunked-prefill after `--` to keep it)")
    if installed("vllm") is None:  # with a vLLM here, the plugin may turn caching off instead
        done, _ = cli(*base, "--", "--enable-prefix-caching")
        assert done.returncode == 0, done.stderr
        (line,) = [x for x in done.stderr.splitlines() if removed in x]
        assert line.endswith("mamba 'align' cache mode, which needs chunked prefill")


def test_ids_that_do_not_fit_are_answered_with_speculators_default_where_it_fits(configs):
    done, _ = cli("launch", str(configs["hybrid-text"]), "--target-layer-ids", "1", "9")
    line = one_line_error(done, "launch")
    assert (
        "speculators' default here is [2, 4, 5, 8]. Pass distinct ids, e.g. [2, 4, 5, 8]:" in line
    )
    done, _ = cli("launch", str(configs["hybrid-4"]))  # the default does not fit 4 layers
    assert "e.g. [1, 2, 3, 4]" in one_line_error(done, "launch")
    done, _ = cli("doctor", str(configs["hybrid-text"]), "--ids", "1", "9")  # its own option
    line = one_line_error(done, "doctor")
    assert line.endswith("Pass distinct ids, e.g. --ids 2 4 5 8.") and "--target-layer" not in line
    done, _ = cli("doctor", "--ids", "2", str(configs["hybrid-text"]))  # MODEL after the ids
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("is not a layer id (MODEL goes before --ids)")


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("/nonexistent/model", "model directory /nonexistent/model does not exist"),
        ("Some-Org/Not-Downloaded-Model", "is not a local directory (nor in the Hugging Face"),
    ],
)
def test_a_launcher_is_not_run_for_a_model_that_is_not_here(model, says):
    launcher = str(Path(__file__).resolve().parents[1] / "launchers" / "launch_vllm_main.py")
    done, took = cli("launch", "--launcher", launcher, model, "--dry-run")
    assert says in one_line_error(done, "launch") and took < 10


def test_run_names_a_missing_command():
    done, _ = cli("run", "-q", "--", "nosuchcommand")
    assert done.returncode == 127
    assert done.stderr == "speculators-hybrid run: error: nosuchcommand: command not found\n"


def test_version():
    done, _ = cli("--version")
    assert done.returncode == 0 and done.stdout == f"speculators-hybrid {__version__}\n"


def _options(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for sub, subparser in action.choices.items():
                found.append((f"{name} {sub}", argparse.Action([], sub, help=helps.get(sub))))
                found += _options(subparser, f"{name} {sub}")
        else:
            found.append((name, action))
    return found


def test_every_command_and_option_has_help_text():
    missing = [
        f"{name} {'/'.join(a.option_strings) or a.dest}"
        for name, a in _options(build_parser(), "speculators-hybrid")
        if not a.help
    ]
    assert missing == []


def _parsers(parser: argparse.ArgumentParser, name: str) -> dict[str, argparse.ArgumentParser]:
    found = {name: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                found |= _parsers(subparser, f"{name} {sub}")
    return found


def test_every_command_has_a_description_and_the_top_says_what_the_tool_is():
    parsers = _parsers(build_parser(), "speculators-hybrid")
    bare = [name for name, p in parsers.items() if not p.description and p.add_help]
    assert bare == []  # `launch` (add_help off) answers --help with its own parser: below
    done, _ = cli("--help")
    assert "Hidden-state extraction for speculators' drafter training on hybrid" in done.stdout
    done, _ = cli("patches", "check", "--help")
    assert "By default the installed vLLM and speculators releases are checked" in " ".join(
        done.stdout.split()
    )
    done, _ = cli("launch", "--help")
    assert done.returncode == 0 and "--dry-run" in done.stdout


def _commands(parser: argparse.ArgumentParser, prefix: str) -> set[str]:
    """Every leaf command, e.g. `speculators-hybrid patches check`."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _commands(sub, f"{prefix} {name}") or {f"{prefix} {name}"}
    return found


def test_readme_command_table_names_every_command_and_no_other():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("| command | what it does |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    named = set()
    for row in rows:
        words = row.split()
        assert words[0] == "speculators-hybrid", row
        while len(words) > 1 and not re.fullmatch("[a-z]+", words[-1]):  # PATH, --opt, [...]
            words.pop()
        named.add(" ".join(words))
    commands = _commands(build_parser(), "speculators-hybrid") | {"speculators-hybrid"}
    assert named == commands


@pytest.mark.skipif(
    importlib.util.find_spec("pip") is not None, reason="this Python has pip: it would download"
)
def test_patches_check_without_pip_says_what_to_do(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "SPECULATORS_HYBRID_WHEELS": str(tmp_path)}
    args = ["patches", "check", "--project", "speculators", "--version", "0.5.0"]
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout.startswith(
        f"speculators 0.5.0: no pristine source: no wheel of speculators 0.5.0 in {tmp_path}, "
        "and no pip to fetch it (a uv venv has none: `uv pip install pip`"
    )


def test_set_up_scripts_stop_at_once_without_the_cpu_torch_wheel(tmp_path):
    """demo.sh and test.sh source tools.sh: no wheel, no venv made, the command to get it."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PIP_FIND_LINKS": str(tmp_path)}
    done = subprocess.run(
        ["bash", "-c", "source scripts/tools.sh && echo made-tools"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "made-tools" not in done.stdout
    assert done.stderr.startswith(f"no CPU torch wheel (torch 2.13.0+cpu) in {tmp_path}")
    assert "--index-url https://download.pytorch.org/whl/cpu" in done.stderr


@pytest.mark.parametrize("command", [["doctor"], ["patches", "check"], ["check", "out/"]])
def test_an_unknown_option_gets_the_subcommands_own_usage(command):
    done, _ = cli(*command, "--bogus")
    command = [c for c in command if not c.endswith("/")]  # the usage names the command only
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"usage: speculators-hybrid {' '.join(command)} ")
    assert lines[-1].startswith(f"speculators-hybrid {' '.join(command)}: error: ")
    assert "--bogus" in lines[-1]
