"""Every hand-written SQL statement of the workflows store, one module per dialect, fetched
by name: ``queries(connection)["claim_ready"]``.

Each dialect module (``postgresql``, ``mysql``, ``sqlite``, ``mssql``) holds a ``QUERIES``
mapping of the statements the store runs on that database; a name a dialect does not define
means the store says it through the ORM there (``queries(connection).get(name)`` is None),
so the store's Python chooses by what the dialect offers, never by the vendor's name. The
PostgreSQL module also holds the live definitions of the definer functions and the RLS
statements: the migrations that install them carry frozen copies (a migration never
imports this package), and ``tests/integration/test_migrations_sql.py`` checks that what a
fresh migrate installs matches these.

Table names are formatted in once, at import, from the models.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

# Django's connection.vendor -> the module of that dialect.
DIALECT_MODULES = {
    "postgresql": "postgresql",
    "mysql": "mysql",
    "sqlite": "sqlite",
    "microsoft": "mssql",
}


def loader(package: str) -> Callable[[Any], Mapping[str, str]]:
    """``queries(connection)`` for the per-dialect modules of ``package`` (each defines a
    ``QUERIES`` dict). A dialect's module is imported when first asked for."""
    loaded: dict[str, Mapping[str, str]] = {}

    def queries(connection: Any) -> Mapping[str, str]:
        vendor = connection.vendor
        found = loaded.get(vendor)
        if found is None:
            try:
                name = DIALECT_MODULES[vendor]
            except KeyError:
                raise LookupError(f"no SQL dialect module for the {vendor!r} database") from None
            module = importlib.import_module(f"{package}.{name}")
            found = loaded[vendor] = MappingProxyType(dict(module.QUERIES))
        return found

    return queries


queries = loader(__name__)


def array_literal(values: Iterable[object]) -> str:
    """``values`` in PostgreSQL's array input syntax, ``{"1","a\\"b",NULL}``: the parameter
    of a statement that casts it to its array type (``%s::text[]``) or passes it to a
    function's array argument. Each element is its ``str()`` in double quotes, a backslash or
    double quote in it escaped; None is NULL. psycopg's client-side binding dumps a list in
    Python, element by element (about 6 µs for a one-element array), and quotes a string in
    C."""
    return (
        "{"
        + ",".join(
            "NULL"
            if value is None
            else '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
            for value in values
        )
        + "}"
    )


def update_by_key(connection: Any, table: str, columns: Sequence[str], key: str) -> str:
    """``UPDATE table SET column = %s, ... WHERE key = %s``, each name quoted as
    ``connection``'s database quotes it: the one statement written here for every dialect
    (``store.columns.RowColumns.save``, a run's row saved by its key)."""
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(column)} = %s" for column in columns)
    return f"UPDATE {quote(table)} SET {assignments} WHERE {quote(key)} = %s"


def insert_row(connection: Any, table: str, columns: Sequence[str]) -> str:
    """``INSERT INTO table (column, ...) VALUES (%s, ...)``, each name quoted as
    ``connection``'s database quotes it: the one statement written here for every dialect
    (``store.columns.RowColumns.insert``, a new run's row)."""
    quote = connection.ops.quote_name
    names = ", ".join(quote(column) for column in columns)
    values = ", ".join(["%s"] * len(columns))
    return f"INSERT INTO {quote(table)} ({names}) VALUES ({values})"


__all__ = [
    "DIALECT_MODULES",
    "array_literal",
    "insert_row",
    "loader",
    "queries",
    "update_by_key",
]
