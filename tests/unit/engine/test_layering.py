"""The engine's layering: ``engine/`` is framework-free (no Django, no app of the project),
its modules import each other without cycles, and none imports another module's private
names.

The import graph is read from the source with ``ast``, so every import counts: module level,
inside functions (the lazy ones), and under ``TYPE_CHECKING`` (none is exempt: an
annotation-only import is still a dependency a reader has to follow). An edge goes to the
module named by the import (``from engine.session import RunInfo`` -> ``engine.session``;
``from engine import runtime`` -> ``engine.runtime`` when that is a module); the implicit
import of a package's ``__init__`` by its submodules is not an edge, as in Python's own
import system, where it cannot form a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "engine"

# Top-level packages the engine must never import: the framework and the project's apps.
FORBIDDEN = ("django", "rest_framework", "workflows", "schedules", "cleat_project")


@dataclass
class ImportGraph:
    """The imports of one package: for each module, the package modules it imports, every
    top-level package it imports, and the private names it takes from package modules."""

    edges: dict[str, set[str]] = field(default_factory=dict)
    top_level: dict[str, set[str]] = field(default_factory=dict)
    private: dict[str, set[str]] = field(default_factory=dict)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, name: str, is_package: bool) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(imported module, names taken from it) for every import statement in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, tuple(alias.name for alias in node.names)


def build_graph(root: Path) -> ImportGraph:
    package = root.name
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(root, p): p for p in paths}
    graph = ImportGraph()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        top: set[str] = set()
        private: set[str] = set()
        aliases: dict[str, str] = {}  # local name -> package module it stands for
        for target, names in _imports(tree, name, path.name == "__init__.py"):
            top.add(target.split(".")[0])
            if target != package and not target.startswith(package + "."):
                continue
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if submodules:  # ``from engine import runtime``
                edges.update(submodules)
                aliases.update({n: f"{target}.{n}" for n in names if f"{target}.{n}" in modules})
            if not names or len(submodules) < len(names):
                edges.add(target)
            private.update(
                f"{target}.{n}"
                for n in names
                if n.startswith("_") and not n.startswith("__") and f"{target}.{n}" not in modules
            )
        for node in ast.walk(tree):
            # ``module._name`` on a package module imported as a name
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                private.add(f"{aliases[node.value.id]}.{node.attr}")
        edges.discard(name)
        graph.edges[name] = {e for e in edges if e in modules}
        graph.top_level[name] = top
        graph.private[name] = private
    return graph


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (or a module importing
    itself), as a sorted list: each is at least one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(cycles)


@pytest.fixture(scope="module")
def engine_graph() -> ImportGraph:
    return build_graph(ENGINE)


def test_the_engine_imports_neither_django_nor_an_app(engine_graph: ImportGraph) -> None:
    offenders = {
        module: sorted(top & set(FORBIDDEN))
        for module, top in engine_graph.top_level.items()
        if top & set(FORBIDDEN)
    }
    assert offenders == {}


def test_the_engine_modules_import_each_other_without_cycles(engine_graph: ImportGraph) -> None:
    assert find_cycles(engine_graph.edges) == []


def test_no_engine_module_takes_another_modules_private_names(engine_graph: ImportGraph) -> None:
    offenders = {module: sorted(names) for module, names in engine_graph.private.items() if names}
    assert offenders == {}


def test_the_graph_holds_the_backends_and_their_lazy_imports(engine_graph: ImportGraph) -> None:
    """The graph is the real one: the runtime reaches both backends (the component one
    through its function-level import) and neither backend reaches the runtime."""
    edges = engine_graph.edges
    assert {"engine.core_backend", "engine.component", "engine.module_cache"} <= edges[
        "engine.runtime"
    ]
    assert "engine.traps" in edges["engine.core_backend"] & edges["engine.component"]
    assert "engine.runtime" not in edges["engine.component"] | edges["engine.core_backend"]
    assert "engine.session.replay" in edges["engine.session.ops_calls"]


# --- the checks themselves, on a package written for the purpose -----------------------------


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import thing\n",
            "b.py": "def thing():\n    from pkg import c\n    return c\n",
            "c.py": "import pkg.a\n",
            "d.py": "from pkg.a import thing\n",
        },
    )
    assert find_cycles(build_graph(package).edges) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_a_cycle_under_type_checking_and_relative_imports_is_found(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "sub/__init__.py": "from .x import X\n",
            "sub/x.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from ..y import Y\nclass X: ...\n"
            ),
            "y.py": "from pkg.sub import X\nclass Y: ...\n",
        },
    )
    assert find_cycles(build_graph(package).edges) == [["pkg.sub", "pkg.sub.x", "pkg.y"]]


def test_django_and_private_names_are_found_anywhere(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "_hidden = 1\n",
            "b.py": (
                "from pkg import a\n"
                "def f():\n    from django.db import models\n    from pkg.a import _hidden\n"
                "    return a._hidden, models\n"
            ),
        },
    )
    graph = build_graph(package)
    assert "django" in graph.top_level["pkg.b"]
    assert graph.private["pkg.b"] == {"pkg.a._hidden"}
    assert find_cycles(graph.edges) == []
