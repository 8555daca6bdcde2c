"""The worker's heartbeat skips the rows locked by the worker's own writes: a group-commit
batch (workflows/store/group_commit.py) locks several of its runs' rows and writes their
heartbeat itself, and a heartbeat waiting for one of them could deadlock with a batch
waiting for a row the heartbeat had locked first. Reversing reinstalls the plain update.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py."""

from django.db import migrations

SIGNATURE = "cleat.heartbeat_worker(text, timestamptz)"
HEARTBEAT_SKIPPING_LOCKED = """
CREATE OR REPLACE FUNCTION cleat.heartbeat_worker(p_worker text, p_now timestamptz)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    -- SKIP LOCKED: a row locked by one of the worker's own writes (a group-commit batch
    -- locks several) gets a fresh heartbeat_at from that write; waiting for it could
    -- deadlock with a batch waiting for a row this statement locked first.
    WITH beat AS (
        UPDATE workflows_workflowinstance SET heartbeat_at = p_now
         WHERE id IN (SELECT h.id FROM workflows_workflowinstance AS h
                       WHERE h.assigned_to = p_worker AND h.status = 'running'
                       FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*)::integer FROM beat
$$;
"""
HEARTBEAT_0002 = """
CREATE OR REPLACE FUNCTION cleat.heartbeat_worker(p_worker text, p_now timestamptz)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH beat AS (
        UPDATE workflows_workflowinstance SET heartbeat_at = p_now
         WHERE assigned_to = p_worker AND status = 'running'
        RETURNING 1)
    SELECT count(*)::integer FROM beat
$$;
"""


def _install(schema_editor, text):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(text)  # CREATE OR REPLACE keeps the owner and the grants


def forwards(apps, schema_editor):
    _install(schema_editor, HEARTBEAT_SKIPPING_LOCKED)


def backwards(apps, schema_editor):
    _install(schema_editor, HEARTBEAT_0002)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0021_load_functions"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
