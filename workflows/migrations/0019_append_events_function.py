"""The per-step append on PostgreSQL as a function, ``cleat.append_events(runs, events)``:
its statements are planned once per connection instead of at every step, and one call
writes the appends of several runs (the group commit, workflows/store/group_commit.py). It
runs as its caller, under row-level security, setting each tenant of its runs in turn.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py."""

from django.conf import settings
from django.db import migrations

SIGNATURE = "cleat.append_events(json, json)"
APPEND_EVENTS_SQL = """
CREATE OR REPLACE FUNCTION cleat.append_events(
    p_runs json, p_events json)
RETURNS TABLE(id uuid)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT r.tenant FROM json_to_recordset(p_runs) AS r(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        WITH fence AS (
            UPDATE workflows_workflowinstance AS i
               SET event_count = c.next, heartbeat_at = c.now
              FROM json_to_recordset(p_runs)
                   AS c(id uuid, tenant uuid, first integer, next integer, worker varchar,
                        generation integer, now timestamptz)
             WHERE c.tenant = v_tenant AND i.id = c.id AND i.tenant_id = v_tenant
               AND i.assigned_to = c.worker AND i.generation = c.generation
               AND i.status = 'running' AND i.event_count = c.first
            RETURNING i.id, i.tenant_id
        ), appended AS (
            INSERT INTO workflows_workflowevent
                   (tenant_id, instance_id, step, type_code, payload, timestamp_ms, checksum,
                    intent_at, created_at)
            SELECT fence.tenant_id, fence.id, e.step, e.type_code, e.payload, e.ts,
                   e.checksum, e.intent_at, e.created_at
              FROM fence
              JOIN json_to_recordset(p_events)
                   AS e(run uuid, step integer, type_code smallint, payload text, ts bigint,
                        checksum varchar, intent_at timestamptz, created_at timestamptz)
                ON e.run = fence.id
            RETURNING 1
        )
        SELECT fence.id FROM fence;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(APPEND_EVENTS_SQL)
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0018_history_compaction"),
    ]

    operations = [migrations.RunPython(create, drop)]
