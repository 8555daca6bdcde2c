"""The run table's columns as the store's hand-written statements read them: which ones, in
which order, and how a raw row of them becomes a model instance, converted as the ORM's own
queries convert it. The statements (``sql/postgresql.py``) and the code that reads their
rows (``store.lifecycle``'s loads, ``store.storage``'s fenced lock) take them from here, so
the order is written once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Field
from django.db.models.signals import post_save, pre_save

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
        meta = WorkflowInstance._meta
        # What save() writes of an instance made from these columns (the model's save() of an
        # instance with deferred fields writes its loaded ones), and the UPDATE's text per
        # vendor, built once.
        self._deferred = frozenset(f.attname for f in meta.concrete_fields) - set(self.attnames)
        self._saved = tuple(f for f in self.fields if not f.primary_key and not f.generated)
        self._update_sql: dict[str, str] = {}
        self._placeholders = any(hasattr(f, "get_placeholder") for f in self._saved)

    def instance(self, values: Sequence[object]) -> WorkflowInstance:
        """A model instance from the raw values of these columns."""
        conn = connections[DEFAULT_DB_ALIAS]  # not the proxy: each call through it looks it up
        found = self._converters.get(conn.vendor)
        if found is None:
            compiler = WorkflowInstance.objects.all().query.get_compiler(connection=conn)
            table = WorkflowInstance._meta.db_table
            found = list(compiler.get_converters([f.get_col(table) for f in self.fields]).items())
            self._converters[conn.vendor] = found
        row = list(values)
        for pos, (functions, expression) in found:
            value = row[pos]
            for convert in functions:
                value = convert(value, expression, conn)
            row[pos] = value
        return WorkflowInstance.from_db(conn.alias, self.attnames, row)

    def save(self, instance: WorkflowInstance) -> None:
        """``instance.save()`` for an instance loaded with these columns and no others: the
        same UPDATE of them (each field's ``pre_save`` and ``get_db_prep_save``, in the
        model's order), whose text is built once per vendor instead of compiled by the ORM
        at every save (about 1.5 ms for the forty-odd columns of a run, measured on the
        general finalize). Where it would not be the same -- other columns loaded or
        deferred, a value that is an expression, a listener to the model's save signals, a
        field with its own placeholder -- the ORM saves the instance."""
        meta = WorkflowInstance._meta
        conn = connections[DEFAULT_DB_ALIAS]
        if (
            instance._state.adding
            or instance._state.db != conn.alias
            or instance.get_deferred_fields() != self._deferred
            or pre_save.has_listeners(WorkflowInstance)
            or post_save.has_listeners(WorkflowInstance)
            or self._placeholders
        ):
            instance.save()
            return
        instance._prepare_related_fields_for_save(operation_name="save")
        values = []
        for field in self._saved:
            value = field.pre_save(instance, False)
            if hasattr(value, "resolve_expression") or hasattr(value, "prepare_database_save"):
                instance.save()
                return
            values.append(field.get_db_prep_save(value, conn))
        sql = self._update_sql.get(conn.vendor)
        if sql is None:
            quote = conn.ops.quote_name
            sql = "UPDATE {} SET {} WHERE {} = %s".format(
                quote(meta.db_table),
                ", ".join(f"{quote(f.column)} = %s" for f in self._saved),
                quote(meta.pk.column),
            )
            self._update_sql[conn.vendor] = sql
        with conn.cursor() as cursor:
            cursor.execute(sql, [*values, meta.pk.get_db_prep_value(instance.pk, conn)])
            if cursor.rowcount < 1:  # as the model's save() of loaded fields says it
                raise DatabaseError("Save with update_fields did not affect any rows.")


# Every column, in the model's order: what a load selects first (then its definition's).
INSTANCE_COLUMNS = RowColumns(WorkflowInstance._meta.concrete_fields)
# What the general finalize's fenced lock reads: all but the checkpoint, which stays
# deferred (the finalize's save() then writes the loaded fields only, not the blob back).
LOCKED_COLUMNS = RowColumns(f for f in INSTANCE_COLUMNS.fields if f.attname != "compaction_state")
