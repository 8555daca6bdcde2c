"""A run started by ``run_detached`` records the run that started it (``detached_from``), and
its end wakes that run, as a child's end wakes its parent: a run that awaited its detached
run by id slept until its re-check (``CLEAT_WAIT_RECHECK_SECONDS``, an hour by default). A
nullable column without a default: adding it rewrites no row. On PostgreSQL the one-call
finalize of completed runs, ``cleat.finalize_done``, returns for each run the run its end
wakes: its parent, or the run that started it detached.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py. Reversing installs 0036's definition
before the column is dropped."""

from django.db import migrations, models

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
               AND i.generation = c.generation
               AND i.event_count = COALESCE(c.first, i.event_count)
               AND (i.assigned_to = c.worker) IS TRUE AND (i.status = 'running') IS TRUE
               AND NOT EXISTS (SELECT 1 FROM workflows_workflowinstance AS k
                                WHERE k.parent_id = i.id AND k.status NOT IN ('dead_lettered', 'done', 'failed', 'terminated'))
            RETURNING i.id, i.tenant_id, COALESCE(i.parent_id, i.detached_from) AS waker,
                      c.lock_holder
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
        SELECT array_agg(fence.id), array_agg(fence.waker) INTO v_ids, v_parents
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

# 0036's definition, which reversing installs again.
PREVIOUS_FINALIZE_DONE_SQL = """
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
               AND i.generation = c.generation
               AND i.event_count = COALESCE(c.first, i.event_count)
               AND (i.assigned_to = c.worker) IS TRUE AND (i.status = 'running') IS TRUE
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


def _install(schema_editor, sql):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql)


def forwards(apps, schema_editor):
    _install(schema_editor, FINALIZE_DONE_SQL)


def backwards(apps, schema_editor):
    _install(schema_editor, PREVIOUS_FINALIZE_DONE_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0038_children_ended_follow_chains"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowinstance",
            name="detached_from",
            field=models.UUIDField(
                blank=True,
                editable=False,
                help_text="The run that started this one with run_detached (its end wakes "
                "that run).",
                null=True,
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
