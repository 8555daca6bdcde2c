"""The default tenant; on PostgreSQL, row-level security, the application role and the
cross-tenant definer functions (see workflows/rls.py for why each exists)."""

from __future__ import annotations

from django.conf import settings
from django.db import migrations

from workflows import rls

DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000000"


def create_default_tenant(apps, schema_editor):
    Tenant = apps.get_model("workflows", "Tenant")
    Tenant.objects.using(schema_editor.connection.alias).get_or_create(
        id=DEFAULT_TENANT_ID, defaults={"name": "default"}
    )


def enable_rls(apps, schema_editor):
    if schema_editor.connection.vendor == "microsoft":
        with schema_editor.connection.cursor() as cursor:
            for statement in rls.mssql_security_policy_sql(rls.WORKFLOW_TABLES):
                cursor.execute(statement)
        return
    if schema_editor.connection.vendor != "postgresql":
        return
    role = rls.app_role()
    password = getattr(settings, "CLEAT_APP_ROLE_PASSWORD", "") or None
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(rls.CURRENT_TENANT_FUNCTION)
        for table in rls.WORKFLOW_TABLES:
            cursor.execute(rls.enable_rls_sql(table))
        cursor.execute(rls.roles_sql(role, password), {"password": password} if password else None)
        cursor.execute(rls.definer_functions_sql(role))


def disable_rls(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for table in rls.WORKFLOW_TABLES:
            cursor.execute(rls.disable_rls_sql(table))


class Migration(migrations.Migration):
    dependencies = [("workflows", "0001_initial")]

    operations = [
        migrations.RunPython(create_default_tenant, migrations.RunPython.noop),
        migrations.RunPython(enable_rls, disable_rls),
    ]
