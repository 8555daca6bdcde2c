"""PostgreSQL: the definer function that leases due invocations across tenants."""

from __future__ import annotations

from django.db import migrations

from workflows import rls
from workflows.store.invocations import CLAIM_SQL

SIGNATURE = "cleat.claim_invocations(timestamptz, integer, timestamptz)"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = rls.app_role()
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CLAIM_SQL)
        cursor.execute(f"GRANT SELECT, UPDATE ON workflows_invocation TO {rls.DISPATCHER_ROLE}")
        cursor.execute(f"ALTER FUNCTION {SIGNATURE} OWNER TO {rls.DISPATCHER_ROLE}")
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [("workflows", "0002_default_tenant_and_rls")]

    operations = [migrations.RunPython(create, drop)]
