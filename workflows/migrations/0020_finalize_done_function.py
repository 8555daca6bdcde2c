"""The one-call finalize of a completed run on PostgreSQL as a function,
``cleat.finalize_done``: its statements are planned once per connection instead of at every
finalize (a fifth of the server's time per run went to planning them). It runs as its
caller, under row-level security, with the run's tenant set.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py."""

from django.conf import settings
from django.db import migrations

SIGNATURE = (
    "cleat.finalize_done(uuid, uuid, text, bigint, integer, text, timestamptz, timest"
    "amptz, text, jsonb, integer[], smallint[], text[], bigint[], varchar[], timestamptz[], text, text)"
)
FINALIZE_DONE_SQL = """
CREATE OR REPLACE FUNCTION cleat.finalize_done(
    p_tenant uuid, p_id uuid, p_worker text, p_generation bigint, p_first integer,
    p_status text, p_now timestamptz, p_updated_at timestamptz, p_result text,
    p_query_state jsonb, p_steps integer[], p_types smallint[], p_payloads text[],
    p_ts bigint[], p_checksums varchar[], p_intents timestamptz[], p_lock_holder text,
    p_updates_result text)
RETURNS TABLE(parent_id uuid)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_matched boolean := false;
    v_parent uuid;
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    WITH fence AS (
        UPDATE workflows_workflowinstance AS i
           SET status = p_status, completed_at = p_now, result = p_result, error = NULL,
               error_code = NULL, waiting_on = NULL, next_wake_at = NULL,
               query_state = p_query_state, assigned_to = NULL, heartbeat_at = p_now,
               updated_at = p_updated_at, event_count = i.event_count + cardinality(p_steps)
         WHERE i.id = p_id AND i.tenant_id = p_tenant AND i.assigned_to = p_worker
           AND i.generation = p_generation AND i.status = 'running'
           AND i.event_count = COALESCE(p_first, i.event_count)
           AND NOT EXISTS (SELECT 1 FROM workflows_workflowinstance AS c
                            WHERE c.parent_id = i.id AND c.status NOT IN ('dead_lettered', 'done', 'failed', 'terminated'))
        RETURNING i.id, i.tenant_id, i.parent_id
    ), appended AS (
        INSERT INTO workflows_workflowevent
               (tenant_id, instance_id, step, type_code, payload, timestamp_ms, checksum,
                intent_at, created_at)
        SELECT fence.tenant_id, fence.id, e.step, e.type_code, e.payload, e.ts, e.checksum,
               e.intent_at, p_now
          FROM fence,
               unnest(p_steps, p_types, p_payloads, p_ts, p_checksums, p_intents)
               AS e(step, type_code, payload, ts, checksum, intent_at)
        RETURNING 1
    ), released AS (
        DELETE FROM workflows_concurrencykey AS k USING fence
         WHERE k.tenant_id = fence.tenant_id AND k.holder = p_lock_holder
        RETURNING 1
    )
    SELECT true, fence.parent_id INTO v_matched, v_parent FROM fence;
    IF v_matched THEN
        UPDATE workflows_updaterequest AS u SET status = 'failed', result = p_updates_result,
               completed_at = p_now
         WHERE u.instance_id = p_id AND u.status = 'pending';
        RETURN QUERY SELECT v_parent;
    END IF;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(FINALIZE_DONE_SQL)
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0019_append_events_function"),
    ]

    operations = [migrations.RunPython(create, drop)]
