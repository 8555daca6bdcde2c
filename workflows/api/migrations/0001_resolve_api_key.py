"""PostgreSQL: the definer function that finds an API key by its hash across tenants.

Authentication happens before the request's tenant is known, and ``workflows_apikey`` is
row-level secured (fail-closed), so the application role cannot look a key up itself. The
function is owned by ``cleat_dispatcher`` (BYPASSRLS, NOLOGIN), executable by the application
role only, and returns just what authentication needs -- never the hash of another key.
"""

from __future__ import annotations

from django.conf import settings
from django.db import migrations

# Frozen copies: a migration must not import the app's live modules.
DISPATCHER_ROLE = "cleat_dispatcher"


def app_role() -> str:
    return str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))


SIGNATURE = "cleat.resolve_api_key(text)"

RESOLVE_SQL = """
CREATE OR REPLACE FUNCTION cleat.resolve_api_key(p_key_hash text)
RETURNS TABLE(id bigint, tenant_id uuid, name text, role text,
              revoked_at timestamptz, last_used_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT k.id, k.tenant_id, k.name::text, k.role::text, k.revoked_at, k.last_used_at
      FROM workflows_apikey AS k
     WHERE k.key_hash = p_key_hash
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = app_role()
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"GRANT SELECT ON workflows_apikey TO {DISPATCHER_ROLE}")
        cursor.execute(RESOLVE_SQL)
        cursor.execute(f"ALTER FUNCTION {SIGNATURE} OWNER TO {DISPATCHER_ROLE}")
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [("workflows", "0003_claim_invocations")]

    operations = [migrations.RunPython(create, drop)]
