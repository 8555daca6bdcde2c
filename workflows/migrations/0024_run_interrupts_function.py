"""What a fresh blocking call reads first -- the run's cancellation request and its pending
updates -- as one function, ``cleat.run_interrupts``: one round trip instead of two
transactions, its statement planned once per connection. It runs as its caller, under
row-level security, with the run's tenant set.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py."""

from django.conf import settings
from django.db import migrations

SIGNATURE = "cleat.run_interrupts(uuid, uuid)"
RUN_INTERRUPTS_SQL = """
CREATE OR REPLACE FUNCTION cleat.run_interrupts(p_tenant uuid, p_id uuid)
RETURNS TABLE(cancel_requested boolean, cancel_reason text, update_id uuid,
              update_name varchar, update_payload text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT r.cancel_requested, r.cancel_reason, u.id, u.name, u.payload
      FROM workflows_workflowinstance AS r
      LEFT JOIN workflows_updaterequest AS u
        ON u.instance_id = r.id AND u.tenant_id = p_tenant AND u.status = 'pending'
     WHERE r.id = p_id AND r.tenant_id = p_tenant
     ORDER BY u.created_at, u.id;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(RUN_INTERRUPTS_SQL)
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0023_wake_sweep_reads_arrivals_first"),
    ]

    operations = [migrations.RunPython(create, drop)]
