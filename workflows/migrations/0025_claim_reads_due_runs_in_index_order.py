"""The claim reads each tenant's due runs of one queue off an index in the claim's whole
order (priority, due time, creation): ``instance_tenant_due_order`` replaces
``instance_tenant_due`` (which lacked the creation tie-break), and ``cleat.claim_instances``
asks per queue with an equality. Before, among many due runs the claim read and sorted all
of them at every call (about 7 ms per claim among 3,000 due runs, growing with them); now it
reads the few it takes. The new index is built before the old one is dropped.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py. Reversing reinstalls migration 0017's
claim."""

from django.conf import settings
from django.db import migrations, models

SIGNATURE = "cleat.claim_instances(text, text[], integer, timestamptz, uuid, integer, uuid)"
DISPATCHER = "cleat_dispatcher"
CLAIM_IN_INDEX_ORDER = """
CREATE OR REPLACE FUNCTION cleat.claim_instances(
    p_worker text, p_queues text[], p_limit integer, p_now timestamptz, p_tenant uuid,
    p_default_cap integer, p_run uuid)
RETURNS TABLE(id uuid, tenant_id uuid, generation bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH room AS (
        SELECT t.id AS tenant_id, t.last_claimed_at,
               CASE WHEN COALESCE(t.max_running, p_default_cap) > 0
                    THEN LEAST(p_limit, COALESCE(t.max_running, p_default_cap) - (
                         SELECT count(*) FROM (
                                SELECT 1 FROM workflows_workflowinstance AS r
                                 WHERE r.tenant_id = t.id AND r.status = 'running'
                                 LIMIT COALESCE(t.max_running, p_default_cap)) AS n))
                    ELSE p_limit END AS room
          FROM workflows_tenant AS t
         WHERE t.is_active AND (p_tenant IS NULL OR t.id = p_tenant)
           -- only tenants with something due pay for counting their running runs
           AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS w
                        WHERE w.tenant_id = t.id AND w.status = 'ready'
                          AND w.next_wake_at <= p_now AND w.task_queue = ANY(p_queues)
                          AND (p_run IS NULL OR w.id = p_run))
    ),
    -- Each (tenant, queue) reads its most urgent runs off instance_tenant_due_order in its
    -- order, stopping at the room: an equality on the queue (not = ANY) keeps that order,
    -- so a claim among many due runs reads a few index entries instead of sorting them all.
    candidates AS (
        SELECT c.id, c.tenant_id, r.last_claimed_at, c.priority, c.next_wake_at, c.created_at
          FROM room AS r
          CROSS JOIN LATERAL (
                SELECT q.id, q.tenant_id, q.priority, q.next_wake_at, q.created_at
                  FROM (SELECT DISTINCT unnest(p_queues) AS name) AS queue
                  CROSS JOIN LATERAL (
                        SELECT d.id, d.tenant_id, d.priority, d.next_wake_at, d.created_at
                          FROM workflows_workflowinstance AS d
                         WHERE d.tenant_id = r.tenant_id AND d.status = 'ready'
                           AND d.task_queue = queue.name AND d.next_wake_at <= p_now
                           AND (p_run IS NULL OR d.id = p_run)
                         ORDER BY d.priority DESC, d.next_wake_at, d.created_at
                         LIMIT GREATEST(r.room, 0)
                           FOR UPDATE SKIP LOCKED) AS q
                 ORDER BY q.priority DESC, q.next_wake_at, q.created_at
                 LIMIT GREATEST(r.room, 0)) AS c
         WHERE r.room > 0
    ),
    chosen AS (
        SELECT k.id FROM (
               SELECT candidates.*, row_number() OVER (
                      PARTITION BY candidates.tenant_id
                      ORDER BY candidates.priority DESC, candidates.next_wake_at,
                               candidates.created_at) AS turn
                 FROM candidates) AS k
         ORDER BY k.turn, k.last_claimed_at NULLS FIRST, k.priority DESC, k.next_wake_at
         LIMIT p_limit
    ),
    claimed AS (
        UPDATE workflows_workflowinstance AS i
           SET status = 'running', assigned_to = p_worker, heartbeat_at = p_now,
               generation = i.generation + 1, started_at = COALESCE(i.started_at, p_now),
               updated_at = p_now
         WHERE i.id IN (SELECT chosen.id FROM chosen)
        RETURNING i.id, i.tenant_id, i.generation
    ),
    served AS (
        -- SKIP LOCKED: a claim never waits for (nor deadlocks with) another claim's turn
        -- record; a tenant whose row is busy keeps its older turn this once. Turns are
        -- recorded only when tenants competed: a tenant alone with due runs took no turn.
        UPDATE workflows_tenant AS t SET last_claimed_at = p_now
         WHERE t.id IN (SELECT s.id FROM workflows_tenant AS s
                         WHERE s.id IN (SELECT claimed.tenant_id FROM claimed)
                           AND (SELECT count(*) FROM room) > 1
                           FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT claimed.id, claimed.tenant_id, claimed.generation FROM claimed;
END
$$;
"""
CLAIM_0017 = """
CREATE OR REPLACE FUNCTION cleat.claim_instances(
    p_worker text, p_queues text[], p_limit integer, p_now timestamptz, p_tenant uuid,
    p_default_cap integer, p_run uuid)
RETURNS TABLE(id uuid, tenant_id uuid, generation bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH room AS (
        SELECT t.id AS tenant_id, t.last_claimed_at,
               CASE WHEN COALESCE(t.max_running, p_default_cap) > 0
                    THEN LEAST(p_limit, COALESCE(t.max_running, p_default_cap) - (
                         SELECT count(*) FROM (
                                SELECT 1 FROM workflows_workflowinstance AS r
                                 WHERE r.tenant_id = t.id AND r.status = 'running'
                                 LIMIT COALESCE(t.max_running, p_default_cap)) AS n))
                    ELSE p_limit END AS room
          FROM workflows_tenant AS t
         WHERE t.is_active AND (p_tenant IS NULL OR t.id = p_tenant)
           -- only tenants with something due pay for counting their running runs
           AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS w
                        WHERE w.tenant_id = t.id AND w.status = 'ready'
                          AND w.next_wake_at <= p_now AND w.task_queue = ANY(p_queues)
                          AND (p_run IS NULL OR w.id = p_run))
    ),
    candidates AS (
        SELECT c.id, c.tenant_id, r.last_claimed_at, c.priority, c.next_wake_at, c.created_at
          FROM room AS r
          CROSS JOIN LATERAL (
                SELECT d.id, d.tenant_id, d.priority, d.next_wake_at, d.created_at
                  FROM workflows_workflowinstance AS d
                 WHERE d.tenant_id = r.tenant_id AND d.status = 'ready'
                   AND d.next_wake_at <= p_now AND d.task_queue = ANY(p_queues)
                   AND (p_run IS NULL OR d.id = p_run)
                 ORDER BY d.priority DESC, d.next_wake_at, d.created_at
                 LIMIT GREATEST(r.room, 0)
                   FOR UPDATE SKIP LOCKED) AS c
         WHERE r.room > 0
    ),
    chosen AS (
        SELECT k.id FROM (
               SELECT candidates.*, row_number() OVER (
                      PARTITION BY candidates.tenant_id
                      ORDER BY candidates.priority DESC, candidates.next_wake_at,
                               candidates.created_at) AS turn
                 FROM candidates) AS k
         ORDER BY k.turn, k.last_claimed_at NULLS FIRST, k.priority DESC, k.next_wake_at
         LIMIT p_limit
    ),
    claimed AS (
        UPDATE workflows_workflowinstance AS i
           SET status = 'running', assigned_to = p_worker, heartbeat_at = p_now,
               generation = i.generation + 1, started_at = COALESCE(i.started_at, p_now),
               updated_at = p_now
         WHERE i.id IN (SELECT chosen.id FROM chosen)
        RETURNING i.id, i.tenant_id, i.generation
    ),
    served AS (
        -- SKIP LOCKED: a claim never waits for (nor deadlocks with) another claim's turn
        -- record; a tenant whose row is busy keeps its older turn this once. Turns are
        -- recorded only when tenants competed: a tenant alone with due runs took no turn.
        UPDATE workflows_tenant AS t SET last_claimed_at = p_now
         WHERE t.id IN (SELECT s.id FROM workflows_tenant AS s
                         WHERE s.id IN (SELECT claimed.tenant_id FROM claimed)
                           AND (SELECT count(*) FROM room) > 1
                           FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT claimed.id, claimed.tenant_id, claimed.generation FROM claimed;
END
$$;
"""


def _install(schema_editor, text):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = getattr(settings, "CLEAT_APP_ROLE", "cleat_app")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(text)
        cursor.execute(
            f"ALTER FUNCTION {SIGNATURE} OWNER TO {DISPATCHER};\n"
            f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC;\n"
            f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role};\n"
        )


def forwards(apps, schema_editor):
    _install(schema_editor, CLAIM_IN_INDEX_ORDER)


def backwards(apps, schema_editor):
    _install(schema_editor, CLAIM_0017)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0024_run_interrupts_function"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="workflowinstance",
            index=models.Index(
                fields=[
                    "tenant",
                    "status",
                    "task_queue",
                    "-priority",
                    "next_wake_at",
                    "created_at",
                ],
                name="instance_tenant_due_order",
            ),
        ),
        migrations.RemoveIndex(
            model_name="workflowinstance",
            name="instance_tenant_due",
        ),
        migrations.RunPython(forwards, backwards),
    ]
