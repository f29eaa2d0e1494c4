"""`patches list` as a user runs it where vLLM is installed (subprocess; the support.CLI envs,
uv venvs without torchvision, like the demo's): a true answer for
every patch that applies, vLLM's logs off stdout and quiet. `patches check` without pip:
tests/unit/test_cli.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_doctor_cli import as_a_user

from speculators_hybrid.versions import installed

pytest.importorskip("vllm")


def patches_list(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.cli", "patches", "list"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**as_a_user(), **env},
    )


def test_patches_list_answers_for_every_patch_and_is_quiet():
    done = patches_list()
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"vllm {installed('vllm')}; ")
    checks = [line for line in lines if line.startswith("  check:")]
    assert checks and all(
        "every target matches its fingerprint" in c or "every class loads" in c for c in checks
    ), checks
    assert not [line for line in lines if line.startswith(("INFO ", "WARNING ", "ERROR "))]
    assert "Traceback" not in done.stderr and "libcuda" not in done.stderr, done.stderr


def test_patches_list_shows_disabled_patches_and_refuses_unknown_ones():
    from speculators_hybrid import switches

    wait = "no-accepted-count-wait-in-prefill"
    done = patches_list(**{switches.DISABLED_PATCHES: wait})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"\n{wait}  [" in done.stdout
    assert f"; off: {switches.DISABLED_PATCHES}]" in done.stdout.split(f"\n{wait}  [")[1]
    done = patches_list(**{switches.DISABLED_PATCHES: f"{wait},no-such-patch"})
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.count("\n") == 1 and "names no patch: no-such-patch" in done.stderr


def test_patches_list_tells_not_installed_from_not_needed():
    from speculators_hybrid.speculators_patches import PATCHES

    if installed("speculators") is not None:
        pytest.skip("speculators is installed here")
    done = patches_list()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "speculators is not installed here: its patches apply where it runs" in done.stdout
    for patch in PATCHES:
        assert f"\n{patch.id}  [speculators not installed here]\n" in done.stdout
    assert "[not needed here]" not in done.stdout.split(PATCHES[0].id)[1]


def test_a_bare_patches_check_checks_the_installed_release_and_downloads_nothing(tmp_path):
    env = {**as_a_user(), "HOME": str(tmp_path)}
    env.pop("SPECULATORS_HYBRID_WHEELS", None)
    done = subprocess.run(
        [sys.executable, "-m", "speculators_hybrid.cli", "patches", "check"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("the installed releases; --version V checks another release")
    vllm = [line for line in lines if line.startswith(f"vllm {installed('vllm')} (installed ")]
    assert len(vllm) == 1 and "FAIL" not in done.stdout and "downloading" not in done.stdout
    assert list(tmp_path.iterdir()) == []  # no ~/.cache/speculators-hybrid


def test_patches_check_of_one_release_checks_the_project_that_has_it(tmp_path):
    env = {**as_a_user(), "HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "speculators_hybrid.cli", "patches", "check", "--version"]
    done = subprocess.run([*cli, installed("vllm")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr  # speculators has no such release
    assert "speculators" not in done.stdout and "downloading" not in done.stdout
    bad = subprocess.run([*cli, "notaversion"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stdout == ""
    said = "speculators-hybrid patches check: error: patches/ has no diffs for notaversion"
    assert bad.stderr.startswith(f"{said} (vllm 0.20.0 to ")
    assert len(bad.stderr.splitlines()) == 1
