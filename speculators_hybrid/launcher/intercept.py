"""Run a speculators `launch_vllm.py` in this process, unchanged, and catch the command it
would exec (os.exec* or a subprocess that starts `vllm serve`) instead of running it."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from speculators_hybrid.launcher import LaunchError
from speculators_hybrid.launcher.command import Command

BANNER = "Running command:"


class _Exec(BaseException):
    """Unwinds the launcher at its exec (BaseException: `except Exception` won't swallow it)."""

    def __init__(self, command: Command):
        super().__init__(command.argv)
        self.command = command


class LauncherExit(Exception):
    """The launcher exited by itself (--help, a usage error)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _argv(args: Any) -> list[str]:
    return shlex.split(args) if isinstance(args, str) else [os.fsdecode(a) for a in args]


def _is_vllm(argv: list[str]) -> bool:
    return "serve" in argv and any("vllm" in a for a in argv)


def _exec(search_path: bool, with_env: bool) -> Callable[..., NoReturn]:
    def fake(file: Any, args: Sequence[Any], env: Any = None) -> NoReturn:
        raise _Exec(
            Command(os.fsdecode(file), _argv(args), dict(env) if with_env else None, search_path)
        )

    return fake


class _Popen(subprocess.Popen):  # type: ignore[type-arg]
    def __init__(self, args: Any, *rest: Any, **kwargs: Any):
        argv = _argv(args)
        if _is_vllm(argv):
            env = kwargs.get("env")
            raise _Exec(Command(argv[0], argv, dict(env) if env is not None else None))
        super().__init__(args, *rest, **kwargs)


@contextlib.contextmanager
def _options_seen(seen: set[str]) -> Iterator[None]:
    """Collect the option strings of every argparse parser that parses while this is on (the
    launcher's CLI tells its generation: launcher/adjust.py's `launcher_generation`)."""
    import argparse

    original = argparse.ArgumentParser.parse_known_args

    def recording(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        seen.update(self._option_string_actions)
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.parse_known_args = recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _intercepted(script: Path, args: list[str]) -> Iterator[None]:
    saved_os = {n: getattr(os, n) for n in ("execv", "execve", "execvp", "execvpe")}
    saved = (sys.argv, list(sys.path), subprocess.Popen)
    os.execv, os.execve = _exec(False, False), _exec(False, True)  # type: ignore[assignment]
    os.execvp, os.execvpe = _exec(True, False), _exec(True, True)  # type: ignore[assignment]
    subprocess.Popen = _Popen  # type: ignore[misc]
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # as `python script.py` does
    try:
        yield
    finally:
        for name, fn in saved_os.items():
            setattr(os, name, fn)
        sys.argv, sys.path[:], subprocess.Popen = saved  # type: ignore[misc]


@contextlib.contextmanager
def _warnings_to(log: Callable[[str], None] | None) -> Iterator[None]:
    """The launcher's warnings (speculators' `Using custom target layer ids`) as log lines."""
    if log is None:
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for warning in caught:
                log(f"launcher: {' '.join(str(warning.message).split())}")


def _without_banner(text: str) -> str:
    """The launcher's own output less its `Running command:` block (we print the final one)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\n") == BANNER:
            return "".join(lines[:i] + lines[i + 2 :])
    return text


def capture(script: str, args: list[str], log: Callable[[str], None] | None = None) -> Command:
    """The command `python SCRIPT ARGS...` would exec; the launcher's other output is kept,
    and its Python warnings are given to `log` as one line each (shown as they come without
    it)."""
    path = Path(script).expanduser()
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise LaunchError(f"cannot read launcher {script}: {exc.strerror or exc}") from exc
    if not path.is_file():
        raise LaunchError(f"launcher {script} is not a file")
    if path.suffix != ".py":  # a config.json or a model file given by mistake is not run
        raise LaunchError(
            f"launcher {script} is not a Python script: give speculators' scripts/launch_vllm.py"
        )
    out = io.StringIO()
    options: set[str] = set()
    try:
        with (
            _intercepted(path.resolve(), args),
            contextlib.redirect_stdout(out),
            _warnings_to(log),
            _options_seen(options),
        ):
            runpy.run_path(str(path), run_name="__main__")
    except _Exec as caught:
        sys.stdout.write(_without_banner(out.getvalue()))
        return replace(caught.command, launcher_options=frozenset(options))
    except SystemExit as exc:
        sys.stdout.write(out.getvalue())
        if exc.code is None or isinstance(exc.code, int):
            raise LauncherExit(exc.code or 0) from None
        raise LaunchError(f"launcher {script} exited: {exc.code}") from None
    except Exception as exc:
        sys.stdout.write(out.getvalue())
        raise LaunchError(f"launcher {script} failed: {type(exc).__name__}: {exc}") from exc
    sys.stdout.write(out.getvalue())
    raise LaunchError(
        f"launcher {script} finished without exec'ing a command (is it speculators' "
        "scripts/launch_vllm.py?)"
    )
