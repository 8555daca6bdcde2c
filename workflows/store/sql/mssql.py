"""SQL Server: the store's hand-written statements and the security policy.

**Not run by CI**: no SQL Server runs here, so everything in this module is written to the
same design as the PostgreSQL one but untested (docs/persistence.md); treat that backend as
unsupported until a CI job runs it. The tenant travels in SESSION_CONTEXT('cleat.tenant_id'),
set per transaction with sp_set_session_context; the predicate is fail-closed (NULL context
matches no row).
"""

from __future__ import annotations

# tenant_context(): the tenant id (NULL for none).
SET_SESSION_TENANT = "EXEC sp_set_session_context @key = N'cleat.tenant_id', @value = %s"

# The claim, with the task queues spelled out: format ``queues`` with one placeholder each.
# Turns between tenants as on PostgreSQL (each active tenant's first run before anyone's
# second, the tenant served longest ago first); the running cap is not applied here.
MSSQL_CLAIM_SQL = """
WITH ranked AS (
    SELECT c.id, c.priority, c.next_wake_at, t.last_claimed_at,
           ROW_NUMBER() OVER (PARTITION BY c.tenant_id
                              ORDER BY c.priority DESC, c.next_wake_at, c.created_at) AS turn
      FROM workflows_workflowinstance AS c WITH (READPAST, UPDLOCK, ROWLOCK)
      JOIN workflows_tenant AS t ON t.id = c.tenant_id AND t.is_active = 1
     WHERE c.status = 'ready' AND c.next_wake_at <= %s AND c.task_queue IN ({queues})),
due AS (
    SELECT TOP (%s) id FROM ranked
     ORDER BY turn, CASE WHEN last_claimed_at IS NULL THEN 0 ELSE 1 END, last_claimed_at,
              priority DESC, next_wake_at)
UPDATE i SET status = 'running', assigned_to = %s, heartbeat_at = %s,
             generation = i.generation + 1, started_at = COALESCE(i.started_at, %s)
OUTPUT inserted.id, inserted.tenant_id, inserted.generation
  FROM workflows_workflowinstance AS i JOIN due ON due.id = i.id
"""

QUERIES = {
    "set_session_tenant": SET_SESSION_TENANT,
    "claim_ready_listed": MSSQL_CLAIM_SQL,
    # The server's clock in UTC (naive): the fleet's common time (workflows/worker.py).
    "database_now": "SELECT SYSUTCDATETIME()",
}


# --- what the migrations install (live definition; frozen copies in the migrations) ----------


def mssql_security_policy_sql(tables: tuple[str, ...], policy: str = "tenant_policy") -> list[str]:
    statements = [
        "IF SCHEMA_ID('cleat') IS NULL EXEC('CREATE SCHEMA cleat')",
        """CREATE OR ALTER FUNCTION cleat.tenant_predicate(@tenant_id uniqueidentifier)
RETURNS TABLE WITH SCHEMABINDING AS
RETURN SELECT 1 AS allowed
 WHERE @tenant_id = CAST(SESSION_CONTEXT(N'cleat.tenant_id') AS uniqueidentifier)""",
    ]
    predicates = ",\n".join(
        f"ADD FILTER PREDICATE cleat.tenant_predicate(tenant_id) ON dbo.{t},\n"
        f"ADD BLOCK PREDICATE cleat.tenant_predicate(tenant_id) ON dbo.{t}"
        for t in tables
    )
    statements.append(
        f"IF OBJECT_ID('cleat.{policy}') IS NOT NULL DROP SECURITY POLICY cleat.{policy}"
    )
    statements.append(f"CREATE SECURITY POLICY cleat.{policy}\n{predicates}\nWITH (STATE = ON)")
    return statements
