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
MSSQL_CLAIM_SQL = """
WITH due AS (
    SELECT TOP (%s) id FROM workflows_workflowinstance WITH (READPAST, UPDLOCK, ROWLOCK)
     WHERE status = 'ready' AND next_wake_at <= %s AND task_queue IN ({queues})
     ORDER BY priority DESC, next_wake_at, created_at)
UPDATE i SET status = 'running', assigned_to = %s, heartbeat_at = %s,
             generation = i.generation + 1, started_at = COALESCE(i.started_at, %s)
OUTPUT inserted.id, inserted.tenant_id, inserted.generation
  FROM workflows_workflowinstance AS i JOIN due ON due.id = i.id
"""

QUERIES = {
    "set_session_tenant": SET_SESSION_TENANT,
    "claim_ready_listed": MSSQL_CLAIM_SQL,
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
