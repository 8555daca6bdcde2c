"""PostgreSQL: the run table's two unique keys that most runs leave empty are partial indexes.

``start_idempotency_key`` (unique with the tenant) and ``continued_from_id`` (a
``OneToOneField``) are NULL for every run started without a key and for every run that is not
a continue-as-new. A unique constraint's index still holds an entry for each of those rows,
and every transition of a run (its start, each claim, its finalize) changes its status, so no
update of it is HOT: each new row version was written into these two indexes too, for
nothing. Here each becomes a unique index on the rows where the key is set (``WHERE ... IS
NOT NULL``), under the constraint's name.

Uniqueness is unchanged: NULLs never collided (they are distinct in a unique index), and two
rows with the same key still do. The queries that look a key up (the start's idempotency,
the chain of a continue-as-new, the retention purge, the foreign key's own checks) compare it
with ``=`` or ``IN``, which implies ``IS NOT NULL``, so they still read the index
(``tests/integration/test_instance_indexes.py``). A drained timer (claim and finalize) wrote
23.9 WAL records a run, and 19.8 with these (bench/README.md, twentieth pass).

Django's model state keeps the two as they were (a unique constraint and a unique field):
MariaDB has no partial indexes and keeps its whole ones, and SQLite keeps its table as it is.
On PostgreSQL a later migration that drops either must drop the index, not a constraint.
Undone, the constraints come back."""

from django.db import migrations

TABLE = "workflows_workflowinstance"
# (the columns, the constraint's name or None: the one Django named for the unique field)
KEYS = (
    (("tenant_id", "start_idempotency_key"), "instance_start_idempotency_key"),
    (("continued_from_id",), None),
)


def _constraint_name(schema_editor, columns):
    """The unique constraint Django made on ``columns`` (a unique field's is named by Django)."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
    for name, info in constraints.items():
        if info["unique"] and not info["primary_key"] and tuple(info["columns"]) == columns:
            return name
    raise RuntimeError(f"no unique constraint on {TABLE}{columns}")


def _keys(schema_editor):
    """Each key as its statements name it: its columns (quoted), the column that may be
    NULL (quoted) and its name; none off PostgreSQL."""
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for columns, name in KEYS:
        yield (
            ", ".join(quote(c) for c in columns),
            quote(columns[-1]),
            name or _constraint_name(schema_editor, columns),
        )


def to_partial(apps, schema_editor):
    quote = schema_editor.quote_name
    for columns, nullable, name in _keys(schema_editor):
        temporary = quote(f"{name}_partial"[:63])
        schema_editor.execute(
            f"CREATE UNIQUE INDEX {temporary} ON {quote(TABLE)} ({columns}) "
            f"WHERE {nullable} IS NOT NULL"
        )
        schema_editor.execute(f"ALTER TABLE {quote(TABLE)} DROP CONSTRAINT {quote(name)}")
        schema_editor.execute(f"ALTER INDEX {temporary} RENAME TO {quote(name)}")


def to_constraints(apps, schema_editor):
    quote = schema_editor.quote_name
    for columns, _, name in _keys(schema_editor):
        schema_editor.execute(f"DROP INDEX {quote(name)}")
        schema_editor.execute(
            f"ALTER TABLE {quote(TABLE)} ADD CONSTRAINT {quote(name)} UNIQUE ({columns})"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0034_event_tenant_without_constraint"),
    ]

    operations = [
        migrations.RunPython(to_partial, to_constraints),
    ]
