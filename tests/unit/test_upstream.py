"""`speculators-hybrid patches check|unpack|export` on a small made-up package (no vLLM)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from speculators_hybrid import upstream
from speculators_hybrid.cli import main

HEADER = "Subject: fix\n\nProblem: p\nEvidence: e\nFix: f\nUpstream: u\nTests: t\n"
ORIGINAL = "def answer():\n    return 41\n\n\ndef other():\n    return 1\n"


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """A pristine release of the package `demo` 1.0: a folder holding `demo/`."""
    source = tmp_path / "pristine"
    (source / "demo").mkdir(parents=True)
    (source / "demo" / "__init__.py").write_text("")
    (source / "demo" / "core.py").write_text(ORIGINAL)
    return source


def _commit(repo: Path, message: str) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-qam", message], cwd=repo, check=True)


def _fixed(root: Path, release: Path, tmp_path: Path) -> Path:
    """unpack, edit, commit, export: the documented workflow. Returns the diff."""
    repo = tmp_path / "work"
    upstream.unpack(root, "demo", "1.0", repo, source=release)
    core = repo / "demo" / "core.py"
    core.write_text(core.read_text().replace("41", "42"))
    _commit(repo, f"0001-fix-answer\n\n{HEADER}")
    (written,) = upstream.export(root, "demo", "1.0", repo)
    return written


def test_export_writes_the_header_and_a_diff_rooted_at_the_package(tmp_path, release):
    diff = _fixed(tmp_path / "patches", release, tmp_path)
    text = diff.read_text()
    assert diff == tmp_path / "patches" / "demo" / "1.0" / "0001-fix-answer.patch"
    assert upstream.header(text).strip() == HEADER.strip()
    assert "--- a/demo/core.py\n+++ b/demo/core.py\n" in text
    assert "-    return 41\n+    return 42\n" in text
    assert upstream.touched(text) == {"demo/core.py"}


def test_check_applies_in_order_and_reports_each_diff(tmp_path, release):
    root = tmp_path / "patches"
    _fixed(root, release, tmp_path)
    where, (result,) = upstream.check(root, "demo", "1.0", source=release)
    assert where.startswith("given") and result.ok and result.message == "applies"
    assert (release / "demo" / "core.py").read_text() == ORIGINAL  # only a copy was patched

    patched = tmp_path / "patched"
    upstream.patched_copy(root, "demo", "1.0", release / "demo", patched)
    _, (again,) = upstream.check(root, "demo", "1.0", source=patched)
    assert not again.ok and "already applied" in again.message

    (release / "demo" / "core.py").write_text(ORIGINAL.replace("return 41", "return 40"))
    _, (stale,) = upstream.check(root, "demo", "1.0", source=release)
    assert not stale.ok and stale.message.startswith("does not apply")


def test_check_reads_the_wheel_and_wants_every_header_section(tmp_path, release, monkeypatch):
    root = tmp_path / "patches"
    diff = _fixed(root, release, tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo-1.0-py3-none-any.whl", "w") as wheel:
        for path in (release / "demo").iterdir():
            wheel.write(path, f"demo/{path.name}")
    monkeypatch.setenv("SPECULATORS_HYBRID_WHEELS", str(wheels))
    where, (result,) = upstream.check(root, "demo", "1.0")
    assert where.startswith("wheel") and result.ok

    diff.write_text(diff.read_text().replace("Tests: t\n", ""))
    _, (result,) = upstream.check(root, "demo", "1.0")
    assert not result.ok and result.message == "applies; header lacks Tests:"


def test_unpack_replays_the_diffs_and_export_keeps_their_headers(tmp_path, release):
    root = tmp_path / "patches"
    diff = _fixed(root, release, tmp_path)
    diff.write_text(diff.read_text().replace("Problem: p", "Problem: edited in the file"))
    repo = tmp_path / "again"
    upstream.unpack(root, "demo", "1.0", repo, source=release)
    assert "return 42" in (repo / "demo" / "core.py").read_text()
    core = repo / "demo" / "core.py"
    core.write_text(core.read_text().replace("return 1\n", "return 2\n"))
    _commit(repo, "0002-fix-other\n\n" + HEADER)
    first, second = upstream.export(root, "demo", "1.0", repo)
    assert "Problem: edited in the file" in first.read_text()  # kept, body regenerated
    assert "+    return 2\n" in second.read_text() and "42" not in second.read_text()


def test_export_refuses_a_commit_that_names_no_patch(tmp_path, release):
    repo = tmp_path / "work"
    upstream.unpack(tmp_path / "patches", "demo", "1.0", repo, source=release)
    (repo / "demo" / "core.py").write_text("x = 1\n")
    _commit(repo, "tidy up")
    with pytest.raises(ValueError, match="is not NNNN-<patch-id>"):
        upstream.export(tmp_path / "patches", "demo", "1.0", repo)


def test_patched_copy_links_what_no_diff_touches(tmp_path, release):
    root = tmp_path / "patches"
    _fixed(root, release, tmp_path)
    copy = upstream.patched_copy(root, "demo", "1.0", release / "demo", tmp_path / "copy")
    assert (copy / "__init__.py").is_symlink()
    assert not (copy / "core.py").is_symlink() and "return 42" in (copy / "core.py").read_text()


def test_cli_check_exit_status(tmp_path, release, capsys):
    root = tmp_path / "patches"
    _fixed(root, release, tmp_path)
    args = ["patches", "check", "--root", str(root), "--project", "vllm", "--version", "1.0"]
    assert main(args) == 2  # no vLLM 1.0 diffs there
    assert (
        capsys.readouterr().err
        == "speculators-hybrid patches check: error: patches/ has no diffs for 1.0 (vllm none)\n"
    )
    assert main([*args[:4], "--version", "1.0"]) == 2  # nor speculators 1.0
    assert capsys.readouterr().err.endswith("for 1.0 (vllm none; speculators none)\n")
    assert main([*args[:-4], "--source", str(release)]) == 2  # --source needs one release


def test_cli_unpack_takes_a_root_relative_to_the_current_folder(tmp_path, monkeypatch):
    source = tmp_path / "pristine"
    (source / "vllm").mkdir(parents=True)
    (source / "vllm" / "core.py").write_text(ORIGINAL)
    repo = tmp_path / "work"
    upstream.unpack(tmp_path / "patches", "vllm", "9.9", repo, source=source)
    (repo / "vllm" / "core.py").write_text(ORIGINAL.replace("41", "42"))
    _commit(repo, f"0001-fix-answer\n\n{HEADER}")
    upstream.export(tmp_path / "patches", "vllm", "9.9", repo)
    monkeypatch.chdir(tmp_path)
    args = ["patches", "unpack", "--version", "9.9", "--root", "patches", "--source", "pristine"]
    assert main([*args, "again"]) == 0
    assert "return 42" in (tmp_path / "again" / "vllm" / "core.py").read_text()


def test_cli_unpack_and_export_say_what_went_wrong_in_one_line(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    assert main(["patches", "unpack", "--version", "9.9", str(tmp_path / "taken")]) == 2
    assert (
        capsys.readouterr().err
        == f"speculators-hybrid patches unpack: error: {tmp_path / 'taken'} exists: "
        "name a new folder\n"
    )
    (tmp_path / "plain").mkdir()  # not a repository made by unpack
    args = ["patches", "export", "--version", "9.9", "--root", str(tmp_path / "patches")]
    assert main([*args, str(tmp_path / "plain")]) == 2
    said = "is not a git repository: give the folder `unpack` made\n"
    assert (
        capsys.readouterr().err
        == f"speculators-hybrid patches export: error: {tmp_path / 'plain'} {said}"
    )
    assert main([*args, str(tmp_path / "nowhere")]) == 2
    said = "does not exist: give the folder `unpack` made\n"
    assert (
        capsys.readouterr().err
        == f"speculators-hybrid patches export: error: {tmp_path / 'nowhere'} {said}"
    )


def test_cli_unpack_that_fails_leaves_no_half_made_folder(tmp_path, capsys):
    source = tmp_path / "pristine"
    (source / "vllm").mkdir(parents=True)
    (source / "vllm" / "core.py").write_text("nothing the diff expects\n")
    diff = tmp_path / "patches" / "vllm" / "9.9" / "0001-fix-answer.patch"
    diff.parent.mkdir(parents=True)
    diff.write_text(f"{HEADER}\n--- a/vllm/core.py\n+++ b/vllm/core.py\n@@ -1 +1 @@\n-x\n+y\n")
    args = ["patches", "unpack", "--version", "9.9", "--root", str(tmp_path / "patches")]
    assert main([*args, "--source", str(source), str(tmp_path / "work")]) == 2
    assert capsys.readouterr().err.startswith(
        "speculators-hybrid patches unpack: error: git apply: "
    )
    assert not (tmp_path / "work").exists()


FAKE_PIP = """import shutil, sys
dest = sys.argv[sys.argv.index("-d") + 1]
name, version = sys.argv[-1].split("==")
shutil.copy(f"{name}-{version}-py3-none-any.whl", dest)  # a 'download': the made-up wheel
"""


def test_cli_check_says_what_it_downloads_and_only_when_asked(
    tmp_path, release, monkeypatch, capsys
):
    """Nothing installed here: a bare `check` downloads nothing; `--version` names the wheel
    and its size before fetching it, once; a cached wheel is not announced again."""
    root = tmp_path / "patches"
    _fixed(root, release, tmp_path)
    (root / "demo").rename(root / "vllm")  # the made-up package's diffs, as vLLM's
    made = tmp_path / "vllm-1.0-py3-none-any.whl"
    with zipfile.ZipFile(made, "w") as archive:
        archive.write(release / "demo" / "core.py", "demo/core.py")
    (tmp_path / "pip.py").write_text(FAKE_PIP)
    wheels = tmp_path / "wheels"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECULATORS_HYBRID_WHEELS", str(wheels))
    monkeypatch.setattr(upstream, "pip_command", lambda: [sys.executable, "pip.py"])
    monkeypatch.setattr(upstream, "wheel_sizes", lambda project: {"1.0": 2_500_000_000})
    monkeypatch.setattr(upstream, "_installed", lambda project, version: None)
    monkeypatch.setattr(upstream, "releases", lambda root, project: ["1.0"])

    from speculators_hybrid.versions import installed

    base = ["patches", "check", "--root", str(root), "--project", "vllm"]
    if installed("vllm") is None:
        assert main(base) == 2
        assert "nothing installed here to check (vllm: not installed here)" in (
            capsys.readouterr().err
        )
        assert not wheels.exists()
    for args in ([*base, "--version", "1.0"], [*base, "--all"]):
        assert main(args) == 0
        out = capsys.readouterr().out.splitlines()
        if args[-1] == "1.0":  # the first run fetches, the second finds it in the folder
            assert out[0] == f"downloading 1 wheel (2.5 GB) into {wheels}: vllm 1.0"
            out = out[1:]
        assert out[0].startswith(f"vllm 1.0 (wheel {wheels}/vllm-1.0-py3-none-any.whl)")
        assert out[1:] == ["  ok   0001-fix-answer.patch: applies"]
    assert [upstream._size(n) for n in (312_000, 41_000_000)] == ["312 kB", "41 MB"]
