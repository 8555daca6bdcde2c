"""An event's tenant is no longer a foreign key constraint in the database.

The constraint's check locked the tenant's row (``FOR KEY SHARE``) in every transaction that
wrote an event: every step's append and every finalize, from every worker process. Each such
transaction wrote that one row's lock to the WAL, and two of them at once turned the lock into
a MultiXact (``bench/store_bench.py``, 3,000 runs of 10 steps on PostgreSQL: 1,561 MultiXacts
with one worker process, 4,517 with two, none without the constraint). InnoDB's check takes a
shared lock on the same row.

An event's tenant is its run's: the statements that write events take it from the run's row
(``cleat.append_events``, ``cleat.finalize_done``; the ORM's writes from the run's reference).
The event's foreign key to its run stays, and so does the run's to its tenant. A tenant's
deletion still takes its events: the ORM cascades (``on_delete`` is unchanged).

On MariaDB the index InnoDB made for the constraint stays behind when the constraint is
dropped; it is dropped too (Django makes no index of its own for this field, ``db_index``
is off), as migration 0026 dropped the other databases' one. Undone, the constraint comes
back (re-adding it checks every event), with InnoDB's index."""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "workflows_workflowevent"
COLUMN = "tenant_id"


def drop_innodb_index(apps, schema_editor):
    """MariaDB: the plain one-column index on the events' tenant that the dropped constraint
    leaves behind (the filter is migration 0026's ``_own_indexes``, frozen here: a migration
    imports no other module of the project)."""
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
    for name, info in constraints.items():
        if (
            info["index"]
            and not info["unique"]
            and not info["primary_key"]
            and not info["foreign_key"]
            and info["columns"] == [COLUMN]
        ):
            schema_editor.execute(
                f"DROP INDEX {schema_editor.quote_name(name)} ON {schema_editor.quote_name(TABLE)}"
            )


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0033_due_indexes_hold_due_runs"),
    ]

    operations = [
        migrations.AlterField(
            model_name="workflowevent",
            name="tenant",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="workflows.tenant",
            ),
        ),
        migrations.RunPython(drop_innodb_index, migrations.RunPython.noop, atomic=False),
    ]
