"""The run table's columns as the store's hand-written statements read them: which ones, in
which order, and how a raw row of them becomes a model instance, converted as the ORM's own
queries convert it. The statements (``sql/postgresql.py``) and the code that reads their
rows (``store.lifecycle``'s loads, ``store.storage``'s fenced lock) take them from here, so
the order is written once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field

from workflows.models import WorkflowInstance


class RowColumns:
    """Some of the run table's columns, in order (the model's others are deferred in an
    instance made from them)."""

    def __init__(self, fields: Iterable[Field[Any, Any]]) -> None:
        self.fields = tuple(fields)
        self.attnames = tuple(f.attname for f in self.fields)
        # The ORM's converters for these columns, per database vendor (field and backend
        # functions, called with the connection in hand): found once.
        self._converters: dict[str, list[tuple[int, tuple[list[Any], Any]]]] = {}

    def instance(self, values: Sequence[object]) -> WorkflowInstance:
        """A model instance from the raw values of these columns."""
        found = self._converters.get(connection.vendor)
        if found is None:
            compiler = WorkflowInstance.objects.all().query.get_compiler(connection=connection)
            table = WorkflowInstance._meta.db_table
            found = list(compiler.get_converters([f.get_col(table) for f in self.fields]).items())
            self._converters[connection.vendor] = found
        row = list(values)
        for pos, (functions, expression) in found:
            value = row[pos]
            for convert in functions:
                value = convert(value, expression, connection)
            row[pos] = value
        return WorkflowInstance.from_db(connection.alias, self.attnames, row)


# Every column, in the model's order: what a load selects first (then its definition's).
INSTANCE_COLUMNS = RowColumns(WorkflowInstance._meta.concrete_fields)
# What the general finalize's fenced lock reads: all but the checkpoint, which stays
# deferred (the finalize's save() then writes the loaded fields only, not the blob back).
LOCKED_COLUMNS = RowColumns(f for f in INSTANCE_COLUMNS.fields if f.attname != "compaction_state")
