"""A parent that waits for a child which continued as new no longer spins: the readiness
rule ``cleat.wakeup_arrived`` took a child as ended when the run it named had ended, but a
run that continued as new has ended while its chain goes on, and the parent, woken at once,
read the chain's outcome (none yet), waited again and was woken again, segment after segment,
until the chain ended. The rule now follows each named child's continue-as-new chain to its
last run, as the parent's read of the outcome does (``workflows.models.chain_ends``): ended
when that run has ended. The last run of a chain keeps the parent, whose wake-up its end
sends.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py. Reversing installs 0037's definition."""

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
            AND EXISTS (WITH RECURSIVE chain(id, status) AS (
                            SELECT c.id, c.status FROM workflows_workflowinstance AS c
                             WHERE c.id = ANY(p_children)
                            UNION ALL
                            SELECT n.id, n.status FROM workflows_workflowinstance AS n
                              JOIN chain ON n.continued_from_id = chain.id)
                        SELECT 1 FROM chain
                         WHERE chain.status IN ('dead_lettered', 'done', 'failed', 'terminated')
                           AND NOT EXISTS (SELECT 1 FROM workflows_workflowinstance AS n
                                            WHERE n.continued_from_id = chain.id)))
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

# 0037's definition, which reversing installs again.
PREVIOUS_SQL = """
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


def _install(schema_editor, sql):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {WAKEUP_ARRIVED_SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {WAKEUP_ARRIVED_SIGNATURE} TO {role}")


def forwards(apps, schema_editor):
    _install(schema_editor, WAKEUP_ARRIVED_SQL)


def backwards(apps, schema_editor):
    _install(schema_editor, PREVIOUS_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0037_finalize_wait_function"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
