"""The test matrix: tox.ini and the locked dependency set of each env, made from one table.

    .venv-tools/bin/python scripts/matrix.py tox     # tox.ini, from speculators_hybrid/support.py
    .venv-tools/bin/python scripts/matrix.py lock    # re-resolve every lock (on purpose)
    .venv-tools/bin/python scripts/matrix.py table   # the generated blocks of the pages (PAGES)
    .venv-tools/bin/python scripts/matrix.py check   # all of it up to date (tests/unit runs it)

(.venv-tools/ is made by scripts/test.sh.) Adding a release: add it to support.VLLM, then `tox`,
`lock vllm-<release>` and `table` (docs/maintaining.md has the whole checklist).

`table` writes each block between its markers: README.md's summary (the counts and releases a
user reads), docs/support.md's summary, family table, backend table and patch tables,
docs/development.md's env table, and patches/README.md's diff table. Every count on those
pages comes from here.

Each env installs exactly its lock, `tests/requirements/locks/<env>.txt`: `uv pip compile` of
the env's direct requirements for CPython 3.11 on x86_64 Linux, with the CPU torch wheel from
PIP_FIND_LINKS standing in for the CUDA one (tests/requirements/torch-cpu.txt) and GPU-only
packages left out (gpu-only.txt). A new upstream release changes nothing until `lock` is run.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from speculators_hybrid import support  # noqa: E402

REQUIREMENTS = ROOT / "tests" / "requirements"
LOCKS = REQUIREMENTS / "locks"
PACKAGE = ("wrapt>=1.14", "packaging>=21")  # pyproject.toml's dependencies
TEST = ("pytest>=7", "safetensors>=0.4")
TRANSFORMERS = "transformers>=5.6"
VERIFY = ("torch", TRANSFORMERS, "tqdm>=4.60")  # pyproject.toml's extra `verify`
# The fp8 backend's own writer and reader code: check's and verify's fp8 tests write and read
# files with it (torch and safetensors only)
CONNECTORS = f"hs-connectors=={support.HS_CONNECTORS}"
TOOLS = ("tox>=4.20", "tox-uv>=1.11", "wrapt>=1.14")  # .venv-tools: tox, uv, and this script
FIND_LINKS = os.environ.get("PIP_FIND_LINKS", "/opt/wheels")

PYTEST = "pytest -q -p no:cacheprovider"
LAUNCH_WITH_VLLM = "tests/unit/test_launch_vllm.py"  # the unit tests that need vLLM itself
# What differs with speculators installed: its models and loaders, the speculators diffs, `run`.
# (The launcher and `check` tests do not use speculators: the unit and check envs run them.)
SPECULATORS_TESTS = " ".join(
    ("tests/speculators", "tests/upstream/test_patched_speculators.py", "tests/unit/test_run.py")
)

# The Mooncake env (docs/mooncake.md): its vLLM (>= 0.22: hs-connectors' Mooncake connector needs
# HiddenStateCacheSpec), the transfer engine's CPU build, and rdma-core's libibverbs.so.1 from the
# pyverbs wheel (Mooncake's wheels leave it out; the only build of it for CPython 3.11 is 56.0rc1).
MOONCAKE_VLLM = "0.25.0"
MOONCAKE = "0.3.13.post1"
PYVERBS = "56.0rc1"
MOONCAKE_TESTS = "tests/cpu"
IBVERBS_DIR = "{env_tmp_dir}/ibverbs"


@dataclass(frozen=True)
class Env:
    name: str
    requires: tuple[str, ...]
    commands: tuple[str, ...]
    comment: str = ""
    skip_install: bool = False
    set_env: tuple[str, ...] = ()  # `NAME = value` lines added to [testenv]'s


def env_name(project: str, release: str) -> str:
    return f"{project}-{release}"


def envs() -> list[Env]:
    out = [
        Env(
            "lint",
            ("ruff>=0.6", "mypy>=1.10"),
            (
                "ruff check speculators_hybrid tests benchmarks scripts",
                "ruff format --check speculators_hybrid tests benchmarks scripts",
                "mypy speculators_hybrid benchmarks",
                "mypy --explicit-package-bases tests",
            ),
            skip_install=True,
        ),
        Env(
            "unit",
            PACKAGE + TEST,
            (f"{PYTEST} {{posargs:tests/unit}}",),
            "the framework, launcher and CLI: no vLLM",
        ),
    ]
    for release, tier in support.VLLM.items():
        tests = f"tests/cpu tests/upstream/test_patched_vllm.py {LAUNCH_WITH_VLLM}"
        tests += " tests/cli" if release in support.CLI else ""
        select = "" if tier == support.FULL else ' -m "not full_tier"'
        out.append(
            Env(
                env_name("vllm", release),
                PACKAGE + TEST + (TRANSFORMERS, f"vllm=={release}", CONNECTORS),
                (f"{PYTEST}{select} {{posargs:{tests}}}",),
                f"vLLM {release} on the CPU, {tier} tier",
            )
        )
    for release in support.SPECULATORS:
        # speculators pins hs-connectors itself from 0.8.1 on; repeated here to be visible
        connectors = (f"hs-connectors=={release}",) if Version(release) >= Version("0.8") else ()
        out.append(
            Env(
                env_name("speculators", release),
                PACKAGE
                + TEST
                + (TRANSFORMERS, "datasets>=4", f"vllm=={support.SPECULATORS_VLLM}")
                + (f"speculators=={release}",)
                + connectors,
                (f"{PYTEST} {{posargs:{SPECULATORS_TESTS}}}",),
                f"speculators {release} beside vLLM {support.SPECULATORS_VLLM}",
            )
        )
    out.append(
        Env(
            "mooncake",
            PACKAGE
            + TEST
            + (TRANSFORMERS, "datasets>=4", f"vllm=={MOONCAKE_VLLM}", "speculators==0.9.0")
            + (CONNECTORS, f"mooncake-transfer-engine-non-cuda=={MOONCAKE}")
            + (f"pyverbs=={PYVERBS}",),
            (
                f"python {MOONCAKE_TESTS}/mooncake_store.py libibverbs {IBVERBS_DIR}",
                f"{PYTEST} {{posargs:{MOONCAKE_TESTS}/test_mooncake_store.py "
                f"{MOONCAKE_TESTS}/test_mooncake_aborts.py}}",
            ),
            f"a real Mooncake store on loopback: hs-connectors' put, the trainer's get and delete, "
            f"aborted prompts (vLLM {MOONCAKE_VLLM}, speculators 0.9.0)",
            set_env=(
                f"LD_LIBRARY_PATH = {IBVERBS_DIR}:{{envsitepackagesdir}}/pyverbs.libs",
                "SPECULATORS_HYBRID_MOONCAKE = 1",  # here the store must run: no skip
            ),
        )
    )
    out.append(
        Env(
            "check",
            PACKAGE + TEST + ("torch", "datasets>=4", CONNECTORS),
            (
                f"{PYTEST} {{posargs:tests/unit/test_check.py tests/unit/test_check_fp8.py "
                "tests/unit/test_safetensors_write.py "
                "tests/unit/test_host_copy.py tests/unit/test_run.py}",
            ),
            "`check`, `run`, the file writer and its copy pieces alone: torch + datasets, no vLLM, "
            "no speculators",
        )
    )
    out.append(
        Env(
            "verify",
            PACKAGE + TEST + VERIFY + (CONNECTORS,),
            (f"{PYTEST} {{posargs:tests/verify}}",),
            "`verify` with tiny random models: torch + transformers, no vLLM",
        )
    )
    return out


HEADER = """\
# Generated by scripts/matrix.py from speculators_hybrid/support.py: do not edit by hand.
# Each env installs its lock (tests/requirements/locks/<env>.txt) with the CPU torch wheel from
# PIP_FIND_LINKS; `python scripts/matrix.py lock` re-resolves the locks on purpose.
[tox]
requires =
    tox>=4.20
    tox-uv>=1.11
env_list =
{env_list}

[testenv]
runner = uv-venv-runner
package = wheel
set_env =
    UV_FIND_LINKS = {{env:PIP_FIND_LINKS:/opt/wheels}}
    UV_OVERRIDE = {{tox_root}}/tests/requirements/torch-cpu.txt
    UV_EXCLUDE = {{tox_root}}/tests/requirements/gpu-only.txt
    UV_CONSTRAINT = {{tox_root}}/tests/requirements/locks/{{env_name}}.txt
    VLLM_LOGGING_LEVEL = WARNING
pass_env = PIP_FIND_LINKS, HOME
deps = -r {{tox_root}}/tests/requirements/locks/{{env_name}}.txt
"""


def tox_ini() -> str:
    names = [e.name for e in envs()]
    text = HEADER.format(env_list="\n".join(f"    {n}" for n in names))
    for env in envs():
        text += "\n" + (f"# {env.comment}\n" if env.comment else "") + f"[testenv:{env.name}]\n"
        if env.skip_install:
            text += "skip_install = true\n"
        if env.set_env:
            lines = ("{[testenv]set_env}", *env.set_env)
            text += "set_env =\n" + "".join(f"    {e}\n" for e in lines)
        text += "commands =\n" + "".join(f"    {c}\n" for c in env.commands)
    return text


def lock_header(env: Env) -> str:
    return (
        f"# Lock of tox env {env.name}, made by `python scripts/matrix.py lock`: do not edit.\n"
        f"# Direct requirements: {', '.join(env.requires)}\n"
    )


def compile_lock(env: Env) -> str:
    """`uv pip compile` of the env's requirements: the lock's text. The pins of the env's
    current lock are kept where they still fit (uv prefers an output file's pins), so a new
    requirement adds its packages without moving the others."""
    beside = Path(sys.executable).parent / "uv"  # .venv-tools/bin/uv
    uv = os.environ.get("UV") or (str(beside) if beside.exists() else "uv")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / f"{env.name}.in"
        source.write_text("\n".join(env.requires) + "\n")
        output = Path(tmp) / f"{env.name}.txt"
        current = LOCKS / f"{env.name}.txt"
        if current.exists():
            output.write_text(current.read_text())
        done = subprocess.run(
            [uv, "pip", "compile", "-q", str(source), "--no-header", "--no-annotate"]
            + ["--output-file", str(output)]
            + ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]
            + ["--overrides", str(REQUIREMENTS / "torch-cpu.txt")]
            + ["--excludes", str(REQUIREMENTS / "gpu-only.txt")]
            + ["--find-links", FIND_LINKS],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"matrix: cannot lock {env.name}: {done.stderr.strip()}")
        return lock_header(env) + output.read_text()


TABLE_START = "<!-- support table: made by `python scripts/matrix.py table`, do not edit -->\n"
TABLE_END = "<!-- end of support table -->\n"
APPLIED, NOT_NEEDED, FIXED = "●", "·", "✓"


def _tests_naming(patch_id: str) -> list[str]:
    """The test files whose module docstring names the patch."""
    found = []
    for folder in ("cpu", "gpu", "speculators", "unit", "upstream"):
        for path in sorted((ROOT / "tests" / folder).glob("test_*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if re.search(rf"(?<![\w-]){re.escape(patch_id)}(?![\w-])", doc):
                found.append(f"{folder}/{path.name}")
    return found


def _cell(patch: Any, release: str) -> str:
    if patch.project == "hs-connectors":  # the release every vLLM env installs
        return APPLIED if patch.needed_for(support.HS_CONNECTORS) else NOT_NEEDED
    if patch.needed_for(release):
        return APPLIED
    earlier = [r for r in support.VLLM if Version(r) < Version(release)]
    later = [r for r in support.VLLM if Version(r) > Version(release)]
    ended = not any(patch.needed_for(r) for r in later)  # a gap in its range is not a fix
    fixed = not patch.fixed_upstream.startswith("none")  # ended for another reason
    return FIXED if fixed and ended and any(patch.needed_for(r) for r in earlier) else NOT_NEEDED


def support_table() -> str:
    """docs/support.md's tables: vLLM release x patch, then each patch with its upstream fix and
    tests."""
    from speculators_hybrid.speculators_patches import PATCHES as SPECULATORS_PATCHES
    from speculators_hybrid.vllm_patches import PATCHES

    releases = list(support.VLLM)
    short = [r.removeprefix("0.") for r in releases]
    lines = [
        f"vLLM release x patch: {APPLIED} applied, {FIXED} fixed upstream by then, "
        f"{NOT_NEEDED} not needed there. Tier: the CPU tests each release runs "
        "(speculators_hybrid/support.py); GPU: proven on an H200 (tests/gpu/results/).",
        "",
        "| patch | " + " | ".join(short) + " |",
        "|---|" + "---|" * len(releases),
    ]
    lines[0] = _fill(lines[0])
    for patch in PATCHES:
        lines.append(f"| `{patch.id}` | " + " | ".join(_cell(patch, r) for r in releases) + " |")
    tiers = [support.VLLM[r][0].upper() for r in releases]
    lines.append("| tier (F full, D decisive) | " + " | ".join(tiers) + " |")
    proven = gpu_proven()
    gpu = [proven.get(r, "") for r in releases]
    lines.append("| GPU-proven (model runner) | " + " | ".join(gpu) + " |")
    lines += ["", "| patch | project, versions | what it does | upstream | tests |"]
    lines.append("|---|---|---|---|---|")
    for patch in (*PATCHES, *SPECULATORS_PATCHES):
        what = patch.why.strip().split("\n")[0].rstrip(".")
        tests = ", ".join(f"`{t}`" for t in _tests_naming(patch.id)) or "none"
        lines.append(
            f"| `{patch.id}` | {patch.project} `{patch.versions}` | {what} | "
            f"{patch.fixed_upstream} | {tests} |"
        )
    return TABLE_START + "\n".join(lines) + "\n" + TABLE_END


FAMILY_START = "<!-- family table: made by `python scripts/matrix.py table`, do not edit -->\n"
FAMILY_END = "<!-- end of family table -->\n"
EXTRACTS, GPU_MATCHED, REFUSED = "●", "◉", "✗"


GPU_RESULTS = ROOT / "tests" / "gpu" / "results"


def gpu_matched_families(folder: Path = GPU_RESULTS) -> dict[str, set[str]]:
    """model_type -> the vLLM releases where a GPU run's files matched transformers: the
    cases of tests/gpu/results/*.json that test_hidden_states_match.check_case wrote (they
    carry `min_cos_per_id`) with no problems. A case is named `<family>-...`, Qwen3.5's
    `qwen3_5-multimodal-...` (model_type qwen3_5) or `qwen3_5-text-...` (qwen3_5_text)."""
    found: dict[str, set[str]] = {}
    for _, name, case in _matched_cases(folder):
        family, _, rest = name.partition("-")
        if rest.startswith("text-"):
            family += "_text"
        found.setdefault(family, set()).add(case["vllm"])
    return found


def _matched_cases(folder: Path) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(file, case name, case) for each case whose files matched transformers."""
    for path in sorted(folder.glob("*.json")):
        for name, case in json.loads(path.read_text()).get("cases", {}).items():
            if isinstance(case, dict) and "min_cos_per_id" in case and not case.get("problems"):
                yield path, name, case


def gpu_proven(folder: Path = GPU_RESULTS) -> dict[str, str]:
    """vLLM release -> the model runner(s) of its GPU runs whose files matched transformers.
    Results written before they recorded `runner` (to 2026-12-07) all ran V1: 0.20-0.28 run
    hybrid extraction on V1, and every such run was on 0.20.1, 0.24.0 or 0.25.0."""
    runners: dict[str, set[str]] = {}
    for _, _, case in _matched_cases(folder):
        runners.setdefault(case["vllm"], set()).add(case.get("runner") or "V1")
    return {r: "+".join(sorted(runners[r])) for r in sorted(runners, key=Version)}


def family_table() -> str:
    """docs/support.md's model family x vLLM release table, from speculators_hybrid/families.py."""
    from speculators_hybrid.families import FAMILIES

    releases = list(support.VLLM)
    lines = [
        f"Hybrid model family x vLLM release (with this plugin): {GPU_MATCHED} extracts and "
        f"matched transformers on an H200, {EXTRACTS} extracts (proven on the CPU: planning, "
        f"EAGLE-3 wiring), {REFUSED} refused by `launch` and `doctor` (the model class has no "
        "EAGLE-3 hidden states there; the last column names the first release that has "
        "them). Other (dense) models: vLLM's own path. Checked against each release's classes "
        "by `tests/cpu/test_families.py`; GPU runs in `tests/gpu/results/`.",
        "",
        "| model_type | vLLM class | "
        + " | ".join(r.removeprefix("0.") for r in releases)
        + " | first release |",
        "|---|---|" + "---|" * (len(releases) + 1),
    ]
    lines[0] = _fill(lines[0])
    matched = gpu_matched_families()
    for f in FAMILIES:
        proven = matched.get(f.model_type, set())
        cells = [
            (GPU_MATCHED if r in proven else EXTRACTS) if f.extracts_on(r) else REFUSED
            for r in releases
        ]
        lines.append(
            f"| `{f.model_type}` | `{f.architecture}` | "
            + " | ".join(cells)
            + f" | {f.first or f'none up to {releases[-1]}'} |"
        )
    return FAMILY_START + "\n".join(lines) + "\n" + FAMILY_END


BACKEND_START = "<!-- backend table: made by `python scripts/matrix.py table`, do not edit -->\n"
BACKEND_END = "<!-- end of backend table -->\n"
WORKS = "●"


def backend_table() -> str:
    """docs/support.md's hidden-state backend x vLLM release table, from
    speculators_hybrid/backends.py."""
    from speculators_hybrid.backends import BACKENDS

    releases = list(support.VLLM)
    lines = [
        _fill(
            f"speculators' hidden-state backend (`--hidden-states-backend`, hs-connectors "
            f"{support.HS_CONNECTORS}) x vLLM release, hybrid targets with this plugin: {WORKS} "
            f"works (proven on the CPU by `tests/cpu/test_backend_matrix.py`), {REFUSED} refused "
            "by `launch` before the server starts, naming the first release that works."
        ),
        "",
        "| backend | " + " | ".join(r.removeprefix("0.") for r in releases) + " | served by |",
        "|---|" + "---|" * (len(releases) + 1),
    ]
    for b in BACKENDS:
        cells = [WORKS if b.works_on(r) else REFUSED for r in releases]
        why = f"; before {b.first}: refused, {b.before}" if b.before else ""
        lines.append(f"| `{b.name}` | " + " | ".join(cells) + f" | {b.how}{why} |")
    return BACKEND_START + "\n".join(lines) + "\n" + BACKEND_END


DIFFS_START = "<!-- diff table: made by `python scripts/matrix.py table`, do not edit -->\n"
DIFFS_END = "<!-- end of diff table -->\n"
PATCHES_DIR = ROOT / "patches"


def _releases(project: str, found: list[str]) -> str:
    """`found` releases; each run of more than 3 consecutive matrix releases as
    `first – last (n)`."""
    matrix = list(support.VLLM if project == "vllm" else support.SPECULATORS)
    name = "vLLM" if project == "vllm" else "speculators"
    runs: list[list[str]] = []
    for release in sorted(found, key=Version):
        at = matrix.index(release) if release in matrix else None
        last = runs[-1][-1] if runs else None
        if runs and at is not None and last in matrix and matrix.index(last) == at - 1:
            runs[-1].append(release)
        else:
            runs.append([release])
    parts = []
    for run in runs:
        parts += [f"{run[0]} – {run[-1]} ({len(run)})"] if len(run) > 3 else run
    return f"{name} {', '.join(parts)}"


def diff_table() -> str:
    """patches/README.md's table: each patch with a diff, the releases that have one, and its
    upstream status (the registry's `fixed_upstream`)."""
    from speculators_hybrid.speculators_patches import PATCHES as SPECULATORS_PATCHES
    from speculators_hybrid.vllm_patches import PATCHES

    lines = ["| patch | versions with a diff | upstream |", "|---|---|---|"]
    for patch in (*PATCHES, *SPECULATORS_PATCHES):
        found = [
            d.name
            for d in sorted((PATCHES_DIR / patch.project).glob("*"))
            if list(d.glob(f"[0-9][0-9][0-9][0-9]-{patch.id}.patch"))
        ]
        if found:
            versions = _releases(patch.project, found)
            lines.append(f"| {patch.id} | {versions} | {patch.fixed_upstream} |")
    return DIFFS_START + "\n".join(lines) + "\n" + DIFFS_END


def _fill(text: str) -> str:
    """A paragraph of at most 100 characters a line, as the pages are written."""
    return textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False)


def _wrap(text: str) -> str:
    """A list item of at most 100 characters a line, as the pages are written."""
    return textwrap.fill(text, width=100, subsequent_indent="  ", break_on_hyphens=False)


def _names(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else "".join(items)


def _run_dates(folder: Path = GPU_RESULTS) -> str:
    """The first and last day of the GPU runs whose files matched, from the result files' names."""
    names = " ".join(sorted({path.name for path, _, _ in _matched_cases(folder)}))
    days = sorted(re.findall(r"\d{4}-\d{2}-\d{2}", names))
    return f"{days[0]} to {days[-1]}" if days else "no run yet"


SUMMARY_START = "<!-- summary: made by `python scripts/matrix.py table`, do not edit -->\n"
SUMMARY_END = "<!-- end of summary -->\n"


def summary() -> str:
    """The counts and releases a user reads first (README.md, docs/support.md), from
    support.py, families.py, the patch registry, tox.ini's envs and tests/gpu/results/."""
    from speculators_hybrid.families import FAMILIES
    from speculators_hybrid.speculators_patches import PATCHES as SPECULATORS_PATCHES
    from speculators_hybrid.vllm_patches import PATCHES

    releases = list(support.VLLM)
    full = [r for r in releases if support.VLLM[r] == support.FULL]
    matched = {f.model_type for f in FAMILIES if f.model_type in gpu_matched_families()}
    runners = gpu_proven()
    proven = list(runners)
    extracting = [f for f in FAMILIES if f.first is not None]
    later = [f"`{f.model_type}` from {f.first}" for f in extracting if f.first != releases[0]]
    refused = [f"`{f.model_type}`" for f in FAMILIES if f.first is None]
    items = [
        f"- vLLM: {len(releases)} releases, {support.OLDEST} to {support.NEWEST}, each tested on "
        f"the CPU: {len(full)} in the full tier ({_names(full)}), the other "
        f"{len(releases) - len(full)} in the decisive tier.",
        f"- GPU-proven (files matched transformers on an H200, {_run_dates()}; "
        "`tests/gpu/results/`): vLLM "
        f"{_names(proven)}, on the model runner "
        f"{_names(sorted(set(runners.values())))}.",
        f"- speculators: {_names(list(support.SPECULATORS))}, each tested beside vLLM "
        f"{support.SPECULATORS_VLLM}.",
        f"- Hybrid families: {len(extracting)} of {len(FAMILIES)} extract with the plugin ("
        + ", ".join(f"`{f.model_type}`" for f in extracting)
        + (f"; {_names(later)}" if later else "")
        + f"), {len(matched)} of them matched on a GPU ("
        + ", ".join(f"`{f.model_type}`" for f in FAMILIES if f.model_type in matched)
        + ")"
        + (f"; {_names(refused)}: on no release up to {releases[-1]}" if refused else "")
        + ".",
        f"- Patches: {len(PATCHES)} for vLLM, {len(SPECULATORS_PATCHES)} for speculators. Test "
        f"matrix: {len(envs())} tox envs.",
    ]
    return SUMMARY_START + "\n".join(_wrap(i) for i in items) + "\n" + SUMMARY_END


ENVS_START = "<!-- env table: made by `python scripts/matrix.py table`, do not edit -->\n"
ENVS_END = "<!-- end of env table -->\n"


def env_table() -> str:
    """docs/development.md's table: each tox env and what it tests."""
    lines = [f"The {len(envs())} envs of tox.ini:", "", "| env | what it tests |", "|---|---|"]
    for env in envs():
        tools = sorted({c.split()[0] for c in env.commands})
        lines.append(f"| `{env.name}` | {env.comment or 'style and types: ' + ', '.join(tools)} |")
    return ENVS_START + "\n".join(lines) + "\n" + ENVS_END


# Each generated block: its markers and what makes it.
BLOCKS = {
    "summary": (SUMMARY_START, SUMMARY_END, summary),
    "family": (FAMILY_START, FAMILY_END, family_table),
    "backend": (BACKEND_START, BACKEND_END, backend_table),
    "support": (TABLE_START, TABLE_END, support_table),
    "envs": (ENVS_START, ENVS_END, env_table),
    "diffs": (DIFFS_START, DIFFS_END, diff_table),
}
# The pages that hold generated blocks (relative to ROOT), and which.
PAGES = {
    "README.md": ("summary",),
    "docs/support.md": ("summary", "family", "backend", "support"),
    "docs/development.md": ("envs",),
    "patches/README.md": ("diffs",),
}


def _between(text: str, start: str, end: str, made: str, where: str) -> str:
    if start not in text or end not in text:
        raise SystemExit(f"matrix: {where} has no markers {start.strip()}")
    head, rest = text.split(start, 1)
    return head + made + rest.split(end, 1)[1]


def page_with_blocks(page: str, text: str) -> str:
    """The page's text with each of its generated blocks made again."""
    for block in PAGES[page]:
        start, end, make = BLOCKS[block]
        text = _between(text, start, end, make(), page)
    return text


def tools_env() -> Env:
    return Env("tools", TOOLS, ())


def problems() -> list[str]:
    """What is out of date: tox.ini, a missing lock, a lock made for other requirements."""
    found = []
    if (ROOT / "tox.ini").read_text() != tox_ini():
        found.append("tox.ini differs from the matrix: run `python scripts/matrix.py tox`")
    for page in PAGES:
        text = (ROOT / page).read_text()
        try:
            stale = page_with_blocks(page, text) != text
        except SystemExit as exc:  # markers missing
            found.append(f"{exc}: put them back, then run `python scripts/matrix.py table`")
            continue
        if stale:
            found.append(f"{page}'s tables are stale: run `python scripts/matrix.py table`")
    for env in [*envs(), tools_env()]:
        if env.skip_install and not env.requires:
            continue
        lock = LOCKS / f"{env.name}.txt"
        if not lock.exists():
            found.append(f"locks/{lock.name} is missing: run `python scripts/matrix.py lock`")
        elif not lock.read_text().startswith(lock_header(env)):
            found.append(f"locks/{lock.name} was made for other requirements: re-lock it")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/matrix.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("tox", help="write tox.ini")
    lock = sub.add_parser("lock", help="re-resolve the locks")
    lock.add_argument("names", nargs="*", help="envs to re-lock (default: all)")
    sub.add_parser("table", help="write the generated blocks of " + ", ".join(PAGES))
    sub.add_parser("check", help="exit 1 if tox.ini, a lock or a generated block is out of date")
    args = parser.parse_args(argv)
    if args.what == "tox":
        (ROOT / "tox.ini").write_text(tox_ini())
    elif args.what == "table":
        for page in PAGES:
            (ROOT / page).write_text(page_with_blocks(page, (ROOT / page).read_text()))
    elif args.what == "lock":
        LOCKS.mkdir(parents=True, exist_ok=True)
        for env in [*envs(), tools_env()]:
            if not args.names or env.name in args.names:
                (LOCKS / f"{env.name}.txt").write_text(compile_lock(env))
                print(f"locked {env.name}")
    else:
        for problem in problems():
            print(problem)
        return 1 if problems() else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
