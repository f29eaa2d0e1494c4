"""Our runtime patches as plain source diffs: `patches/<project>/<version>/NNNN-<patch-id>.patch`.

A diff is rooted at the folder that holds the package (`a/vllm/...`) and applies there with
`git apply -p1`; the diffs of one release apply in file-name order, each on top of the ones
before. The lines before the first `diff --git` are its header (git apply skips them): the
problem, the evidence, the fix, its relation to upstream and the tests that cover it.

- check: each diff applies to the release's pristine source, read from the installed package
  when its version is the release, else from the release's wheel (`pip download` into a cache
  folder, or a wheel already in $SPECULATORS_HYBRID_WHEELS); only the touched files are read.
  By default only the installed releases; other ones with `--version` or `--all`, which first
  say which wheels they download and how large they are.
- unpack: the release's package into a fresh git repository, one commit per existing diff
  (subject `NNNN-<patch-id>`, body the header).
- export: one diff per commit of such a repository, each keeping its header.

Workflow for a new or changed diff: `unpack`, edit the sources (amend the diff's commit, or add
a commit whose subject is the new `NNNN-<patch-id>` and whose body is its header), `export`,
then `check`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from speculators_hybrid import switches
from speculators_hybrid.usage import refuse

# The checkout's patches/, else the wheel's copy (package data via the link _patches), else
# ./patches.
_HERE = Path(__file__).resolve().parent
ROOT = next(
    (p for p in (_HERE.parent / "patches", _HERE / "_patches") if p.is_dir()), Path("patches")
)
SECTIONS = ("Problem:", "Evidence:", "Fix:", "Upstream:", "Tests:")
SUBJECT = re.compile(r"^\d{4}-[a-z0-9][a-z0-9_-]*$")  # patch ids may hold "_" (qwen3_5-...)
_IDENTITY = ["-c", "user.name=speculators-hybrid", "-c", "user.email=speculators-hybrid@localhost"]


def releases(root: Path, project: str) -> list[str]:
    folder = root / project
    if not folder.is_dir():
        return []
    return sorted((p.name for p in folder.iterdir() if p.is_dir()), key=Version)


def diffs(root: Path, project: str, version: str) -> list[Path]:
    return sorted((root / project / version).glob("*.patch"))


def header(text: str) -> str:
    """The lines before the first `diff --git`."""
    found = re.search(r"^diff --git ", text, re.MULTILINE)
    return text[: found.start()] if found else text


def touched(text: str) -> set[str]:
    """Paths of the existing files a diff changes (new files need no source)."""
    return set(re.findall(r"^--- a/(\S+)$", text, re.MULTILINE))


def _git(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=check
    )


def _installed(project: str, version: str) -> Path | None:
    """site-packages of the installed `project` if it is this release."""
    from importlib import metadata

    try:
        dist = metadata.distribution(project)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    return Path(str(dist.locate_file("")))


def wheel_folder() -> Path:
    """Where release wheels are read from, and downloaded to."""
    return Path(
        os.environ.get(switches.WHEELS) or Path.home() / ".cache" / "speculators-hybrid" / "wheels"
    )


def _wheel_pattern(project: str, version: str) -> str:
    return f"{project.replace('-', '_')}-{version}-*.whl"


def needs_download(project: str, version: str) -> bool:
    """Checking this release would download its wheel (not installed here, not in the folder)."""
    return _installed(project, version) is None and not any(
        wheel_folder().glob(_wheel_pattern(project, version))
    )


def wheel_sizes(project: str, timeout: float = 10) -> dict[str, int]:
    """Bytes of each release's wheel for this machine, from PyPI's JSON API ({} when it cannot
    be read): the largest wheel built for this CPU architecture or for any."""
    import json
    import platform
    import urllib.request

    try:
        with urllib.request.urlopen(f"https://pypi.org/pypi/{project}/json", timeout=timeout) as r:
            files = json.load(r)["releases"]
    except (OSError, ValueError, KeyError):
        return {}
    machine = platform.machine()
    sizes = {}
    for version, entries in files.items():
        fits = [
            int(e.get("size") or 0)
            for e in entries
            if e.get("filename", "").endswith(".whl")
            and (machine in e["filename"] or e["filename"].endswith("-any.whl"))
        ]
        if fits:
            sizes[version] = max(fits)
    return sizes


def wheel(project: str, version: str) -> Path:
    """The release's wheel, from $SPECULATORS_HYBRID_WHEELS or the cache (downloaded once)."""
    folder = wheel_folder()
    pattern = _wheel_pattern(project, version)
    found = sorted(folder.glob(pattern))
    if not found:
        pip = pip_command()
        if pip is None:
            raise FileNotFoundError(
                f"no wheel of {project} {version} in {folder}, and no pip to fetch it (a uv "
                "venv has none: `uv pip install pip`, or put uv on PATH); or put the wheel "
                "there, or set SPECULATORS_HYBRID_WHEELS to a folder that has it"
            )
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [*pip, "download", "--no-deps", "--only-binary=:all:"]
            + ["--python-version", f"{sys.version_info.major}.{sys.version_info.minor}"]
            + ["-d", str(folder), f"{project}=={version}"],
            capture_output=True,
            text=True,
        )
        found = sorted(folder.glob(pattern))
        if not found:
            raise FileNotFoundError(
                f"no wheel of {project} {version} in {folder} and `{' '.join(pip)} download` "
                f"could not fetch it ({done.stderr.strip()[-300:]}); put the wheel there or set "
                "SPECULATORS_HYBRID_WHEELS to a folder that has it"
            )
    return found[0]


def pip_command() -> list[str] | None:
    """This Python's pip; else pip run by uv (uv venvs have no pip); else a pip on PATH."""
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    uv = shutil.which("uv")
    if uv is not None:
        return [uv, "tool", "run", "pip"]
    found = shutil.which("pip3") or shutil.which("pip")
    return [found] if found else None


def pristine(
    project: str, version: str, files: set[str] | None, dest: Path, source: Path | None = None
) -> str:
    """Copy the release's files (all of `project/` if `files` is None) into `dest`.

    Returns where they came from. Compiled extensions are left out of a whole package.
    """
    base = source or _installed(project, version)
    if base is not None:
        names = files if files is not None else _package_files(base, project)
        for name in names:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if (base / name).exists():
                shutil.copyfile(base / name, target)
        return f"{'given' if source else 'installed'} {base}"
    path = wheel(project, version)
    with zipfile.ZipFile(path) as archive:
        members = set(archive.namelist())
        names = files if files is not None else _package_members(members, project)
        for name in sorted(set(names) & members):
            archive.extract(name, dest)
    return f"wheel {path}"


def _package_files(base: Path, project: str) -> set[str]:
    package = base / project.replace("-", "_")
    return {str(p.relative_to(base)) for p in package.rglob("*") if _wanted(p.name, p.is_file())}


def _package_members(members: set[str], project: str) -> set[str]:
    prefix = project.replace("-", "_") + "/"
    return {m for m in members if m.startswith(prefix) and _wanted(m, not m.endswith("/"))}


def _wanted(name: str, is_file: bool) -> bool:
    return is_file and not name.endswith((".so", ".pyc"))


@dataclass(frozen=True)
class Result:
    diff: Path
    ok: bool
    message: str


def check(
    root: Path, project: str, version: str, source: Path | None = None
) -> tuple[str, list[Result]]:
    """Apply a release's diffs in order to its pristine source; one result per diff."""
    found = diffs(root, project, version)
    texts = {d: d.read_text() for d in found}
    files = set().union(*(touched(t) for t in texts.values())) if texts else set()
    results = []
    with tempfile.TemporaryDirectory(prefix="spec-hybrid-check-") as tmp:
        tree = Path(tmp)
        where = pristine(project, version, files, tree, source)
        _git(["init", "-q"], tree)  # its own root: git apply paths are relative to it
        for diff in found:
            missing = [s for s in SECTIONS if s not in header(texts[diff])]
            applied = _git(["apply", "-p1", str(diff)], tree, check=False)
            if applied.returncode == 0:
                ok, message = (
                    not missing,
                    "applies" + (f"; header lacks {', '.join(missing)}" if missing else ""),
                )
            elif _git(["apply", "--check", "-R", "-p1", str(diff)], tree, check=False).returncode:
                ok, message = False, f"does not apply: {applied.stderr.strip()}"
            else:
                ok, message = False, "already applied to this source (it is not pristine)"
            results.append(Result(diff, ok, message))
    return where, results


def patched_copy(root: Path, project: str, version: str, package: Path, dest: Path) -> Path:
    """`package` (an installed `vllm/` folder) mirrored under `dest` with the diffs applied.

    Unchanged files are symbolic links to the installed ones; the touched ones are copies,
    patched. Put `dest` first on `sys.path` to import the patched package.
    """
    mirror = dest / package.name
    shutil.copytree(
        package, mirror, copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__")
    )
    found = diffs(root, project, version)
    for name in set().union(*(touched(d.read_text()) for d in found)):
        path = dest / name
        if path.is_symlink():
            path.unlink()
            shutil.copyfile(package.parent / name, path)
    _git(["init", "-q"], dest)
    for diff in found:
        applied = _git(["apply", "-p1", str(diff)], dest, check=False)
        if applied.returncode:
            raise RuntimeError(f"{diff} does not apply to {package}: {applied.stderr.strip()}")
    return mirror


def unpack(root: Path, project: str, version: str, dest: Path, source: Path | None = None) -> str:
    """The release's package in a new git repository at `dest`, one commit per diff."""
    dest.mkdir(parents=True, exist_ok=False)
    where = pristine(project, version, None, dest, source)
    _git(["init", "-q"], dest)
    _git(["add", "-A"], dest)
    _git(["commit", "-q", "-m", f"{project} {version} (pristine, from {where})"], dest)
    for diff in diffs(root, project, version):
        _git(["apply", "-p1", str(diff)], dest)
        _git(["add", "-A"], dest)
        _git(["commit", "-q", "-m", f"{diff.stem}\n\n{header(diff.read_text())}"], dest)
    return where


def export(root: Path, project: str, version: str, repo: Path) -> list[Path]:
    """Write one diff per commit after the pristine one, keeping each diff's header."""
    first = _git(["rev-list", "--max-parents=0", "HEAD"], repo).stdout.split()[0]
    commits = _git(["rev-list", "--reverse", f"{first}..HEAD"], repo).stdout.split()
    folder = root / project / version
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for commit in commits:
        subject = _git(["log", "-1", "--format=%s", commit], repo).stdout.strip()
        if not SUBJECT.match(subject):
            raise ValueError(f"commit {commit[:12]}: subject {subject!r} is not NNNN-<patch-id>")
        target = folder / f"{subject}.patch"
        kept = header(target.read_text()) if target.exists() else ""
        text = kept or _git(["log", "-1", "--format=%b", commit], repo).stdout.strip() + "\n\n"
        diff = _git(["diff", "--no-color", "--no-renames", f"{commit}^", commit], repo).stdout
        target.write_text(text + diff)
        written.append(target)
    return written


# ---- command line (`speculators-hybrid patches check|unpack|export`) ----


def _installed_release(root: Path, project: str) -> tuple[str | None, str]:
    """The installed release of `project` whose diffs are checked by default, and what to say
    when there is none."""
    from speculators_hybrid.versions import installed

    version = installed(project)
    if version is None:
        return None, f"{project}: not installed here"
    if diffs(root, project, version):
        return version, ""
    known = releases(root, project)
    return None, (
        f"{project} {version}: installed; patches/ has no diffs for this release"
        + (f" (it has {_span(known)})" if known else "")
    )


def _span(known: list[str]) -> str:
    return f"{known[0]} to {known[-1]}" if known else "none"


def _size(n: int) -> str:
    if n >= 1e8:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{max(1, round(n / 1e3))} kB"


def _announce(root: Path, todo: list[tuple[str, str]]) -> None:
    """Say which wheels checking `todo` will download, and how large they are, before it does."""
    fetch = [(p, v) for p, v in todo if diffs(root, p, v) and needs_download(p, v)]
    if not fetch or pip_command() is None:  # without pip, the check says what to do instead
        return
    sizes = {p: wheel_sizes(p) for p in {p for p, _ in fetch}}
    known = [sizes[p].get(v) for p, v in fetch]
    total = sum(n for n in known if n)
    how_large = (
        f"{_size(total)}" + (" and more" if None in known else "")
        if total
        else "size unknown: PyPI could not be read"
    )
    names = ", ".join(f"{p} {v}" for p, v in fetch)
    print(
        f"downloading {len(fetch)} wheel{'s' if len(fetch) > 1 else ''} ({how_large}) into "
        f"{wheel_folder()}: {names}",
        flush=True,
    )


def _check_cli(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    if args.source and len(args.project or ()) * len(args.version or ()) != 1:
        return refuse("patches check", "--source needs exactly one --project and one --version")
    if args.all and args.version:
        return refuse("patches check", "--all or --version, not both")
    projects = args.project or ("vllm", "speculators")
    todo: list[tuple[str, str]] = []
    skipped = []
    for project in projects:
        if args.all:
            todo += [(project, v) for v in releases(root, project)]
            continue
        if args.version:  # a release of another project is not asked for: left out
            todo += [(project, v) for v in args.version if diffs(root, project, v)]
            continue
        version, why = _installed_release(root, project)
        if version is None:
            skipped.append(why)
        else:
            todo.append((project, version))
    unknown = [v for v in args.version or () if all(v != w for _, w in todo)]
    if unknown:
        have = "; ".join(f"{p} {_span(releases(root, p))}" for p in projects)
        return refuse("patches check", f"patches/ has no diffs for {', '.join(unknown)} ({have})")
    if not (args.version or args.all):
        others = "--version V checks another release, --all every one (downloads their wheels)"
        if not todo:
            said = "; ".join(skipped)
            return refuse("patches check", f"nothing installed here to check ({said}); {others}")
        print(f"the installed releases; {others}")
        for why in skipped:
            print(why)
    if not args.source:
        _announce(root, todo)
    failed = 0
    for project, version in todo:
        if not diffs(root, project, version):
            print(f"{project} {version}: no diffs")
            failed += 1
            continue
        try:
            where, results = check(root, project, version, args.source)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"{project} {version}: no pristine source: {exc}")
            failed += 1
            continue
        print(f"{project} {version} ({where})")
        for result in results:
            print(f"  {'ok  ' if result.ok else 'FAIL'} {result.diff.name}: {result.message}")
            failed += not result.ok
    return 1 if failed else 0


def _failed(command: str, exc: Exception) -> int:
    """One line on stderr for a failed unpack or export, and exit status 2."""
    if isinstance(exc, subprocess.CalledProcessError):
        detail = (exc.stderr or "").strip().splitlines()[-1:] or [str(exc)]
        exc = RuntimeError(f"git {exc.cmd[len(_IDENTITY) + 1]}: {detail[0]}")
    return refuse(f"patches {command}", str(exc))


def _unpack_cli(args: argparse.Namespace) -> int:
    root, dest = Path(args.root).resolve(), Path(args.dest)
    if dest.exists():
        return _failed("unpack", FileExistsError(f"{dest} exists: name a new folder"))
    try:
        where = unpack(root, args.project, args.version, dest, args.source)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        shutil.rmtree(dest, ignore_errors=True)  # made here, half done
        return _failed("unpack", exc)
    print(f"{args.dest}: {args.project} {args.version} from {where}, one commit per diff")
    return 0


def _export_cli(args: argparse.Namespace) -> int:
    if not Path(args.repo, ".git").exists():
        why = "does not exist" if not Path(args.repo).exists() else "is not a git repository"
        return _failed("export", ValueError(f"{args.repo} {why}: give the folder `unpack` made"))
    try:
        written = export(Path(args.root).resolve(), args.project, args.version, Path(args.repo))
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        return _failed("export", exc)
    for path in written:
        print(f"wrote {path}")
    return 0


def add_cli(patches_sub: argparse._SubParsersAction) -> None:
    """`check`, `unpack` and `export` under `speculators-hybrid patches`."""
    root = dict(default=str(ROOT), help=f"the patches folder (default {ROOT})")
    source = dict(type=Path, help="a folder holding the pristine package, instead of the wheel")

    check_parser = patches_sub.add_parser(
        "check",
        help="do the diffs apply to their releases?",
        description="Apply each source diff under patches/ to its release's pristine source "
        "and say whether it applies. By default the installed vLLM and speculators releases "
        "are checked, from their installed files (no download). --version V or --all check "
        "other releases from their wheels, downloaded into $SPECULATORS_HYBRID_WHEELS or "
        "~/.cache/speculators-hybrid/wheels (what is fetched, and how large, is said first; "
        "every release's wheels are several GB). Exit status: 0 every diff applies, 1 one "
        "does not, 2 bad input or nothing to check.",
    )
    check_parser.add_argument(
        "--project",
        action="append",
        choices=("vllm", "speculators"),
        help="only this project's diffs (repeatable; default both)",
    )
    check_parser.add_argument(
        "--version",
        action="append",
        help="a release, its wheel downloaded unless installed (repeatable; default: the "
        "installed release)",
    )
    check_parser.add_argument(
        "--all",
        action="store_true",
        help="every release that has diffs (downloads the wheels not installed: several GB)",
    )
    check_parser.add_argument("--source", **source)  # type: ignore[arg-type]
    check_parser.add_argument("--root", **root)  # type: ignore[arg-type]
    check_parser.set_defaults(func=_check_cli)

    unpack_parser = patches_sub.add_parser(
        "unpack",
        help="a release as a git repo, diffs as commits",
        description="A release's package (installed, else its wheel, downloaded) in a new git "
        "repository: the pristine source, then one commit per diff under patches/. Edit, "
        "commit, then `export`.",
    )
    export_parser = patches_sub.add_parser(
        "export",
        help="regenerate a release's diffs from a repo",
        description="One diff under patches/ per commit of a repository made by `unpack`, "
        "each keeping its header (commit subjects NNNN-<patch-id>).",
    )
    for parser in (unpack_parser, export_parser):
        parser.add_argument(
            "--project",
            default="vllm",
            choices=("vllm", "speculators"),
            help="whose release (default vllm)",
        )
        parser.add_argument("--version", required=True, help="the release, e.g. 0.20.1")
        parser.add_argument("--root", **root)  # type: ignore[arg-type]
    unpack_parser.add_argument("dest", help="a new folder")
    unpack_parser.add_argument("--source", **source)  # type: ignore[arg-type]
    unpack_parser.set_defaults(func=_unpack_cli)
    export_parser.add_argument("repo", help="a folder made by `unpack`, with your commits")
    export_parser.set_defaults(func=_export_cli)
