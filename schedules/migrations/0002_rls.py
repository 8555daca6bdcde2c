"""Row-level security on the schedules table (PostgreSQL).

The SQL is a frozen copy of what this migration installs (a migration must not import the
apps' live modules); the live definitions are in workflows/store/sql/."""

from __future__ import annotations

from django.conf import settings
from django.db import migrations

SCHEDULE_TABLES = ("schedules_schedule",)


def app_role() -> str:
    return str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))


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


def enable(apps, schema_editor):
    if schema_editor.connection.vendor == "microsoft":
        with schema_editor.connection.cursor() as cursor:
            for statement in mssql_security_policy_sql(SCHEDULE_TABLES, "schedule_policy"):
                cursor.execute(statement)
        return
    if schema_editor.connection.vendor != "postgresql":
        return
    role = app_role()
    with schema_editor.connection.cursor() as cursor:
        for table in SCHEDULE_TABLES:
            cursor.execute(enable_rls_sql(table))
            cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")


def disable(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for table in SCHEDULE_TABLES:
            cursor.execute(disable_rls_sql(table))


class Migration(migrations.Migration):
    dependencies = [("schedules", "0001_initial"), ("workflows", "0002_default_tenant_and_rls")]

    operations = [migrations.RunPython(enable, disable)]
