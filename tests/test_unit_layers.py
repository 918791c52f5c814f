"""The package's import structure: one-way layers, read from the source (no module is imported).

Every ``import`` and ``from ... import`` counts, wherever it stands: at the top, inside a function
(a deferred import is still a dependency, only a later one) and under ``if TYPE_CHECKING:`` (a type
names the module it comes from). Imports made from strings (``importlib.import_module``) are not seen.

The rules:
- no import cycle among the package's modules;
- the runtime (what runs inside SGLang's processes) never imports the lab (benchmarks, reports, the
  test harness, the command line, the doctor's and the README's tools);
- no module imports another module's underscore names (a private module of one's own package is
  fine: ``from ._tokenizer import x``);
- ``switch`` (read by every hook) and ``runtime`` (the process state hooks read) import nothing of
  the package: the state's owner (``plugin``) registers its callbacks with them instead.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_mmtrace"

RUNTIME: frozenset[str] = frozenset(
    {
        "",  # the package itself (``__init__``: ``install``, ``uninstall``)
        "autoinstall",
        "config",
        "environment_variables",
        "hooks",
        "join",
        "launcher",
        "manifest",
        "occupancy",
        "package",
        "patch",
        "patches",
        "plugin",
        "runtime",
        "sinks",
        "stages",
        "switch",
        "telemetry",
        "windows",
    }
)
"""Top-level parts that run inside SGLang's processes, and the core modules they use."""

LAB: frozenset[str] = frozenset({"bench", "cli", "docs", "harness", "manifest_check", "profiling", "report"})
"""Top-level parts that run beside SGLang: benchmarks, reports, the test harness, the command line,
the doctor's manifest checker (``manifest_check``), the README's table generator (``docs``) and the
Nsight Systems report reader (``profiling``, for ``sglang-mmtrace nsys``)."""

LEAVES: dict[str, frozenset[str]] = {
    "sglang_mmtrace.switch": frozenset(),
    "sglang_mmtrace.runtime": frozenset(),
}
"""Modules that may import only the listed modules of the package (none: they are leaves)."""


@dataclass
class Graph:
    edges: dict[str, set[str]] = field(default_factory=dict)
    """Module -> the package's modules it imports."""
    private: list[str] = field(default_factory=list)
    """``importer -> module._name`` for every underscore name imported from another module."""


def _module_names(root: Path) -> dict[str, Path]:
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph(root: Path) -> Graph:
    """The import graph of the package at ``root`` (its folder), from every module's syntax tree."""
    modules = _module_names(root)
    graph = Graph()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        aliases: dict[str, str] = {}  # local name -> the package's module it is bound to
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _longest_module(alias.name, modules)
                    if target is not None:
                        out.add(target)
                        if alias.asname:
                            aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                if source not in modules:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:
                        out.add(submodule)
                        aliases[alias.asname or alias.name] = submodule
                        continue
                    out.add(source)
                    if _private(alias.name) and source != name:
                        graph.private.append(f"{name} -> {source}.{alias.name}")
        for node in ast.walk(tree):  # ``rm._name`` through a module bound by an import
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                module = aliases.get(node.value.id)
                if module is not None and module != name and f"{module}.{node.attr}" not in modules:
                    graph.private.append(f"{name} -> {module}.{node.attr}")
        graph.edges[name] = out - {name}
    return graph


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _longest_module(dotted: str, modules: Iterable[str]) -> str | None:
    known = set(modules)
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _part(module: str) -> str:
    """``sglang_mmtrace.hooks.api.engine`` -> ``hooks``; the package itself -> ``""``."""
    return module.split(".")[1] if "." in module else ""


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(PACKAGE)


def test_every_top_level_part_is_in_one_layer(graph: Graph) -> None:
    parts = {_part(m) for m in graph.edges}
    assert not RUNTIME & LAB, RUNTIME & LAB
    assert parts == RUNTIME | LAB, f"unplaced: {sorted(parts - RUNTIME - LAB)}; gone: {sorted((RUNTIME | LAB) - parts)}"


def test_no_import_cycles(graph: Graph) -> None:
    found = cycles(graph.edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_runtime_never_imports_the_lab(graph: Graph) -> None:
    wrong = sorted(
        f"{m} -> {t}" for m, out in graph.edges.items() if _part(m) in RUNTIME for t in out if _part(t) in LAB
    )
    assert not wrong, "runtime modules importing lab modules:\n" + "\n".join(wrong)


def test_no_module_imports_another_modules_private_names(graph: Graph) -> None:
    assert not graph.private, "underscore names imported across modules:\n" + "\n".join(graph.private)


def test_leaves_import_only_what_they_are_allowed(graph: Graph) -> None:
    wrong = {m: sorted(graph.edges[m] - allowed) for m, allowed in LEAVES.items() if graph.edges[m] - allowed}
    assert not wrong, wrong


def test_the_checker_sees_hidden_cycles_and_private_names(tmp_path: Path) -> None:
    """A cycle made of a function-level import and a TYPE_CHECKING import, and both forms of private
    use, in a synthetic package: the checks above cannot pass because they see nothing."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n    return b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n_hidden = 1\n"
    )
    (pkg / "sub" / "_own.py").write_text("from . import b\nfrom .b import _hidden\n")
    (pkg / "c.py").write_text("from pkg.sub import b as bee\nfrom .sub import _own\nx = bee._hidden\n")
    g = import_graph(pkg)
    assert g.edges["pkg.a"] == {"pkg.sub.b"} and g.edges["pkg.sub.b"] == {"pkg.a"}
    assert g.edges["pkg.c"] == {"pkg.sub.b", "pkg.sub._own"}
    assert cycles(g.edges) == [["pkg.a", "pkg.sub.b"]]
    assert sorted(g.private) == ["pkg.c -> pkg.sub.b._hidden", "pkg.sub._own -> pkg.sub.b._hidden"]
