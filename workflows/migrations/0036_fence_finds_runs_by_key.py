"""The fence's test that a run is the worker's and running is written so that no index can
serve it, in the four PostgreSQL functions that check it: the append
(``cleat.append_events``), the finalize (``cleat.finalize_done``) and the loads
(``cleat.load_instance`` and ``cleat.load_history``, ``cleat.load_claimed_instances`` and
``cleat.load_claimed_histories``). ``r.assigned_to = worker AND r.status = 'running'``
becomes ``(r.assigned_to = worker) IS TRUE AND (r.status = 'running') IS TRUE``: the same
result, but the planner now finds each run by its primary key.

With the bare comparisons, the plan each function keeps for its connection could read the
runs through ``instance_due`` (every running run) and compare each with every run of the
call: statistics taken while few runs were running (most runs have ended; a table analyzed
while its runs waited has no running run at all) made that plan look as cheap as the key's.
In a drain of 8,000 due timers by two worker processes, one claim's load of 57 runs read
1,596 rows it then threw away; the waste grows with the running runs of every worker
(bench/README.md, twenty-second pass).

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definitions are in workflows/store/sql/postgresql.py. ``CREATE OR REPLACE`` keeps each
function's grants. Reversing reinstalls the definitions this replaces (frozen here too)."""

from django.db import migrations

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
               AND i.generation = c.generation AND i.event_count = c.first
               AND (i.assigned_to = c.worker) IS TRUE AND (i.status = 'running') IS TRUE
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
LOAD_SQL = """
CREATE OR REPLACE FUNCTION cleat.load_instance(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(i workflows_workflowinstance, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT r, d.sha256, d.max_history_length, d.min_version
      FROM workflows_workflowinstance AS r JOIN workflows_workflowdefinition AS d ON d.id = r.definition_id
     WHERE r.id = p_id AND r.tenant_id = p_tenant AND r.generation = p_generation
           AND (r.assigned_to = p_worker) IS TRUE AND (r.status = 'running') IS TRUE;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_history(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(step integer, type_code smallint, timestamp_ms bigint, payload text,
              checksum varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT e.step, e.type_code, e.timestamp_ms, e.payload, e.checksum
      FROM workflows_workflowevent AS e
     WHERE e.instance_id = p_id
       AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS r
                    WHERE r.id = p_id AND r.tenant_id = p_tenant AND r.generation = p_generation
           AND (r.assigned_to = p_worker) IS TRUE AND (r.status = 'running') IS TRUE)
     ORDER BY e.step;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""
LOAD_CLAIMED_SQL = """
CREATE OR REPLACE FUNCTION cleat.load_claimed_instances(p_worker text)
RETURNS TABLE(i workflows_workflowinstance, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT r, d.sha256, d.max_history_length, d.min_version
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          JOIN workflows_workflowdefinition AS d ON d.id = r.definition_id
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant AND r.generation = c.generation
           AND (r.assigned_to = p_worker) IS TRUE AND (r.status = 'running') IS TRUE;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_claimed_histories(p_worker text)
RETURNS TABLE(instance_id uuid, step integer, type_code smallint, timestamp_ms bigint,
              payload text, checksum varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT e.instance_id, e.step, e.type_code, e.timestamp_ms, e.payload,
               e.checksum
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          JOIN workflows_workflowevent AS e ON e.instance_id = r.id
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant AND r.generation = c.generation
           AND (r.assigned_to = p_worker) IS TRUE AND (r.status = 'running') IS TRUE
         ORDER BY e.instance_id, e.step;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_claimed_interrupts()
RETURNS TABLE(instance_id uuid, cancel_requested boolean, cancel_reason text,
              update_id uuid, update_name varchar, update_payload text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT r.id, r.cancel_requested, r.cancel_reason, u.id, u.name,
               u.payload
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          LEFT JOIN workflows_updaterequest AS u
            ON u.instance_id = r.id AND u.tenant_id = v_tenant AND u.status = 'pending'
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
         ORDER BY r.id, u.created_at, u.id;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""

# What this replaces (the definitions of migrations 0019, 0021, 0028 and 0032 as they stood).
PREVIOUS_APPEND_EVENTS_SQL = """
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
PREVIOUS_LOAD_SQL = """
CREATE OR REPLACE FUNCTION cleat.load_instance(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(i workflows_workflowinstance, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT r, d.sha256, d.max_history_length, d.min_version
      FROM workflows_workflowinstance AS r JOIN workflows_workflowdefinition AS d ON d.id = r.definition_id
     WHERE r.id = p_id AND r.tenant_id = p_tenant AND r.generation = p_generation
           AND r.assigned_to = p_worker AND r.status = 'running';
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_history(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(step integer, type_code smallint, timestamp_ms bigint, payload text,
              checksum varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT e.step, e.type_code, e.timestamp_ms, e.payload, e.checksum
      FROM workflows_workflowevent AS e
     WHERE e.instance_id = p_id
       AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS r
                    WHERE r.id = p_id AND r.tenant_id = p_tenant AND r.generation = p_generation
           AND r.assigned_to = p_worker AND r.status = 'running')
     ORDER BY e.step;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""
PREVIOUS_LOAD_CLAIMED_SQL = """
CREATE OR REPLACE FUNCTION cleat.load_claimed_instances(p_worker text)
RETURNS TABLE(i workflows_workflowinstance, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT r, d.sha256, d.max_history_length, d.min_version
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          JOIN workflows_workflowdefinition AS d ON d.id = r.definition_id
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
           AND r.generation = c.generation AND r.assigned_to = p_worker
           AND r.status = 'running';
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_claimed_histories(p_worker text)
RETURNS TABLE(instance_id uuid, step integer, type_code smallint, timestamp_ms bigint,
              payload text, checksum varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT e.instance_id, e.step, e.type_code, e.timestamp_ms, e.payload,
               e.checksum
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          JOIN workflows_workflowevent AS e ON e.instance_id = r.id
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
           AND r.generation = c.generation AND r.assigned_to = p_worker
           AND r.status = 'running'
         ORDER BY e.instance_id, e.step;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_claimed_interrupts()
RETURNS TABLE(instance_id uuid, cancel_requested boolean, cancel_reason text,
              update_id uuid, update_name varchar, update_payload text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT r.id, r.cancel_requested, r.cancel_reason, u.id, u.name,
               u.payload
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          LEFT JOIN workflows_updaterequest AS u
            ON u.instance_id = r.id AND u.tenant_id = v_tenant AND u.status = 'pending'
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
         ORDER BY r.id, u.created_at, u.id;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def _install(schema_editor, statements):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def forwards(apps, schema_editor):
    _install(schema_editor, (APPEND_EVENTS_SQL, FINALIZE_DONE_SQL, LOAD_SQL, LOAD_CLAIMED_SQL))


def backwards(apps, schema_editor):
    _install(
        schema_editor,
        (
            PREVIOUS_APPEND_EVENTS_SQL,
            PREVIOUS_FINALIZE_DONE_SQL,
            PREVIOUS_LOAD_SQL,
            PREVIOUS_LOAD_CLAIMED_SQL,
        ),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0035_unique_keys_only_where_set"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
