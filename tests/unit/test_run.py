"""`speculators-hybrid run`: the bootstrap reaches child processes, chains, and stays inert.

These run real subprocesses; none needs speculators (tests/speculators/ covers the patches).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from speculators_hybrid import run
from speculators_hybrid.speculators_patches import PATCHES

PY = sys.executable


def launch(*cmd: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "speculators_hybrid.run", *cmd],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=120,
    )


def test_child_env_puts_the_bootstrap_first_once():
    env = run.child_env({"PYTHONPATH": f"/a{os.pathsep}{run.BOOTSTRAP}{os.pathsep}/b"})
    assert env["PYTHONPATH"].split(os.pathsep) == [run.BOOTSTRAP, "/a", "/b"]
    assert run.child_env({})["PYTHONPATH"] == run.BOOTSTRAP
    assert os.path.isfile(os.path.join(run.BOOTSTRAP, "sitecustomize.py"))


PROBE = (
    "import sys, sitecustomize; "
    "print('hook', any(type(f).__name__ == '_ArmOnSpeculators' for f in sys.meta_path)); "
    "print('ours', sorted(m for m in sys.modules if m.startswith('speculators_hybrid'))); "
    "heavy = ('speculators', 'torch', 'vllm', 'wrapt'); "
    "print('heavy', sorted(m for m in heavy if m in sys.modules))"
)


def test_the_command_gets_the_hook_and_imports_nothing_heavy():
    done = launch("--", PY, "-c", PROBE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["hook True", "ours []", "heavy []"]
    assert "speculators-hybrid run: " in done.stderr  # the start-up line


def test_importing_speculators_arms_the_patches(tmp_path):
    # A bare `speculators` package: only the moment of its import is observed here;
    # tests/speculators/ patches the real releases.
    (tmp_path / "speculators").mkdir()
    (tmp_path / "speculators" / "__init__.py").write_text("")
    probe = (
        "import sys; print('speculators_hybrid.speculators_patches' in sys.modules); "
        "import speculators; print('speculators_hybrid.speculators_patches' in sys.modules)"
    )
    done = launch("-q", "--", PY, "-c", probe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    assert "speculators-hybrid: pid=" in done.stderr


def test_grandchildren_get_it_too():
    nested = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {PROBE!r}])"
    done = launch("-q", "--", PY, "-c", nested)
    assert done.returncode == 0, done.stderr
    assert "hook True" in done.stdout and done.stderr == ""


def test_an_existing_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS = 'ran'\n")
    probe = "import builtins, sys; print(getattr(builtins, 'THEIRS', None), "
    probe += "any(type(f).__name__ == '_ArmOnSpeculators' for f in sys.meta_path))"
    old = os.environ.get("PYTHONPATH", "")
    done = launch("--", PY, "-c", probe, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{old}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ran", "True"]


def test_exit_status_and_missing_commands():
    assert launch("-q", "--", PY, "-c", "import sys; sys.exit(3)").returncode == 3
    missing = launch("-q", "--", "no-such-command-anywhere")
    assert missing.returncode == 127
    assert missing.stderr == (
        "speculators-hybrid run: error: no-such-command-anywhere: command not found\n"
    )
    assert launch("-q", "--", "/dev/null").returncode == 126  # not executable
    empty = launch("--")
    assert empty.returncode == 2 and "give a command after --" in empty.stderr


def test_switched_off_by_the_common_switch(monkeypatch):
    from speculators_hybrid import speculators_patches

    monkeypatch.setenv("SPECULATORS_HYBRID_DISABLE", "1")
    assert speculators_patches.arm() is False
    done = launch("--", PY, "-c", "print(1)", env={"SPECULATORS_HYBRID_DISABLE": "1"})
    assert "no patches" in done.stderr


def test_a_python_without_speculators_hybrid_warns_when_it_imports_speculators(tmp_path):
    # A stand-in for "another virtualenv": speculators_hybrid fails to import, and a bare
    # `speculators` package stands for the real one (only its import is observed).
    (tmp_path / "speculators_hybrid").mkdir()
    (tmp_path / "speculators_hybrid" / "__init__.py").write_text("raise ImportError('elsewhere')")
    (tmp_path / "speculators").mkdir()
    (tmp_path / "speculators" / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([run.BOOTSTRAP, str(tmp_path)]))
    quiet = subprocess.run(
        [PY, "-c", "print(1)"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = subprocess.run(
        [PY, "-c", "import speculators"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert loud.returncode == 0
    assert "cannot import speculators_hybrid (elsewhere)" in loud.stderr
    assert "WITHOUT its patches" in loud.stderr


def test_patches_are_documented_and_fingerprinted():
    assert {p.project for p in PATCHES} == {"speculators"}
    for patch in PATCHES:
        assert patch.why.strip() and patch.fixed_upstream
        assert all(t.fingerprints for t in patch.targets)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.4.0.1", set()),
        ("0.5.0", {"verifier-norm-eagle3", "verifier-logit-scale"}),
        ("0.6.0.2", {"verifier-norm-eagle3", "verifier-norm-dflash", "verifier-logit-scale"}),
        (
            "0.9.0",
            {
                "verifier-norm-eagle3",
                "verifier-norm-dflash",
                "verifier-logit-scale",
                "draft-config-norm-eps",
                "mtp-final-norm",
            },
        ),
    ],
)
def test_each_speculators_version_selects_its_patches(version, expected):
    from speculators_hybrid.registry import Patcher

    assert {p.id for p in Patcher(version_of=lambda d: version).select(PATCHES)} == expected
