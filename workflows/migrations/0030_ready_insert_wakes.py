"""A run inserted ready (a start, a child's start, a continue-as-new's successor) wakes the
idle workers from its insert: an ``AFTER INSERT`` trigger sends the NOTIFY, delivered by the
insert's commit, so a start is its insert and its commit instead of the insert, a NOTIFY
statement and the commit (one round trip fewer). A path that also sends it in the same
transaction costs nothing more: PostgreSQL folds the same notification into one.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py. Reversing drops the trigger and its
function (the code before this migration sends its own NOTIFY)."""

from django.db import migrations

READY_INSERT_WAKES = """
CREATE OR REPLACE FUNCTION cleat.wake_on_ready_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cleat_wake', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS instance_ready_insert_wakes ON workflows_workflowinstance;
CREATE TRIGGER instance_ready_insert_wakes AFTER INSERT ON workflows_workflowinstance
    FOR EACH ROW WHEN (NEW.status = 'ready')
    EXECUTE FUNCTION cleat.wake_on_ready_insert();
"""
DROP_READY_INSERT_WAKES = """
DROP TRIGGER IF EXISTS instance_ready_insert_wakes ON workflows_workflowinstance;
DROP FUNCTION IF EXISTS cleat.wake_on_ready_insert();
"""


def _install(schema_editor, text):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(text)


def forwards(apps, schema_editor):
    _install(schema_editor, READY_INSERT_WAKES)


def backwards(apps, schema_editor):
    _install(schema_editor, DROP_READY_INSERT_WAKES)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0029_next_due_at_planned_once"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
