"""The run table's indexes that only some runs need get a condition (issue 16).

A run's every transition -- its start, each claim, its finalize -- writes a new row version
(its status is indexed, so no update is HOT), and PostgreSQL writes that version into every
index of the table whose condition it meets. Five indexes serve runs that have a worker, an
end, a purge batch, a parent or a cancellation request; with a condition, a run without one
is not written to them. The parent's foreign-key index becomes one of these
(``instance_parent``), and ``workflow_id``'s index is declared in ``Meta.indexes`` so that
PostgreSQL no longer gets a second, LIKE-pattern index for it that no query uses.

MariaDB has no partial indexes: Django makes a conditional index whole there, so an index
replaced by itself with a condition is left as it is (no rebuild). Every query that reads
these indexes names a condition that implies theirs (``bench/README.md``, twelfth pass).
"""

import django.db.models.deletion
from django.db import migrations, models


class WherePartialIndexes:
    """An index operation made only where the database has partial indexes: elsewhere an
    index replaced by itself with a condition is the same index, and it stays."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.features.supports_partial_indexes:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.features.supports_partial_indexes:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class RemoveIndexWherePartial(WherePartialIndexes, migrations.RemoveIndex):
    pass


class AddIndexWherePartial(WherePartialIndexes, migrations.AddIndex):
    pass


REPLACED = {
    "instance_owner": (["assigned_to", "status"], models.Q(assigned_to__isnull=False)),
    "instance_retention": (
        ["tenant", "status", "completed_at"],
        models.Q(completed_at__isnull=False),
    ),
    "instance_purge_batch": (["tenant", "purge_batch"], models.Q(purge_batch__isnull=False)),
    "instance_child_ended": (["completed_at", "parent"], models.Q(parent__isnull=False)),
    "instance_cancel_asked": (["cancel_requested", "status"], models.Q(cancel_requested=True)),
}


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0030_ready_insert_wakes"),
    ]

    operations = [
        *(RemoveIndexWherePartial(model_name="workflowinstance", name=name) for name in REPLACED),
        *(
            AddIndexWherePartial(
                model_name="workflowinstance",
                index=models.Index(fields=fields, name=name, condition=condition),
            )
            for name, (fields, condition) in REPLACED.items()
        ),
        # The new indexes first, so that the columns are never without one.
        migrations.AddIndex(
            model_name="workflowinstance",
            index=models.Index(
                condition=models.Q(parent__isnull=False), fields=["parent"], name="instance_parent"
            ),
        ),
        migrations.AddIndex(
            model_name="workflowinstance",
            index=models.Index(fields=["workflow_id"], name="instance_workflow_id"),
        ),
        migrations.AlterField(
            model_name="workflowinstance",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="children",
                to="workflows.workflowinstance",
            ),
        ),
        migrations.AlterField(
            model_name="workflowinstance",
            name="workflow_id",
            field=models.CharField(max_length=128),
        ),
    ]
