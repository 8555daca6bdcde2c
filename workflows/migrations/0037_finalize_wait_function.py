"""A segment that suspends (a timer, a signal, a child, a task call, a promise: every wait)
is finalized in one call on PostgreSQL: ``cleat.finalize_wait(json, json)`` takes the run's
fenced lock, reads whether something that may wake it arrived meanwhile (after the lock, in a
statement of its own) and writes the transition the store computed both ways, with the run's
remaining events. The general finalize took a transaction of seven statements for it. The
readiness rule becomes a function, ``cleat.wakeup_arrived``, which the general finalize and
the wake sweep call too (a statement planned once per connection instead of one composed at
each call); and a blocking wait's look for a signal is one call of ``cleat.next_signal``
instead of a transaction of four statements. All three run as their caller, under row-level
security, callable by the application role only (bench/README.md, twenty-fourth pass).

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definitions are in workflows/store/sql/postgresql.py. Reversing drops the three functions."""

from django.conf import settings
from django.db import migrations

WAKEUP_ARRIVED_SIGNATURE = "cleat.wakeup_arrived(boolean, uuid, text[], uuid[], uuid, text)"
WAKEUP_ARRIVED_SQL = """
CREATE OR REPLACE FUNCTION cleat.wakeup_arrived(
    p_cancel boolean, p_run uuid, p_signals text[], p_children uuid[], p_task uuid,
    p_promise text)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN p_cancel IS TRUE
        OR EXISTS (SELECT 1 FROM workflows_updaterequest AS u
                    WHERE u.instance_id = p_run
                      AND u.status = 'pending')
        OR (p_signals IS NOT NULL
            AND EXISTS (SELECT 1 FROM workflows_signal AS s
                         WHERE s.instance_id = p_run AND s.consumed_at IS NULL
                           AND s.name = ANY(p_signals)))
        OR (p_children IS NOT NULL
            AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS c
                         WHERE c.id = ANY(p_children) AND c.status IN ('dead_lettered', 'done', 'failed', 'terminated')))
        OR (p_task IS NOT NULL
            AND EXISTS (SELECT 1 FROM workflows_taskcall AS k
                         WHERE k.id = p_task AND k.state = 'reported'))
        OR (p_promise IS NOT NULL
            AND EXISTS (SELECT 1 FROM workflows_promise AS p
                         WHERE p.id = p_promise
                           AND p.status <> 'pending'));
END
$$;
"""
FINALIZE_WAIT_SIGNATURE = "cleat.finalize_wait(json, json)"
FINALIZE_WAIT_SQL = """
CREATE OR REPLACE FUNCTION cleat.finalize_wait(p_runs json, p_events json)
RETURNS TABLE(id uuid, next_wake_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    c record;
    v_cancel boolean;
    v_wake timestamptz;
    v_written integer;
BEGIN
    FOR c IN SELECT * FROM json_to_recordset(p_runs) AS r(id uuid, tenant uuid, worker text, generation bigint, first integer, next integer, now timestamptz, updated_at timestamptz, status text, attempt integer, waiting_on text, result text, error text, error_code text, query_state text, wake_at timestamptz, wake_at_arrived timestamptz, fold_at integer, signals text[], children uuid[], task uuid, promise text)
    LOOP
        PERFORM set_config('cleat.tenant_id', c.tenant::text, true);
        SELECT i.cancel_requested INTO v_cancel FROM workflows_workflowinstance AS i
         WHERE i.id = c.id AND i.tenant_id = c.tenant AND i.generation = c.generation
           AND i.event_count = COALESCE(c.first, i.event_count)
           AND (i.assigned_to = c.worker) IS TRUE AND (i.status = 'running') IS TRUE
           AND (c.fold_at <= 0
                OR COALESCE(c.next, i.event_count) - i.compacted_events < c.fold_at)
           FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_wake := CASE WHEN cleat.wakeup_arrived(v_cancel, c.id, c.signals, c.children,
                                                 c.task, c.promise)
                       THEN c.wake_at_arrived ELSE c.wake_at END;
        WITH fence AS (
            UPDATE workflows_workflowinstance AS i
               SET status = c.status, attempt = COALESCE(c.attempt, i.attempt),
                   waiting_on = c.waiting_on::jsonb, next_wake_at = v_wake,
                   result = c.result, error = c.error, error_code = c.error_code,
                   query_state = c.query_state::jsonb, assigned_to = NULL,
                   heartbeat_at = c.now, updated_at = c.updated_at,
                   event_count = COALESCE(c.next, i.event_count)
             WHERE i.id = c.id AND i.tenant_id = c.tenant
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
        SELECT count(*) INTO v_written FROM fence;
        id := c.id;
        next_wake_at := v_wake;
        RETURN NEXT;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""
NEXT_SIGNAL_SIGNATURE = "cleat.next_signal(uuid, uuid, text[], bigint[])"
NEXT_SIGNAL_SQL = """
CREATE OR REPLACE FUNCTION cleat.next_signal(
    p_tenant uuid, p_id uuid, p_names text[], p_exclude bigint[])
RETURNS TABLE(id bigint, name varchar, payload text, correlation_id varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT s.id, s.name, s.payload, s.correlation_id
      FROM workflows_signal AS s
     WHERE s.tenant_id = p_tenant AND s.instance_id = p_id AND s.consumed_at IS NULL
       AND s.name = ANY(p_names) AND NOT (s.id = ANY(p_exclude))
     ORDER BY s.id
     LIMIT 1;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        # wakeup_arrived first: finalize_wait calls it
        for sql, signature in (
            (WAKEUP_ARRIVED_SQL, WAKEUP_ARRIVED_SIGNATURE),
            (FINALIZE_WAIT_SQL, FINALIZE_WAIT_SIGNATURE),
            (NEXT_SIGNAL_SQL, NEXT_SIGNAL_SIGNATURE),
        ):
            cursor.execute(sql)
            cursor.execute(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
            cursor.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {role}")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {NEXT_SIGNAL_SIGNATURE}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {FINALIZE_WAIT_SIGNATURE}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {WAKEUP_ARRIVED_SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0036_fence_finds_runs_by_key"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
