"""The apps' layering: ``workflows`` is the lower layer and ``schedules`` builds on it, so no
module under ``workflows/`` imports ``schedules`` -- not at the top, not inside a function,
not through importlib. The schedules app reaches the worker, the store and RLS through the
hooks workflows offers (``workflows/duties.py``, ``workflows/store/crons.py``,
``workflows.rls.register_tables``), filled in ``SchedulesConfig.ready``.

Read from the source with ``ast``, so an import that only runs on some path is caught too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UPPER_APPS = ("schedules",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module_name: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in a module's source: statements at any depth,
    relative ones resolved, and ``importlib.import_module("...")`` / ``__import__("...")``
    with a literal name."""
    tree = ast.parse(source)
    package = module_name.split(".")
    if not is_package:
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:  # `from . import schedules` names a module too
                yield node.lineno, f"{module}.{alias.name}" if module else alias.name
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                yield node.lineno, first.value


def _is_upper(module: str) -> bool:
    return any(module == app or module.startswith(app + ".") for app in UPPER_APPS)


def upward_imports(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        imports = imported_modules(
            path.read_text(), _module_name(path), is_package=path.name == "__init__.py"
        )
        for line, module in imports:
            if _is_upper(module):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def test_nothing_under_workflows_imports_schedules() -> None:
    found = upward_imports("workflows")
    assert not found, (
        "workflows is the lower layer: offer a hook (a duty, the cron handler, register_tables) "
        "and fill it in SchedulesConfig.ready instead of importing schedules:\n" + "\n".join(found)
    )


def test_the_check_sees_every_form_of_import() -> None:
    """The detector itself: top-level, function-level, from-imports, relative imports that
    climb out of the package, and importlib with a literal name."""
    source = (
        "import schedules\n"
        "def f():\n"
        "    from schedules.models import Schedule\n"
        "    import importlib\n"
        "    importlib.import_module('schedules.scheduler')\n"
        "    __import__('schedules.store')\n"
        "class C:\n"
        "    def g(self):\n"
        "        from ... import schedules\n"
        "import schedules_extra\n"  # another name that merely starts the same way
        "from workflows import models\n"
    )
    imports = imported_modules(source, "workflows.store.probe", is_package=False)
    found = sorted((line, m) for line, m in imports if _is_upper(m))
    assert found == [
        (1, "schedules"),
        (3, "schedules.models"),
        (3, "schedules.models.Schedule"),
        (5, "schedules.scheduler"),
        (6, "schedules.store"),
        (9, "schedules"),
    ]
