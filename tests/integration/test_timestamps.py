"""PostgreSQL timestamps parsed by psycopg's C loader (workflows/store/timestamps.py): every
new connection reads ``timestamptz`` with it, and the values are exactly those Django's own
loader gives (the same instants, the same time zone object), in the connection's zone and in
another."""

from __future__ import annotations

from datetime import UTC
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader

from workflows.store import timestamps

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

VALUES = """
SELECT now(), '2026-01-02 03:04:05.678901+05'::timestamptz,
       '2026-03-29 01:59:59.999999+00'::timestamptz, '0001-01-01 00:00:00+00'::timestamptz,
       '1969-12-31 23:59:59.5-08'::timestamptz, NULL::timestamptz
"""


def _read(tz_loader: Any) -> list[Any]:
    """The VALUES row read on a cursor with ``tz_loader`` registered on it."""
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        cursor.adapters.register_loader("timestamptz", tz_loader)
        cursor.execute(VALUES)
        return list(cursor.fetchone())


def _django_loader(tz: Any) -> Any:
    """Django's own loader for the zone ``tz`` (what it registers on a connection)."""
    registered: dict[str, Any] = {}
    adapters = SimpleNamespace(
        register_loader=lambda name, loader: registered.update({name: loader})
    )
    register_tzloader(tz, SimpleNamespace(adapters=adapters))
    return registered["timestamptz"]


def test_a_new_connection_reads_timestamps_with_the_c_loader() -> None:
    from psycopg.pq import Format

    connection.close()
    connection.ensure_connection()
    loader = connection.connection.adapters.get_loader(1184, Format.TEXT)
    assert getattr(loader, "_cleat_c_parse", False), loader
    assert loader.timezone == connection.timezone  # Django then keeps it at every cursor
    with connection.cursor() as cursor:
        assert connection.connection.adapters.get_loader(1184, Format.TEXT) is loader
        cursor.execute("SELECT '2026-12-06 04:05:06.000007+00'::timestamptz")
        [(value,)] = cursor.fetchall()
    assert value.isoformat() == "2026-12-06T04:05:06.000007+00:00"


@pytest.mark.parametrize("tz", [UTC, ZoneInfo("Europe/Paris"), None])
def test_the_values_are_django_loaders_own(tz: Any) -> None:
    fast = timestamps.loader_class(tz)
    assert fast is not None  # psycopg's C implementation is installed (psycopg[binary])
    ours, django = _read(fast), _read(_django_loader(tz))
    assert ours[-1] is None and django[-1] is None
    # now() moved between the two statements; the others are the same wall times and zones
    assert [v.replace(tzinfo=None) for v in ours[1:-1]] == [
        v.replace(tzinfo=None) for v in django[1:-1]
    ]
    for mine, theirs in zip(ours[:-1], django[:-1], strict=True):
        assert mine.tzinfo is theirs.tzinfo
