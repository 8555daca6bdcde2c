"""Row-level security on the schedules table (PostgreSQL)."""

from __future__ import annotations

from django.db import migrations

from schedules.rls import SCHEDULE_TABLES
from workflows import rls


def enable(apps, schema_editor):
    if schema_editor.connection.vendor == "microsoft":
        with schema_editor.connection.cursor() as cursor:
            for statement in rls.mssql_security_policy_sql(SCHEDULE_TABLES, "schedule_policy"):
                cursor.execute(statement)
        return
    if schema_editor.connection.vendor != "postgresql":
        return
    role = rls.app_role()
    with schema_editor.connection.cursor() as cursor:
        for table in SCHEDULE_TABLES:
            cursor.execute(rls.enable_rls_sql(table))
            cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")


def disable(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for table in SCHEDULE_TABLES:
            cursor.execute(rls.disable_rls_sql(table))


class Migration(migrations.Migration):
    dependencies = [("schedules", "0001_initial"), ("workflows", "0002_default_tenant_and_rls")]

    operations = [migrations.RunPython(enable, disable)]
