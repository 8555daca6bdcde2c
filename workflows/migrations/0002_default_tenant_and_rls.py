"""The default tenant; on PostgreSQL, row-level security, the application role and the
cross-tenant definer functions (see workflows/rls.py for why each exists).

The SQL is a frozen copy of what this migration installs (a migration must not import the
app's live modules, whose statements move on): the live definitions are in
workflows/store/sql/, and tests/integration/test_migrations_sql.py checks that they match
what a fresh migrate installs.
"""

from __future__ import annotations

from django.conf import settings
from django.db import migrations

DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000000"

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
    """The cross-tenant statements of the dispatch loop, as definer functions."""
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

{_function_privileges(role)}
"""


DEFINER_FUNCTIONS = (
    "cleat.claim_instances(text, text[], integer, timestamptz, uuid)",
    "cleat.reap_expired_leases(timestamptz, timestamptz)",
    "cleat.heartbeat_worker(text, timestamptz)",
    "cleat.next_due_at(text[], uuid)",
)


def _function_privileges(role: str) -> str:
    """Owned by the dispatcher role; callable by the application role only."""
    lines = []
    for function in DEFINER_FUNCTIONS:
        lines += [
            f"ALTER FUNCTION {function} OWNER TO {DISPATCHER_ROLE};",
            f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC;",
            f"GRANT EXECUTE ON FUNCTION {function} TO {role};",
        ]
    return "\n".join(lines)


# --- SQL Server (written, not run by CI) -----------------------------------------------------


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


def create_default_tenant(apps, schema_editor):
    Tenant = apps.get_model("workflows", "Tenant")
    Tenant.objects.using(schema_editor.connection.alias).get_or_create(
        id=DEFAULT_TENANT_ID, defaults={"name": "default"}
    )


def enable_rls(apps, schema_editor):
    if schema_editor.connection.vendor == "microsoft":
        with schema_editor.connection.cursor() as cursor:
            for statement in mssql_security_policy_sql(WORKFLOW_TABLES):
                cursor.execute(statement)
        return
    if schema_editor.connection.vendor != "postgresql":
        return
    role = app_role()
    password = getattr(settings, "CLEAT_APP_ROLE_PASSWORD", "") or None
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CURRENT_TENANT_FUNCTION)
        for table in WORKFLOW_TABLES:
            cursor.execute(enable_rls_sql(table))
        cursor.execute(roles_sql(role, password), {"password": password} if password else None)
        cursor.execute(definer_functions_sql(role))


def disable_rls(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for table in WORKFLOW_TABLES:
            cursor.execute(disable_rls_sql(table))


class Migration(migrations.Migration):
    dependencies = [("workflows", "0001_initial")]

    operations = [
        migrations.RunPython(create_default_tenant, migrations.RunPython.noop),
        migrations.RunPython(enable_rls, disable_rls),
    ]
