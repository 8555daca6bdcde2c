"""The wake sweep reads the runs started detached that ended since its last pass, as it reads
the children that ended: the run that started one may await it (migration 0039 made its end
wake that run), and a wake-up lost to a crash was left to the re-check. A partial index on
when they ended, which only detached runs are written to, serves the read
(``instance_detached_ended``); on PostgreSQL the sweep's definer function
``cleat.missed_wakes`` reads it.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py. Reversing reinstalls 0023's."""

from django.conf import settings
from django.db import migrations, models

DISPATCHER_ROLE = "cleat_dispatcher"
SIGNATURE = "cleat.missed_wakes(timestamptz, timestamptz)"
MISSED_WAKES_SQL = """
CREATE OR REPLACE FUNCTION cleat.missed_wakes(p_since timestamptz, p_now timestamptz)
RETURNS TABLE(id uuid, tenant_id uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- Planned at each call with the values in hand (EXECUTE): planned once for any
    -- p_since, the arrival ranges look like a third of each table, and the plan reads the
    -- tables whole (66 ms a call among 400,000 runs; 2 ms planned with the values).
    -- The arrivals are read first, once (MATERIALIZED): planned as a semi-join, a waiting
    -- set the statistics took for one row was scanned run by run against the arrivals,
    -- a seconds-long sweep among 10,000 waiting runs that held up the worker's loop.
    RETURN QUERY EXECUTE $sweep$
    WITH arrived AS MATERIALIZED (
        SELECT c.parent_id AS id FROM workflows_workflowinstance AS c
         WHERE c.completed_at >= $1 AND c.parent_id IS NOT NULL
        UNION ALL
        SELECT c.detached_from FROM workflows_workflowinstance AS c
         WHERE c.completed_at >= $1 AND c.detached_from IS NOT NULL
        UNION ALL
        SELECT s.instance_id FROM workflows_signal AS s
         WHERE s.created_at >= $1 AND s.consumed_at IS NULL
        UNION ALL
        SELECT u.instance_id FROM workflows_updaterequest AS u
         WHERE u.status = 'pending' AND u.created_at >= $1
        UNION ALL
        SELECT k.instance_id FROM workflows_taskcall AS k
         WHERE k.state = 'reported' AND k.reported_at >= $1
        UNION ALL
        SELECT p.instance_id FROM workflows_promise AS p
         WHERE p.settled_at >= $1)
    SELECT w.id, w.tenant_id
      FROM workflows_workflowinstance AS w
     WHERE w.id IN (SELECT a.id FROM arrived AS a)
       AND w.status = 'ready' AND (w.next_wake_at IS NULL OR w.next_wake_at > $2)
    UNION
    SELECT w.id, w.tenant_id
      FROM workflows_workflowinstance AS w
     WHERE w.cancel_requested AND w.status = 'ready'
       AND (w.next_wake_at IS NULL OR w.next_wake_at > $2)
    $sweep$ USING p_since, p_now;
END
$$;
"""

# 0023's function, for reversing.
PREVIOUS_MISSED_WAKES_SQL = """
CREATE OR REPLACE FUNCTION cleat.missed_wakes(p_since timestamptz, p_now timestamptz)
RETURNS TABLE(id uuid, tenant_id uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- Planned at each call with the values in hand (EXECUTE): planned once for any
    -- p_since, the arrival ranges look like a third of each table, and the plan reads the
    -- tables whole (66 ms a call among 400,000 runs; 2 ms planned with the values).
    -- The arrivals are read first, once (MATERIALIZED): planned as a semi-join, a waiting
    -- set the statistics took for one row was scanned run by run against the arrivals,
    -- a seconds-long sweep among 10,000 waiting runs that held up the worker's loop.
    RETURN QUERY EXECUTE $sweep$
    WITH arrived AS MATERIALIZED (
        SELECT c.parent_id AS id FROM workflows_workflowinstance AS c
         WHERE c.completed_at >= $1 AND c.parent_id IS NOT NULL
        UNION ALL
        SELECT s.instance_id FROM workflows_signal AS s
         WHERE s.created_at >= $1 AND s.consumed_at IS NULL
        UNION ALL
        SELECT u.instance_id FROM workflows_updaterequest AS u
         WHERE u.status = 'pending' AND u.created_at >= $1
        UNION ALL
        SELECT k.instance_id FROM workflows_taskcall AS k
         WHERE k.state = 'reported' AND k.reported_at >= $1
        UNION ALL
        SELECT p.instance_id FROM workflows_promise AS p
         WHERE p.settled_at >= $1)
    SELECT w.id, w.tenant_id
      FROM workflows_workflowinstance AS w
     WHERE w.id IN (SELECT a.id FROM arrived AS a)
       AND w.status = 'ready' AND (w.next_wake_at IS NULL OR w.next_wake_at > $2)
    UNION
    SELECT w.id, w.tenant_id
      FROM workflows_workflowinstance AS w
     WHERE w.cancel_requested AND w.status = 'ready'
       AND (w.next_wake_at IS NULL OR w.next_wake_at > $2)
    $sweep$ USING p_since, p_now;
END
$$;
"""


def _install(schema_editor, text):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(text)
        cursor.execute(f"ALTER FUNCTION {SIGNATURE} OWNER TO {DISPATCHER_ROLE}")
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}")


def forwards(apps, schema_editor):
    _install(schema_editor, MISSED_WAKES_SQL)


def backwards(apps, schema_editor):
    _install(schema_editor, PREVIOUS_MISSED_WAKES_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0039_detached_runs_wake_their_starter"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="workflowinstance",
            index=models.Index(
                condition=models.Q(("detached_from__isnull", False)),
                fields=["completed_at", "detached_from"],
                name="instance_detached_ended",
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
