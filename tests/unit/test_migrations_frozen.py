"""Migrations carry frozen copies of the SQL they install: none imports a module of the
project's own packages (models are reached through ``apps.get_model``), so changing a live
statement in ``workflows/store/sql/`` can never change what an old migration did. A new
definition is a new migration with its own copy."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_layers import ROOT, _module_name, imported_modules

PROJECT_PACKAGES = ("cleat_project", "engine", "schedules", "sdk", "workflows")


def migration_files() -> list[Path]:
    return sorted(
        path
        for package in ("workflows", "schedules")
        for path in (ROOT / package).rglob("migrations/*.py")
        if path.name != "__init__.py"
    )


def test_there_are_migrations_to_check() -> None:
    names = {f"{p.parent.parent.name}/{p.name}" for p in migration_files()}
    assert {"workflows/0002_default_tenant_and_rls.py", "api/0001_resolve_api_key.py"} <= names
    assert "schedules/0003_buffer_and_due_functions.py" in names


def test_no_migration_imports_a_live_module_of_the_project() -> None:
    found = []
    for path in migration_files():
        for line, module in imported_modules(path.read_text(), _module_name(path), False):
            if module.split(".")[0] in PROJECT_PACKAGES:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not found, (
        "a migration must carry a frozen copy of the SQL it installs (and reach models "
        "through apps.get_model), not import the live module:\n" + "\n".join(found)
    )
