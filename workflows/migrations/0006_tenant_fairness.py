"""Fairness between tenants and tenant deactivation: a bounded priority, a per-tenant cap on
running runs (``Tenant.max_running``), the tenant's last turn (``last_claimed_at``), the mark
of runs paused by their tenant's deactivation, the per-tenant due index; on PostgreSQL the
claim function that takes turns between tenants and skips inactive ones, and the invocation
claim that skips inactive tenants."""

import django.core.validators
from django.conf import settings
from django.db import migrations, models


# --- PostgreSQL: the claim, fair across tenants (frozen copies: later code may change) -------
#
# Each active tenant with due runs gets a turn: its most urgent due runs (priority, then due
# time), as many as its room under the running cap (the tenant's max_running, else the
# caller's default; 0 is no cap), locked with SKIP LOCKED; the claim then takes the tenants'
# first runs before anyone's second, the tenant served longest ago first, and records when it
# served each. A tenant's priorities order only its own runs, so one tenant's backlog of
# urgent runs cannot starve another. The tenant rows are not locked: concurrent claims of
# several workers may overshoot a cap by what they claim at the same instant.

FAIR_CLAIM = """
CREATE OR REPLACE FUNCTION cleat.claim_instances(
    p_worker text, p_queues text[], p_limit integer, p_now timestamptz, p_tenant uuid,
    p_default_cap integer)
RETURNS TABLE(id uuid, tenant_id uuid, generation bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH room AS (
        SELECT t.id AS tenant_id, t.last_claimed_at,
               CASE WHEN COALESCE(t.max_running, p_default_cap) > 0
                    THEN LEAST(p_limit, COALESCE(t.max_running, p_default_cap) - (
                         SELECT count(*) FROM workflows_workflowinstance AS r
                          WHERE r.tenant_id = t.id AND r.status = 'running'))
                    ELSE p_limit END AS room
          FROM workflows_tenant AS t
         WHERE t.is_active AND (p_tenant IS NULL OR t.id = p_tenant)
           -- only tenants with something due pay for counting their running runs
           AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS w
                        WHERE w.tenant_id = t.id AND w.status = 'ready'
                          AND w.next_wake_at <= p_now AND w.task_queue = ANY(p_queues))
    ),
    candidates AS (
        SELECT c.id, c.tenant_id, r.last_claimed_at, c.priority, c.next_wake_at, c.created_at
          FROM room AS r
          CROSS JOIN LATERAL (
                SELECT d.id, d.tenant_id, d.priority, d.next_wake_at, d.created_at
                  FROM workflows_workflowinstance AS d
                 WHERE d.tenant_id = r.tenant_id AND d.status = 'ready'
                   AND d.next_wake_at <= p_now AND d.task_queue = ANY(p_queues)
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
        -- record; a tenant whose row is busy keeps its older turn this once.
        UPDATE workflows_tenant AS t SET last_claimed_at = p_now
         WHERE t.id IN (SELECT s.id FROM workflows_tenant AS s
                         WHERE s.id IN (SELECT claimed.tenant_id FROM claimed)
                           FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT claimed.id, claimed.tenant_id, claimed.generation FROM claimed
$$;
"""
FAIR_CLAIM_SIGNATURE = "cleat.claim_instances(text, text[], integer, timestamptz, uuid, integer)"

# The claim 0002 installed (restored when this migration is reversed).
PLAIN_CLAIM = """
CREATE OR REPLACE FUNCTION cleat.claim_instances(
    p_worker text, p_queues text[], p_limit integer, p_now timestamptz, p_tenant uuid DEFAULT NULL)
RETURNS TABLE(id uuid, tenant_id uuid, generation bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    UPDATE workflows_workflowinstance AS i
       SET status = 'running', assigned_to = p_worker, heartbeat_at = p_now,
           generation = i.generation + 1, started_at = COALESCE(i.started_at, p_now),
           updated_at = p_now
     WHERE i.id IN (
           SELECT c.id FROM workflows_workflowinstance AS c
            WHERE c.status = 'ready' AND c.next_wake_at <= p_now
              AND c.task_queue = ANY(p_queues)
              AND (p_tenant IS NULL OR c.tenant_id = p_tenant)
            ORDER BY c.priority DESC, c.next_wake_at, c.created_at
            LIMIT p_limit
              FOR UPDATE SKIP LOCKED)
    RETURNING i.id, i.tenant_id, i.generation
$$;
"""
PLAIN_CLAIM_SIGNATURE = "cleat.claim_instances(text, text[], integer, timestamptz, uuid)"

# Invocations of a deactivated tenant wait (its calls to the outside stop with its runs).
INVOCATIONS_CLAIM = """
CREATE OR REPLACE FUNCTION cleat.claim_invocations(
    p_now timestamptz, p_limit integer, p_until timestamptz)
RETURNS TABLE(id varchar, tenant_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    UPDATE workflows_invocation AS v SET deliver_at = p_until
     WHERE v.id IN (
           SELECT c.id FROM workflows_invocation AS c
             JOIN workflows_tenant AS t ON t.id = c.tenant_id AND t.is_active
            WHERE c.status = 'pending' AND c.deliver_at <= p_now
            ORDER BY c.deliver_at LIMIT p_limit FOR UPDATE OF c SKIP LOCKED)
    RETURNING v.id, v.tenant_id
$$;
"""
PLAIN_INVOCATIONS_CLAIM = """
CREATE OR REPLACE FUNCTION cleat.claim_invocations(
    p_now timestamptz, p_limit integer, p_until timestamptz)
RETURNS TABLE(id varchar, tenant_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    UPDATE workflows_invocation AS v SET deliver_at = p_until
     WHERE v.id IN (
           SELECT c.id FROM workflows_invocation AS c
            WHERE c.status = 'pending' AND c.deliver_at <= p_now
            ORDER BY c.deliver_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
    RETURNING v.id, v.tenant_id
$$;
"""

DISPATCHER = "cleat_dispatcher"


def _owned_by_dispatcher(signature: str, role: str) -> str:
    return (
        f"ALTER FUNCTION {signature} OWNER TO {DISPATCHER};\n"
        f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC;\n"
        f"GRANT EXECUTE ON FUNCTION {signature} TO {role};\n"
    )


def install_fair_claim(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = getattr(settings, "CLEAT_APP_ROLE", "cleat_app")
    with schema_editor.connection.cursor() as cursor:
        # The claim reads the tenants' caps and records when it served each.
        cursor.execute(f"GRANT SELECT, UPDATE ON workflows_tenant TO {DISPATCHER}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {PLAIN_CLAIM_SIGNATURE}")
        cursor.execute(FAIR_CLAIM)
        cursor.execute(_owned_by_dispatcher(FAIR_CLAIM_SIGNATURE, role))
        cursor.execute(INVOCATIONS_CLAIM)


def restore_plain_claim(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = getattr(settings, "CLEAT_APP_ROLE", "cleat_app")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {FAIR_CLAIM_SIGNATURE}")
        cursor.execute(PLAIN_CLAIM)
        cursor.execute(_owned_by_dispatcher(PLAIN_CLAIM_SIGNATURE, role))
        cursor.execute(PLAIN_INVOCATIONS_CLAIM)
        cursor.execute(f"REVOKE UPDATE ON workflows_tenant FROM {DISPATCHER}")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0005_lifecycle_lock_holder_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="last_claimed_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="tenant",
            name="max_running",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Most runs of this tenant running at once (empty: CLEAT_TENANT_MAX_RUNNING).",
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
                verbose_name="most running runs",
            ),
        ),
        migrations.AddField(
            model_name="workflowinstance",
            name="paused_by_deactivation",
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name="tenant",
            name="is_active",
            field=models.BooleanField(
                default=True,
                help_text="Deactivate (the tenant admin's action) to pause every run and schedule.",
            ),
        ),
        migrations.AlterField(
            model_name="workflowinstance",
            name="priority",
            field=models.IntegerField(
                default=0,
                validators=[
                    django.core.validators.MinValueValidator(-100),
                    django.core.validators.MaxValueValidator(100),
                ],
            ),
        ),
        migrations.AddIndex(
            model_name="workflowinstance",
            index=models.Index(
                fields=["tenant", "status", "task_queue", "-priority", "next_wake_at"],
                name="instance_tenant_due",
            ),
        ),
        migrations.RunPython(install_fair_claim, restore_plain_claim),
    ]
