"""PostgreSQL: the definer function that leases due invocations across tenants.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py."""

from __future__ import annotations

from django.conf import settings
from django.db import migrations

DISPATCHER_ROLE = "cleat_dispatcher"

CLAIM_SQL = """
CREATE OR REPLACE FUNCTION cleat.claim_invocations(
    p_now timestamptz, p_limit integer, p_until timestamptz)
RETURNS TABLE(id varchar, tenant_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    UPDATE workflows_invocation AS v SET deliver_at = p_until
     WHERE v.id IN (
           SELECT c.id FROM workflows_invocation AS c
            WHERE c.status = 'pending' AND c.deliver_at <= p_now
            ORDER BY c.deliver_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
    RETURNING v.id, v.tenant_id
$$;
"""


def app_role() -> str:
    return str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))


SIGNATURE = "cleat.claim_invocations(timestamptz, integer, timestamptz)"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = app_role()
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CLAIM_SQL)
        cursor.execute(f"GRANT SELECT, UPDATE ON workflows_invocation TO {DISPATCHER_ROLE}")
        cursor.execute(f"ALTER FUNCTION {SIGNATURE} OWNER TO {DISPATCHER_ROLE}")
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [("workflows", "0002_default_tenant_and_rls")]

    operations = [migrations.RunPython(create, drop)]
