"""The finalize of completed runs takes them all in one call: ``cleat.finalize_done(json,
json)`` -- the runs (each one's fence and what its completion writes) and their remaining
events as two JSON arguments, as ``cleat.append_events`` takes the appends -- replaces the
one-run function of migration 0020 (its values as eighteen parameters). A run finalizes
through it alone, and the group commit finalizes its batch through it in one statement
instead of one statement a run: the worker no longer quotes eighteen parameters a run, and
the server runs one call a batch.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py. Reversing reinstalls migration 0020's
function (a frozen copy of it here too)."""

from django.conf import settings
from django.db import migrations

SIGNATURE = "cleat.finalize_done(json, json)"
# Migration 0020's function, which this replaces (reinstalled by the reversal).
ONE_RUN_SIGNATURE = (
    "cleat.finalize_done(uuid, uuid, text, bigint, integer, text, timestamptz, timest"
    "amptz, text, jsonb, integer[], smallint[], text[], bigint[], varchar[], timestamptz[], text, text)"
)
ONE_RUN_SQL = """
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
FINALIZE_DONE_SQL = """
CREATE OR REPLACE FUNCTION cleat.finalize_done(p_runs json, p_events json)
RETURNS TABLE(id uuid, parent_id uuid)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_tenant uuid;
    v_ids uuid[];
    v_parents uuid[];
BEGIN
    FOR v_tenant IN SELECT DISTINCT r.tenant FROM json_to_recordset(p_runs) AS r(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        WITH fence AS (
            UPDATE workflows_workflowinstance AS i
               SET status = c.status, completed_at = c.now, result = c.result, error = NULL,
                   error_code = NULL, waiting_on = NULL, next_wake_at = NULL,
                   query_state = c.query_state::jsonb, assigned_to = NULL,
                   heartbeat_at = c.now, updated_at = c.updated_at,
                   event_count = COALESCE(c.next, i.event_count)
              FROM json_to_recordset(p_runs) AS c(id uuid, tenant uuid, worker text, generation bigint, first integer, next integer, status text, now timestamptz, updated_at timestamptz, result text, query_state text, lock_holder text, updates_result text)
             WHERE c.tenant = v_tenant AND i.id = c.id AND i.tenant_id = v_tenant
               AND i.assigned_to = c.worker AND i.generation = c.generation
               AND i.status = 'running' AND i.event_count = COALESCE(c.first, i.event_count)
               AND NOT EXISTS (SELECT 1 FROM workflows_workflowinstance AS k
                                WHERE k.parent_id = i.id AND k.status NOT IN ('dead_lettered', 'done', 'failed', 'terminated'))
            RETURNING i.id, i.tenant_id, i.parent_id, c.lock_holder
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
        ), released AS (
            DELETE FROM workflows_concurrencykey AS k USING fence
             WHERE k.tenant_id = fence.tenant_id AND k.holder = fence.lock_holder
            RETURNING 1
        )
        SELECT array_agg(fence.id), array_agg(fence.parent_id) INTO v_ids, v_parents
          FROM fence;
        IF v_ids IS NOT NULL THEN
            UPDATE workflows_updaterequest AS u SET status = 'failed', result = c.updates_result,
                   completed_at = c.now
              FROM json_to_recordset(p_runs) AS c(id uuid, tenant uuid, worker text, generation bigint, first integer, next integer, status text, now timestamptz, updated_at timestamptz, result text, query_state text, lock_holder text, updates_result text)
             WHERE c.tenant = v_tenant AND c.id = ANY(v_ids) AND u.instance_id = c.id
               AND u.status = 'pending';
            RETURN QUERY SELECT * FROM unnest(v_ids, v_parents);
        END IF;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def _replace(schema_editor, old_signature, sql, signature):
    """Drop the function ``old_signature``, install ``sql`` (the function ``signature``),
    callable by the application role only."""
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {old_signature}")
        cursor.execute(sql)
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {role}")


def forwards(apps, schema_editor):
    _replace(schema_editor, ONE_RUN_SIGNATURE, FINALIZE_DONE_SQL, SIGNATURE)


def backwards(apps, schema_editor):
    _replace(schema_editor, SIGNATURE, ONE_RUN_SQL, ONE_RUN_SIGNATURE)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0031_partial_instance_indexes"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
