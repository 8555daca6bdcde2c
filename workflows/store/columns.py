"""The run table's columns as the store's hand-written statements read them: which ones, in
which order, and how a raw row of them becomes a model instance, converted as the ORM's own
queries convert it. The statements (``sql/postgresql.py``) and the code that reads their
rows (``store.lifecycle``'s loads, ``store.storage``'s fenced lock) take them from here, so
the order is written once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import Field
from django.db.models.signals import post_save, pre_save

from workflows.models import WorkflowInstance
from workflows.store.sql import insert_row, update_by_key


class RowColumns:
    """Some of the run table's columns, in order (the model's others are deferred in an
    instance made from them)."""

    def __init__(self, fields: Iterable[Field[Any, Any]], *, track_changes: bool = False) -> None:
        self.fields = tuple(fields)
        # Whether an instance made from these columns keeps its values as loaded, for save()
        # to write only what changed (the instances that are saved: the fenced lock's).
        self.track_changes = track_changes
        self.attnames = tuple(f.attname for f in self.fields)
        # The ORM's converters for these columns, per database vendor (field and backend
        # functions, called with the connection in hand): found once.
        self._converters: dict[str, list[tuple[int, tuple[list[Any], Any]]]] = {}
        meta = WorkflowInstance._meta
        # What save() may write of an instance made from these columns (the model's save()
        # of an instance with deferred fields writes its loaded ones), and the UPDATE's text
        # per vendor and set of columns, built once.
        self._deferred = frozenset(f.attname for f in meta.concrete_fields) - set(self.attnames)
        self._saved = tuple(f for f in self.fields if not f.primary_key and not f.generated)
        # Written at every save: a field whose pre_save makes its value (auto_now).
        self._always = frozenset(f.attname for f in self._saved if getattr(f, "auto_now", False))
        self._update_sql: dict[tuple[str, tuple[str, ...]], str] = {}
        self._insert_sql: dict[str, str] = {}
        self._placeholders = any(hasattr(f, "get_placeholder") for f in self.fields)
        # What insert() writes: every column, as the ORM's insert of a model without a field
        # the database makes (an AutoField, a db_default, a generated column) writes them.
        self._insertable = (
            not self._deferred
            and not meta.db_returning_fields
            and not any(f.generated for f in self.fields)
        )

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
        instance = WorkflowInstance.from_db(conn.alias, self.attnames, row)
        if self.track_changes:  # the values as loaded, for save() to write only what changed
            self._remember(instance)
        return instance

    def _remember(self, instance: WorkflowInstance) -> None:
        """Keep ``instance``'s values of these columns as the row holds them now."""
        instance.__dict__[_LOADED] = (self, {a: instance.__dict__[a] for a in self.attnames})

    def _orm_writes_it(self) -> bool:
        """What only the ORM's save() does as the ORM does it, whatever the instance: a
        listener to the model's save signals, a field with its own placeholder."""
        return (
            pre_save.has_listeners(WorkflowInstance)
            or post_save.has_listeners(WorkflowInstance)
            or self._placeholders
        )

    def insert(self, instance: WorkflowInstance) -> None:
        """``instance.save(force_insert=True)`` for a new run (a start, a child's, a
        successor's), by an INSERT whose text is built once per vendor instead of compiled
        by the ORM at every start: the ORM took about 0.4 ms from the run's ``created_at``
        (its default, set when the instance is made) to the INSERT leaving the process on
        the project's test machine, and that time is part of every run's start -> done.
        Each field goes through its ``pre_save`` and ``get_db_prep_save``, as the ORM's
        insert does. Where it would not be what the ORM's insert does -- columns left out
        or made by the database, a listener to the model's save signals, a field with its
        own placeholder, a value that is an expression -- the ORM inserts the instance."""
        conn = connections[DEFAULT_DB_ALIAS]
        if not self._insertable or not instance._state.adding or self._orm_writes_it():
            instance.save(force_insert=True)
            return
        instance._prepare_related_fields_for_save(operation_name="save")
        values = []
        for field in self.fields:
            value = field.pre_save(instance, True)
            if _expression(value):
                instance.save(force_insert=True)
                return
            values.append(field.get_db_prep_save(value, conn))
        sql = self._insert_sql.get(conn.vendor)
        if sql is None:
            table = WorkflowInstance._meta.db_table
            sql = insert_row(conn, table, [f.column for f in self.fields])
            self._insert_sql[conn.vendor] = sql
        # As the model's save(): an error inside an atomic block marks it for rollback.
        with transaction.mark_for_rollback_on_error(conn.alias), conn.cursor() as cursor:
            cursor.execute(sql, values)
        instance._state.adding = False
        instance._state.db = conn.alias

    def save(self, instance: WorkflowInstance) -> None:
        """``instance.save()`` for an instance loaded with these columns and no others, by an
        UPDATE whose text is built once per vendor and set of columns instead of compiled by
        the ORM at every save (about 1.5 ms for the forty-odd columns of a run, measured on
        the general finalize). Each written field goes through its ``pre_save`` and
        ``get_db_prep_save``, as the ORM's save() does.

        An instance made by :meth:`instance` with ``track_changes`` has only the columns
        that changed since its load (or its last save here) written: a value that differs
        from the loaded one, a JSON value (a dict or a list may have changed in place),
        ``updated_at``. The others are the row's already (the callers hold the row's lock),
        and PostgreSQL would write a large unchanged one -- a run's input, its result -- to
        the WAL again in full: a 192 KB input cost 211 KB of WAL per save, and every segment
        that suspends saves its run. Where it would not be what the ORM's save() does --
        other columns loaded or deferred, a value that is an expression, a listener to the
        model's save signals, a field with its own placeholder -- the ORM saves the instance."""
        meta = WorkflowInstance._meta
        conn = connections[DEFAULT_DB_ALIAS]
        if (
            instance._state.adding
            or instance._state.db != conn.alias
            or instance.get_deferred_fields() != self._deferred
            or self._orm_writes_it()
        ):
            instance.save()
            return
        instance._prepare_related_fields_for_save(operation_name="save")
        loaded = instance.__dict__.get(_LOADED)
        before = loaded[1] if loaded is not None and loaded[0] is self else None
        fields = []
        values = []
        for field in self._saved:
            if before is not None and field.attname not in self._always:
                now = instance.__dict__[field.attname]
                if not isinstance(now, (dict, list)) and now == before[field.attname]:
                    continue
            value = field.pre_save(instance, False)
            if _expression(value):
                instance.save()
                return
            fields.append(field)
            values.append(field.get_db_prep_save(value, conn))
        if not fields:  # nothing changed (a model without auto_now)
            return
        key = (conn.vendor, tuple(f.column for f in fields))
        sql = self._update_sql.get(key)
        if sql is None:
            sql = update_by_key(conn, meta.db_table, key[1], meta.pk.column)
            self._update_sql[key] = sql
        with conn.cursor() as cursor:
            cursor.execute(sql, [*values, meta.pk.get_db_prep_value(instance.pk, conn)])
            if cursor.rowcount < 1:  # as the model's save() of loaded fields says it
                raise DatabaseError("Save with update_fields did not affect any rows.")
        if loaded is not None:  # saved: what changed is measured from here on
            self._remember(instance)


def _expression(value: Any) -> bool:
    """A field's value that the ORM's save() compiles (an expression) or takes from another
    model instance, instead of writing it as a parameter."""
    return hasattr(value, "resolve_expression") or hasattr(value, "prepare_database_save")


# The instance's attribute that holds its values as loaded (RowColumns.instance).
_LOADED = "_cleat_loaded_columns"


# Every column, in the model's order: what a load selects first (then its definition's).
INSTANCE_COLUMNS = RowColumns(WorkflowInstance._meta.concrete_fields)


def create_run(**values: Any) -> WorkflowInstance:
    """``WorkflowInstance.objects.create(**values)`` through :meth:`RowColumns.insert`: a
    new run's row, written by a statement built once."""
    instance = WorkflowInstance(**values)
    INSTANCE_COLUMNS.insert(instance)
    return instance


# What the general finalize's fenced lock reads: all but the checkpoint, which stays
# deferred (the finalize's save() then writes the loaded fields only, not the blob back).
LOCKED_COLUMNS = RowColumns(
    (f for f in INSTANCE_COLUMNS.fields if f.attname != "compaction_state"), track_changes=True
)
