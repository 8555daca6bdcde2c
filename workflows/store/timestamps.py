"""PostgreSQL ``timestamptz`` values read by psycopg's C loader.

Django reads them through a loader of its own (``django.db.backends.postgresql.psycopg_any``:
``BaseTzLoader``, which sets the value's time zone to the connection's) that subclasses
psycopg's *Python* loader, since the C one cannot be subclassed: with psycopg's binary
package installed, every timestamp a query returns is still parsed in Python, about 3 µs
each. The worker reads several with every run (a run's row has seven), so the parse was a few
percent of its CPU (``bench/README.md``, "thirteenth pass").

:func:`install` replaces that loader on each new psycopg 3 connection with one that parses
in C and then sets the same time zone as Django's (1 µs). Nothing changes where psycopg's C
implementation is not installed (the pure-Python package): Django's loader stays.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db.backends.signals import connection_created

_MARK = "_cleat_c_parse"


def install() -> None:
    """Use the C loader on every new PostgreSQL connection (the app's ``ready``)."""
    connection_created.connect(_on_connection, dispatch_uid="cleat-c-timestamps")


def _on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor != "postgresql":
        return
    adapters = getattr(connection.connection, "adapters", None)
    if adapters is None:  # psycopg2
        return
    from psycopg.postgres import types
    from psycopg.pq import Format

    oid = types["timestamptz"].oid
    current = adapters.get_loader(oid, Format.TEXT)
    if current is None or getattr(current, _MARK, False) or not hasattr(current, "timezone"):
        return
    fast = loader_class(current.timezone)
    if fast is not None:
        adapters.register_loader("timestamptz", fast)


@functools.cache
def loader_class(tz: Any) -> type | None:
    """A text ``timestamptz`` loader parsing with psycopg's C loader and giving the values
    the time zone ``tz`` (None: naive), as Django's does; None when psycopg has no C
    implementation here."""
    import psycopg
    from psycopg.adapt import Loader
    from psycopg.postgres import types
    from psycopg.pq import Format

    base = psycopg.adapters.get_loader(types["timestamptz"].oid, Format.TEXT)
    if base is None or base.__module__.startswith("psycopg."):  # the Python implementation
        return None

    class CParsedTzLoader(Loader):
        timezone = tz  # what Django compares with its connection's zone at each cursor

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._parse = base(oid, context).load

        def load(self, data: Any) -> Any:
            return self._parse(data).replace(tzinfo=self.timezone)

    setattr(CParsedTzLoader, _MARK, True)
    return CParsedTzLoader
