"""PostgreSQL: the schedules' statements (``QUERIES``), and the live definitions of the
definer functions the migrations install (``schedules/migrations/0003`` carries a frozen
copy; ``tests/integration/test_migrations_sql.py`` checks that they match)."""

from __future__ import annotations

QUERIES = {
    "due_schedules": "SELECT id, tenant_id, next_run_at FROM cleat.due_schedules(%s, %s, %s)",
    "next_schedule_at": "SELECT cleat.next_schedule_at(%s)",
}


# --- what the migrations install (live definitions; frozen copies in the migrations) ----------

# -- due_schedules -- every tenant's schedules that need the scheduler now: due, not yet
# initialised (next_run_at NULL), or holding buffered instants whose previous run ended.
DUE_SCHEDULES_SQL = """
CREATE OR REPLACE FUNCTION cleat.due_schedules(
    p_now timestamptz, p_limit integer, p_tenant uuid DEFAULT NULL)
RETURNS TABLE(id uuid, tenant_id uuid, next_run_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT s.id, s.tenant_id, s.next_run_at
      FROM schedules_schedule AS s
      JOIN workflows_tenant AS t ON t.id = s.tenant_id AND t.is_active
     WHERE s.enabled
       AND (p_tenant IS NULL OR s.tenant_id = p_tenant)
       AND (s.next_run_at IS NULL
            OR s.next_run_at <= p_now
            OR (s.buffered_count > 0 AND NOT EXISTS (
                    SELECT 1
                      FROM workflows_workflowinstance AS last
                      JOIN workflows_workflowinstance AS run
                        ON run.tenant_id = last.tenant_id AND run.workflow_id = last.workflow_id
                     WHERE last.id = s.last_run_id
                       AND run.status IN ('ready', 'running', 'paused'))))
     ORDER BY s.next_run_at NULLS FIRST
     LIMIT p_limit
$$;
"""

# -- next_schedule_at -- the earliest instant any enabled schedule is due at (the worker
# sleeps until then).
NEXT_SCHEDULE_AT_SQL = """
CREATE OR REPLACE FUNCTION cleat.next_schedule_at(p_tenant uuid DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT min(s.next_run_at)
      FROM schedules_schedule AS s
      JOIN workflows_tenant AS t ON t.id = s.tenant_id AND t.is_active
     WHERE s.enabled AND (p_tenant IS NULL OR s.tenant_id = p_tenant)
$$;
"""

DEFINER_FUNCTIONS = {
    "cleat.due_schedules(timestamptz, integer, uuid)": DUE_SCHEDULES_SQL,
    "cleat.next_schedule_at(uuid)": NEXT_SCHEDULE_AT_SQL,
}
# What the definer functions read, granted to their owner (it bypasses RLS, not privileges).
DISPATCHER_GRANTS = (
    "GRANT SELECT ON schedules_schedule TO {dispatcher}",
    "GRANT SELECT ON workflows_tenant TO {dispatcher}",
    "GRANT SELECT ON workflows_workflowinstance TO {dispatcher}",
)
