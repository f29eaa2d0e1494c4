"""What our vLLM plugin adds to every vLLM process: import and patch time, on the CPU.

vLLM calls `load_general_plugins()` in its front end, its engine core and each worker; ours
imports the package, selects the patches for the installed vLLM and arms post-import hooks
that wrap (and fingerprint) each target when vLLM imports its module. Each sample is a fresh
interpreter that times `import vllm`, then `load_general_plugins()`, then the import of every
module we patch (which the engine core imports anyway; that is where the hooks fire), in
three modes:

- ours:     the plugin as installed;
- disabled: `SPECULATORS_HYBRID_DISABLE=1` (our entry point still loads, then returns);
- excluded: `VLLM_PLUGINS` lists every general plugin but ours (ours is never imported).

Added cost per process = median(ours) - median(excluded) of plugins + targets. A
`python -X importtime` run per mode names our modules and the modules only ours imports.

    PYTHONPATH=$PWD python benchmarks/import_cost.py --python .tox/vllm-0.20.1/bin/python \
        --python .tox/vllm-0.25.0/bin/python --runs 15 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("ours", "disabled", "excluded")
TARGET_MS = 20.0
MARK = "IMPORT_COST_JSON "

# Runs in the measured interpreter: `{mods}` are the modules our patches target.
CHILD = """
import time
t0 = time.perf_counter()
import vllm
t1 = time.perf_counter()
from vllm.plugins import load_general_plugins
load_general_plugins()
t2 = time.perf_counter()
import importlib
for name in {mods!r}:
    importlib.import_module(name)
t3 = time.perf_counter()
import json, sys
ours = sorted(m for m in sys.modules if m.split(".")[0] == "speculators_hybrid")
print({mark!r} + json.dumps(dict(import_vllm=t1 - t0, plugins=t2 - t1, targets=t3 - t2,
                                 total=t3 - t0, modules=len(sys.modules), ours=ours)))
"""

# Our part alone, timed from inside: what the entry point's load (the import) and call do,
# then the hooks (wrap + fingerprint) that fire as vLLM imports the targets.
DIRECT = """
import time
import vllm
def clock():
    return time.perf_counter(), time.thread_time()
def since(start):
    now = clock()
    return now[0] - start[0], now[1] - start[1]
start = clock()
import speculators_hybrid.plugin as plugin
imported = since(start)
spent = [0.0, 0.0]
start = clock()
if not plugin.disabled():
    # register() imports the patch framework (or the plugin's import did): import it here,
    # inside register()'s time, to time the hooks it arms. Disabled, register() imports none.
    from speculators_hybrid.registry import Patcher
    on_import = Patcher._on_import
    def timed(self, module):
        start = clock()
        try:
            return on_import(self, module)
        finally:
            took = since(start)
            spent[0] += took[0]
            spent[1] += took[1]
    Patcher._on_import = timed
plugin.register()
registered = since(start)
early = list(spent)  # hooks for targets already imported fire inside register()
import importlib
for name in {mods!r}:
    importlib.import_module(name)
hooks = (spent[0] - early[0], spent[1] - early[1])
import json
out = {{}}
for i, end in ((0, ""), (1, "_cpu")):
    parts = {{"import_plugin": imported[i], "register": registered[i], "hooks": hooks[i]}}
    parts["ours"] = sum(parts.values())
    out.update({{name + end: value for name, value in parts.items()}})
print({mark!r} + json.dumps(out))
"""

# Run once per interpreter: versions, the modules our patches target, the other plugins.
PROBE = """
import importlib.util, json, platform, sys
from importlib import metadata
import speculators_hybrid
from speculators_hybrid.versions import installed
from speculators_hybrid.vllm_patches import PATCHES
v = installed("vllm")
mods = sorted({t.module for p in PATCHES if p.needed_for(v) for t in p.targets_for(v)})
eps = [e.name for e in metadata.entry_points(group="vllm.general_plugins")]
print(json.dumps(dict(python=platform.python_version(), vllm=v, torch=installed("torch"),
                      speculators_hybrid=installed("speculators-hybrid"),
                      source=speculators_hybrid.__file__,
                      patches=[p.id for p in PATCHES if p.needed_for(v)],
                      target_modules=mods, plugins=eps,
                      torchvision=importlib.util.find_spec("torchvision") is not None)))
"""


def mode_env(mode: str, plugins: list[str], tree: Path = ROOT, cpu: bool = False) -> dict:
    """The environment of one mode: the caller's, with `tree` (our source) first on the path.

    `cpu`: no torchvision here, so vLLM's Qwen3.5 module (a target on some versions) needs our
    inert stand-in (`speculators_hybrid/cpu_standins`), on the path in every mode alike.
    """
    env = dict(os.environ)
    paths = [str(tree), str(tree / "speculators_hybrid" / "cpu_standins") if cpu else ""]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
    env.pop("SPECULATORS_HYBRID_DISABLE", None)
    env.pop("VLLM_PLUGINS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: modules load from cached bytecode
    if mode == "disabled":
        env["SPECULATORS_HYBRID_DISABLE"] = "1"
    elif mode == "excluded":
        others = [p for p in plugins if p != "speculators_hybrid"]
        env["VLLM_PLUGINS"] = ",".join(others) or "none-but-speculators-hybrid-excluded"
    return env


def run_child(python: str, code: str, env: dict[str, str], *flags: str) -> tuple[str, str]:
    cwd = env["PYTHONPATH"].split(os.pathsep)[0]  # `-c` puts the working dir first on the path
    proc = subprocess.run(
        [python, *flags, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{python} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout, proc.stderr


def sample(python: str, code: str, env: dict[str, str]) -> dict[str, Any]:
    stdout, _ = run_child(python, code, env)
    for line in stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise RuntimeError(f"no result line in:\n{stdout[-2000:]}")


IMPORTTIME = re.compile(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)")


def parse_importtime(stderr: str) -> dict[str, tuple[int, int]]:
    """{module: (self us, cumulative us)} from `python -X importtime` output."""
    return {
        m.group(4): (int(m.group(1)), int(m.group(2)))
        for m in map(IMPORTTIME.match, stderr.splitlines())
        if m
    }


def breakdown(python: str, mods: list[str], envs: list[dict[str, str]]) -> dict[str, Any]:
    """Our modules' import times, and the modules only the plugin imports (sum of self times)."""
    code = CHILD.format(mods=mods, mark=MARK)
    times = {}
    for mode, env in zip(MODES, envs, strict=True):
        if mode != "disabled":
            times[mode] = parse_importtime(run_child(python, code, env, "-X", "importtime")[1])
    ours = {m: t for m, t in times["ours"].items() if m.split(".")[0] == "speculators_hybrid"}
    extra = {m: t for m, t in times["ours"].items() if m not in times["excluded"]}
    return {
        "ours_us": ours,
        "only_with_plugin_us": dict(sorted(extra.items(), key=lambda kv: -kv[1][0])),
        "only_with_plugin_self_sum_ms": sum(t[0] for t in extra.values()) / 1000,
    }


def medians_ms(samples: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in samples[0].items() if isinstance(v, float)]
    return {k: statistics.median(r[k] for r in samples) * 1000 for k in keys}


def summarize(ab: dict[str, list[dict[str, Any]]], direct: dict[str, list[dict[str, Any]]]):
    """Medians in ms per mode and phase; the added cost, end to end and timed from inside."""
    med = {mode: medians_ms(rs) for mode, rs in ab.items()}
    base = med["excluded"]["plugins"] + med["excluded"]["targets"]
    added = {m: med[m]["plugins"] + med[m]["targets"] - base for m in ("ours", "disabled")}
    inside = {mode: medians_ms(rs) for mode, rs in direct.items()}
    return {
        "median_ms": med,
        "added_ms": added,
        "direct_median_ms": inside,
        "within_target": inside["ours"]["ours"] <= TARGET_MS,
    }


def measure(python: str, runs: int, tree: Path = ROOT) -> dict[str, Any]:
    stdout, _ = run_child(python, PROBE, mode_env("ours", [], tree))
    probe = json.loads(stdout.strip().splitlines()[-1])
    mods, plugins, cpu = probe["target_modules"], probe["plugins"], not probe["torchvision"]
    cases = [(mode, CHILD, mode) for mode in MODES]
    cases += [(f"direct-{mode}", DIRECT, mode) for mode in ("ours", "disabled")]
    jobs = {
        name: (code.format(mods=mods, mark=MARK), mode_env(mode, plugins, tree, cpu))
        for name, code, mode in cases
    }
    for code, env in jobs.values():  # warm the bytecode caches; not counted
        sample(python, code, env)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in jobs}
    names = list(jobs)
    load = os.getloadavg()[0]
    for i in range(runs):  # interleaved and rotated, so drift hits every case alike
        for name in names[i % len(names) :] + names[: i % len(names)]:
            samples[name].append(sample(python, *jobs[name]))
    ab = {m: samples[m] for m in MODES}
    direct = {m: samples[f"direct-{m}"] for m in ("ours", "disabled")}
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "load_average_1min": [load, os.getloadavg()[0]],
        "interpreter": python,
        "tree": tree_state(tree),
        **probe,
        "runs": runs,
        "samples": samples,
        **summarize(ab, direct),
        "importtime": breakdown(python, mods, [mode_env(m, plugins, tree, cpu) for m in MODES]),
    }


def tree_state(tree: Path) -> str:
    """The source measured: its path, and its git commit (`-dirty` if changed) if it has one."""
    proc = subprocess.run(
        ["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return f"{tree} {proc.stdout.strip() or '(not a git checkout)'}"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def report(result: dict[str, Any]) -> str:
    med, added, inside = result["median_ms"], result["added_ms"], result["direct_median_ms"]
    load = " -> ".join(f"{x:.1f}" for x in result["load_average_1min"])
    lines = [
        f"# import cost: vLLM {result['vllm']}, Python {result['python']}, "
        f"torch {result['torch']}, speculators-hybrid {result['speculators_hybrid']}",
        f"date {result['date']}; {result['machine']}; load average {load}; "
        f"{result['runs']} fresh processes per case (medians)",
        f"source: {result['tree']} ({result['source']})",
        f"patches for this vLLM: {', '.join(result['patches']) or 'none'}",
        f"target modules imported after the plugins: {', '.join(result['target_modules'])}",
        "",
        "End to end (A/B):",
        "| mode | import vllm ms | load_general_plugins ms | target modules ms | total ms |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        m = med[mode]
        lines.append(
            f"| {mode} | {m['import_vllm']:.1f} | {m['plugins']:.1f} | {m['targets']:.1f}"
            f" | {m['total']:.1f} |"
        )
    lines += [
        f"added vs excluded (plugins + targets): ours {added['ours']:+.1f} ms, "
        f"disabled {added['disabled']:+.1f} ms (differences of noisy totals)",
        "",
        "Timed from inside (our code only; wall ms, CPU ms of the importing thread):",
        "| mode | import plugin | register() | hooks at target import | ours |",
        "|---|---|---|---|---|",
    ]
    for mode, m in inside.items():
        cells = [
            f"{m[k]:.1f} / {m[k + '_cpu']:.1f}"
            for k in ("import_plugin", "register", "hooks", "ours")
        ]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    verdict = "within" if result["within_target"] else "ABOVE"
    lines += [
        f"added per vLLM process: {inside['ours']['ours']:.1f} ms wall, "
        f"{inside['ours']['ours_cpu']:.1f} ms CPU ({verdict} the {TARGET_MS:.0f} ms target)",
        "",
        "python -X importtime, speculators_hybrid modules (self us | cumulative us):",
    ]
    imp = result["importtime"]
    for name, (own, cum) in sorted(imp["ours_us"].items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {own:>8} | {cum:>8} | {name}")
    lines.append(
        f"modules imported only with the plugin: {len(imp['only_with_plugin_us'])}, "
        f"self time {imp['only_with_plugin_self_sum_ms']:.1f} ms; largest:"
    )
    for name, (own, cum) in list(imp["only_with_plugin_us"].items())[:15]:
        lines.append(f"  {own:>8} | {cum:>8} | {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", help="interpreter(s) with vLLM (repeatable)")
    ap.add_argument("--runs", type=int, default=15, help="fresh processes per mode (>= 10)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="our source tree (default: this one)")
    ap.add_argument("--label", default="", help="added to the result file names")
    ap.add_argument("--out", type=Path, help="write <date>-import-cost-vllm<ver>.json/.txt here")
    args = ap.parse_args(argv)
    for python in args.python or [sys.executable]:
        if os.sep in python:  # children run elsewhere; keep the venv's path (no resolve)
            python = os.path.abspath(python)
        result = measure(python, args.runs, args.tree.resolve())
        text = report(result)
        print(text, flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            stem = f"{result['date']}-import-cost-vllm{result['vllm']}{args.label}"
            (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
            (args.out / f"{stem}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
