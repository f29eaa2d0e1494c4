"""Every import inside speculators_hybrid/ points one way: no module imports, directly or through
others, a module that imports it.

The graph is read from the source with `ast`, nothing is imported. Every import of a
speculators_hybrid module counts wherever it stands: at module level, inside a function (it
runs when the function does, so a circle is only postponed, and a lower layer still depends on
an upper one) and under `if TYPE_CHECKING:`. `from pkg import name` is an edge to `pkg.name`
where that is a module, else to `pkg`. Importing `pkg.sub` also runs `pkg/__init__.py`, but that
edge is not drawn: a package's `__init__` importing its own modules would otherwise make every
package a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file, for every module of `package` found under `root`."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports."""
    known = modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, name, path.name == "__init__.py")
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in known else source)
            for target in targets:
                while target and target not in known:  # `import a.b.c` where c is a name
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules, each as a path back to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(graph, set(group)) for group in groups]


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path inside `group` from its first module back to it (breadth first: a short one)."""
    start = min(group)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came:
                    came[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # a strongly connected group has one


def test_no_import_circle_inside_the_package():
    graph = import_graph(ROOT, "speculators_hybrid")
    assert len(graph) > 50 and graph["speculators_hybrid.plugin"], "the package was not read"
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "def f():\n    from pkg.high import g\n    return g\n",
            "pkg/mid.py": "from pkg import low\n",
            "pkg/high.py": "from . import mid\n\ndef g():\n    return mid\n",
            "pkg/apart.py": "import pkg.low\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert graph["pkg.apart"] == {"pkg.low"} and graph["pkg"] == set()
    assert cycles(graph) == [["pkg.high", "pkg.mid", "pkg.low", "pkg.high"]]


def test_one_way_imports_and_package_inits_make_no_circle(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from pkg.sub import one, two\nPARTS = (one.X, two.X)\n",
            "pkg/sub/one.py": "from pkg.sub.two import X as Y\nX = Y\n",
            "pkg/sub/two.py": "from ..base import X\n",
            "pkg/base.py": "X = 1\n",
            "pkg/top.py": "from pkg.sub import PARTS\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert graph["pkg.top"] == {"pkg.sub"} and graph["pkg.sub.two"] == {"pkg.base"}
    assert cycles(graph) == []
    graph["pkg.base"].add("pkg.top")  # as if base imported top: all five in one circle
    assert cycles(graph) == [["pkg.base", "pkg.top", "pkg.sub", "pkg.sub.two", "pkg.base"]]
