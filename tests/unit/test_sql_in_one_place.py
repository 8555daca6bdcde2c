"""Hand-written SQL lives in one module per dialect (``workflows/store/sql/``,
``schedules/sql/``), fetched by name: the store's Python passes statements it looked up,
never a literal of its own, and every dialect Django may hand it has a module."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from schedules.sql import queries as schedule_queries
from workflows.store.sql import DIALECT_MODULES, queries

ROOT = Path(__file__).resolve().parents[2]
# The modules that run the store's statements (the SQL modules themselves excluded).
STORE_MODULES = [
    *sorted((ROOT / "workflows" / "store").glob("*.py")),
    ROOT / "workflows" / "tenancy.py",
    ROOT / "workflows" / "rls.py",
    ROOT / "workflows" / "worker.py",
    ROOT / "schedules" / "store.py",
]


def _written_in_place(node: ast.expr) -> bool:
    """A string or f-string, or a concatenation with one in it (``sql["a"] + sql["b"]``,
    two statements looked up, is not)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _written_in_place(node.left) or _written_in_place(node.right)
    return False


def literal_statements(source: str) -> list[int]:
    """Lines of ``execute(...)`` calls whose statement is written in place."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("execute", "executemany")
        and node.args
        and _written_in_place(node.args[0])
    )


def test_the_store_runs_no_statement_written_in_place() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in STORE_MODULES
        for line in literal_statements(path.read_text())
    ]
    assert not found, (
        "put the statement in the dialect's module under workflows/store/sql/ (or "
        "schedules/sql/) and fetch it by name:\n" + "\n".join(found)
    )


def test_the_check_sees_a_statement_written_in_place() -> None:
    source = (
        "cursor.execute('SELECT 1')\n"
        "cursor.execute(f'LISTEN {channel}')\n"
        "cursor.execute(sql['set_tenant'] + sql['fenced_append'], [])\n"
        "cursor.execute(sql['claim_ready'], [])\n"
        "cursor.execute('SELECT ' + column)\n"
    )
    assert literal_statements(source) == [1, 2, 5]


@pytest.mark.parametrize("vendor", sorted(DIALECT_MODULES))
def test_every_dialect_has_its_modules(vendor: str) -> None:
    connection = SimpleNamespace(vendor=vendor)
    assert isinstance(dict(queries(connection)), dict)
    assert isinstance(dict(schedule_queries(connection)), dict)


def test_what_each_dialect_says_itself() -> None:
    def names(vendor: str) -> set[str]:
        return set(queries(SimpleNamespace(vendor=vendor)))

    assert {
        "set_tenant",
        "append_events",
        "load_run",
        "finalize_done",
        "claim_ready",
        "heartbeat_worker",
        "reap_expired_leases",
        "next_due_at",
        "claim_invocations",
        "database_now",
    } <= names("postgresql")
    assert names("microsoft") == {"set_session_tenant", "claim_ready_listed", "database_now"}
    # The ORM says it all there, but for the server's clock (the worker follows it).
    assert names("mysql") == {"database_now"}
    assert names("sqlite") == set()
    assert set(schedule_queries(SimpleNamespace(vendor="postgresql"))) == {
        "due_schedules",
        "next_schedule_at",
    }


def test_an_unknown_database_is_named() -> None:
    with pytest.raises(LookupError, match="'oracle'"):
        queries(SimpleNamespace(vendor="oracle"))
