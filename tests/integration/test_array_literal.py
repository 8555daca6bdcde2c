"""``workflows.store.sql.array_literal``: the array parameters of the finalize and the claim,
written in PostgreSQL's array input syntax, read back by PostgreSQL as the values they came
from, whatever the elements hold."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection

from workflows.store.sql import array_literal

pytestmark = [pytest.mark.django_db, pytest.mark.postgres_only]

ODD_TEXT = [
    "plain",
    'a "quoted" word',
    "back\\slash",
    '\\"',
    "comma, and {braces}",
    "",
    " spaces ",
    "NULL",
    "null",
    "ünïcödé ✓",
    '{"payload": "x\\\\y", "n": [1, 2]}',
    "it's",
    "new\nline\ttab",
    None,
]


def read_back(value: str, cast: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT %s::{cast}", [value])
        return cursor.fetchone()[0]


def test_text_elements_come_back_as_they_were() -> None:
    assert read_back(array_literal(ODD_TEXT), "text[]") == ODD_TEXT
    assert read_back(array_literal(ODD_TEXT), "varchar[]") == ODD_TEXT


def test_numbers_timestamps_and_the_empty_array_come_back_as_they_were() -> None:
    big = [0, -1, 7, 2**62, None]
    assert read_back(array_literal(big), "bigint[]") == big
    assert read_back(array_literal([1, 2, 3]), "smallint[]") == [1, 2, 3]
    at = datetime(2026, 12, 5, 20, 59, 1, 123456, tzinfo=UTC)
    assert read_back(array_literal([at, None]), "timestamptz[]") == [at, None]
    assert read_back(array_literal([]), "integer[]") == []


def test_a_function_argument_takes_it_without_a_cast() -> None:
    """The claim passes its queues to the functions' ``text[]`` argument as is."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION pg_temp.queues(q text[]) RETURNS text[] LANGUAGE sql AS 'SELECT q'"
        )
        cursor.execute("SELECT pg_temp.queues(%s)", [array_literal(["default", "b,c"])])
        assert cursor.fetchone()[0] == ["default", "b,c"]
