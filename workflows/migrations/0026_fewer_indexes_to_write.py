"""Two indexes fewer to write at every step and one fewer at every start, claim and
finalize: the events' own indexes on their run and on their tenant (every read of events
names the run, and the unique (instance, step) index serves it), and the runs' own index on
their tenant (every other index of the table leads with it).

Only the indexes are dropped: the foreign keys stay as they are (an AlterField would drop
and re-add each constraint, and re-adding one checks every row of the table). On MariaDB
nothing changes: InnoDB keeps the indexes its foreign keys need, and Django makes none of
its own there; nor on SQL Server (written, not tested: the project runs no SQL Server), whose
DROP INDEX takes another form."""

import django.db.models.deletion
from django.db import migrations, models

# The databases whose foreign keys have an index Django made (MariaDB's are InnoDB's own).
VENDORS = ("postgresql", "sqlite")
# (table, column): the single-column indexes Django made for these foreign keys.
INDEXED = (
    ("workflows_workflowevent", "instance_id"),
    ("workflows_workflowevent", "tenant_id"),
    ("workflows_workflowinstance", "tenant_id"),
)


def _own_indexes(schema_editor, table, column):
    """The names of the plain one-column indexes on ``table.column``."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return [
        name
        for name, info in constraints.items()
        if info["index"]
        and not info["unique"]
        and not info["primary_key"]
        and not info["foreign_key"]
        and info["columns"] == [column]
    ]


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor not in VENDORS:
        return
    for table, column in INDEXED:
        for name in _own_indexes(schema_editor, table, column):
            schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def create_indexes(apps, schema_editor):
    if schema_editor.connection.vendor not in VENDORS:
        return
    for table, column in INDEXED:
        if _own_indexes(schema_editor, table, column):
            continue
        name = schema_editor._create_index_name(table, [column])
        schema_editor.execute(
            f"CREATE INDEX {schema_editor.quote_name(name)} ON "
            f"{schema_editor.quote_name(table)} ({schema_editor.quote_name(column)})"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0025_claim_reads_due_runs_in_index_order"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
            state_operations=[
                migrations.AlterField(
                    model_name="workflowevent",
                    name="instance",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="workflows.workflowinstance",
                    ),
                ),
                migrations.AlterField(
                    model_name="workflowevent",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="workflows.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="workflowinstance",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="workflows.tenant",
                    ),
                ),
            ],
        ),
    ]
