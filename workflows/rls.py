"""PostgreSQL row-level security: the policies, the roles, the cross-tenant definer
functions, and the check that names every way a connection escapes them.

Why each piece exists:

* Policies are **fail-closed**: ``cleat.current_tenant()`` raises when no tenant is set, so a
  query that forgot its tenant context errors loudly instead of returning every tenant's rows.
* RLS is **forced** on every tenant-scoped table, so even the tables' owner is subject to it.
* PostgreSQL exempts superusers and ``BYPASSRLS`` roles unconditionally; no ``FORCE`` reaches
  them. The application therefore connects as ``cleat_app`` (created here: no superuser, no
  BYPASSRLS). A deployment that connects as ``postgres`` has policies that are present,
  correct, tested -- and bypassed; :func:`bypass_reasons` says so.
* The worker's claim and lease upkeep must see every tenant's runnable rows. They go through
  ``SECURITY DEFINER`` functions owned by ``cleat_dispatcher``, a NOLOGIN role with
  BYPASSRLS: the exemption belongs to those few statements and nowhere else. Rows they return
  carry ``tenant_id`` and the caller re-scopes to it before touching anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

# Tenant-scoped tables of this app (the schedules app adds its own in its migration).
WORKFLOW_TABLES = (
    "workflows_apikey",
    "workflows_workflowdefinition",
    "workflows_versiontag",
    "workflows_routingrule",
    "workflows_workflowinstance",
    "workflows_workflowevent",
    "workflows_signal",
    "workflows_promise",
    "workflows_updaterequest",
    "workflows_concurrencykey",
    "workflows_workflowstate",
    "workflows_invocation",
    "workflows_auditlog",
)


def app_role() -> str:
    return str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))


DISPATCHER_ROLE = "cleat_dispatcher"

CURRENT_TENANT_FUNCTION = """
CREATE SCHEMA IF NOT EXISTS cleat;
CREATE OR REPLACE FUNCTION cleat.current_tenant() RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text := current_setting('cleat.tenant_id', true);
BEGIN
    IF v IS NULL OR v = '' THEN
        RAISE EXCEPTION 'cleat.tenant_id is not set -- tenant context required for RLS-scoped query'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'wrap the query in workflows.tenancy.tenant_context()';
    END IF;
    RETURN v::uuid;
END $$;
"""


def enable_rls_sql(table: str) -> str:
    # (SELECT ...) makes the planner evaluate the function once per statement, not per row.
    return f"""
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {table};
CREATE POLICY tenant_isolation ON {table}
    USING (tenant_id = (SELECT cleat.current_tenant()))
    WITH CHECK (tenant_id = (SELECT cleat.current_tenant()));
"""


def disable_rls_sql(table: str) -> str:
    return f"""
DROP POLICY IF EXISTS tenant_isolation ON {table};
ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {table} DISABLE ROW LEVEL SECURITY;
"""


def roles_sql(role: str, password: str | None) -> str:
    password_sql = f"ALTER ROLE {role} PASSWORD %(password)s;" if password else ""
    return f"""
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
        CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{DISPATCHER_ROLE}') THEN
        CREATE ROLE {DISPATCHER_ROLE} NOLOGIN BYPASSRLS;
    END IF;
END $$;
{password_sql}
GRANT USAGE ON SCHEMA public TO {role}, {DISPATCHER_ROLE};
GRANT USAGE ON SCHEMA cleat TO {role}, {DISPATCHER_ROLE};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {role};
GRANT SELECT, UPDATE ON workflows_workflowinstance TO {DISPATCHER_ROLE};
"""


def definer_functions_sql(role: str) -> str:
    """The cross-tenant statements of the dispatch loop, as definer functions (as migration
    0002 installs them: 0005_tenant_fairness replaces the claim with one that takes turns
    between tenants, honours their running caps and skips inactive ones)."""
    return f"""
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

CREATE OR REPLACE FUNCTION cleat.reap_expired_leases(p_cutoff timestamptz, p_now timestamptz)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH reaped AS (
        UPDATE workflows_workflowinstance
           SET status = 'ready', assigned_to = NULL, generation = generation + 1,
               next_wake_at = p_now, updated_at = p_now
         WHERE status = 'running' AND heartbeat_at < p_cutoff
        RETURNING 1)
    SELECT count(*)::integer FROM reaped
$$;

CREATE OR REPLACE FUNCTION cleat.heartbeat_worker(p_worker text, p_now timestamptz)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH beat AS (
        UPDATE workflows_workflowinstance SET heartbeat_at = p_now
         WHERE assigned_to = p_worker AND status = 'running'
        RETURNING 1)
    SELECT count(*)::integer FROM beat
$$;

CREATE OR REPLACE FUNCTION cleat.next_due_at(p_queues text[], p_tenant uuid DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT min(next_wake_at) FROM workflows_workflowinstance
     WHERE status = 'ready' AND task_queue = ANY(p_queues)
       AND (p_tenant IS NULL OR tenant_id = p_tenant)
$$;

{_function_privileges(role, _INITIAL_DEFINER_FUNCTIONS)}
"""


# The definer functions as migration 0002 creates them, then as they are now (0005 replaced
# the claim: it takes the default running cap).
_INITIAL_DEFINER_FUNCTIONS = (
    "cleat.claim_instances(text, text[], integer, timestamptz, uuid)",
    "cleat.reap_expired_leases(timestamptz, timestamptz)",
    "cleat.heartbeat_worker(text, timestamptz)",
    "cleat.next_due_at(text[], uuid)",
)
DEFINER_FUNCTIONS = (
    "cleat.claim_instances(text, text[], integer, timestamptz, uuid, integer)",
    *_INITIAL_DEFINER_FUNCTIONS[1:],
)


def _function_privileges(role: str, functions: tuple[str, ...]) -> str:
    """Owned by the dispatcher role; callable by the application role only."""
    lines = []
    for function in functions:
        lines += [
            f"ALTER FUNCTION {function} OWNER TO {DISPATCHER_ROLE};",
            f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC;",
            f"GRANT EXECUTE ON FUNCTION {function} TO {role};",
        ]
    return "\n".join(lines)


# --- SQL Server --------------------------------------------------------------------------------
# Written to the same design but not tested: no SQL Server runs in CI (docs/persistence.md).
# The tenant travels in SESSION_CONTEXT('cleat.tenant_id'), set per transaction with
# sp_set_session_context; the predicate is fail-closed (NULL context matches no row).


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


@dataclass(frozen=True)
class BypassReason:
    kind: str  # superuser, bypassrls, rls_disabled, owner_not_forced, no_policies
    detail: str


def bypass_reasons(connection: Any, tables: tuple[str, ...] | None = None) -> list[BypassReason]:
    """Every reason the given (PostgreSQL) connection would not be held to the policies.
    An empty list means RLS is enforced on it."""
    if connection.vendor != "postgresql":
        return []
    from schedules.rls import SCHEDULE_TABLES

    tables = tables or (*WORKFLOW_TABLES, *SCHEDULE_TABLES)
    reasons: list[BypassReason] = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        user, superuser, bypass = cursor.fetchone()
        if superuser:
            reasons.append(
                BypassReason("superuser", f"the connection's role {user!r} is a superuser")
            )
        if bypass:
            reasons.append(BypassReason("bypassrls", f"the role {user!r} has BYPASSRLS"))
        cursor.execute(
            """
            SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
                   pg_get_userbyid(c.relowner),
                   (SELECT count(*) FROM pg_policies p
                     WHERE p.tablename = c.relname AND p.schemaname = n.nspname)
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relname = ANY(%s)
            """,
            [list(tables)],
        )
        found = {row[0]: row for row in cursor.fetchall()}
    for table in tables:
        row = found.get(table)
        if row is None:
            reasons.append(BypassReason("rls_disabled", f"table {table} does not exist (migrate?)"))
            continue
        _, enabled, forced, owner, policies = row
        if not enabled:
            reasons.append(BypassReason("rls_disabled", f"row-level security is off on {table}"))
        if owner == user and not forced:
            reasons.append(
                BypassReason(
                    "owner_not_forced",
                    f"{user!r} owns {table} and RLS is not forced on it (FORCE ROW LEVEL SECURITY)",
                )
            )
        if not policies:
            reasons.append(BypassReason("no_policies", f"{table} has no policies"))
    return reasons


def format_reasons(reasons: list[BypassReason]) -> str:
    if not reasons:
        return ""
    lines = [f"  - [{r.kind}] {r.detail}" for r in reasons]
    return (
        "Row-level security is NOT enforced on this connection:\n"
        + "\n".join(lines)
        + f"\nConnect as the application role ({app_role()}) created by the migrations, "
        "and run `manage.py migrate` as the tables' owner."
    )
