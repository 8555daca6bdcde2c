"""The claim's indexes hold only the runs a claim or the reaper can look for (issue 16).

A claim turns a ready run into a running one and a finalize a running run into an ended
one; each writes a new row version (the status is indexed, so no update is HOT), and
PostgreSQL writes it into every index whose condition it meets. ``instance_tenant_due_order``
serves only reads of ready runs (the claim's candidates and its test for due runs, the next
due instant of one tenant), so it gets the condition ``status = 'ready'``;
``instance_due`` serves reads of ready runs across tenants (the next due instant, the wake
sweep) and the reaper's of running ones, so it keeps those two statuses. A claim is then
written to one index fewer and a finalize to two fewer -- of the nine each wrote -- and the
two indexes no longer grow with every run that ever ended.

MariaDB has no partial indexes: Django makes a conditional index whole there, so an index
replaced by itself with a condition is left as it is (no rebuild), as in migration 0031.
Every query that reads these indexes names a status that implies their condition
(``tests/integration/test_instance_indexes.py``).
"""

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
    "instance_due": (
        ["status", "task_queue", "next_wake_at"],
        models.Q(status__in=["ready", "running"]),
    ),
    "instance_tenant_due_order": (
        ["tenant", "status", "task_queue", "-priority", "next_wake_at", "created_at"],
        models.Q(status="ready"),
    ),
}


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0032_finalize_runs_in_one_call"),
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
    ]
