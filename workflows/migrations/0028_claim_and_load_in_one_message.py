"""The worker's claim and the loads of the runs it claimed, in one message: the claim (the
definer function, unchanged) puts the claimed runs in a transaction-local setting
(``cleat.claimed``), and three functions read their instances, histories and interrupts from
it -- each as its caller, under row-level security, with each tenant of the batch set in
turn and every run fenced as the single load fences it. One round trip for a whole claim
instead of a claim and then one load per run.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py."""

from django.conf import settings
from django.db import migrations

SIGNATURES = (
    "cleat.load_claimed_instances(text)",
    "cleat.load_claimed_histories(text)",
    "cleat.load_claimed_interrupts()",
)
LOAD_CLAIMED_SQL = """
CREATE OR REPLACE FUNCTION cleat.load_claimed_instances(p_worker text)
RETURNS TABLE(i workflows_workflowinstance, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT r, d.sha256, d.max_history_length, d.min_version
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          JOIN workflows_workflowdefinition AS d ON d.id = r.definition_id
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
           AND r.generation = c.generation AND r.assigned_to = p_worker
           AND r.status = 'running';
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_claimed_histories(p_worker text)
RETURNS TABLE(instance_id uuid, step integer, type_code smallint, timestamp_ms bigint,
              payload text, checksum varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT e.instance_id, e.step, e.type_code, e.timestamp_ms, e.payload,
               e.checksum
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          JOIN workflows_workflowevent AS e ON e.instance_id = r.id
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
           AND r.generation = c.generation AND r.assigned_to = p_worker
           AND r.status = 'running'
         ORDER BY e.instance_id, e.step;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_claimed_interrupts()
RETURNS TABLE(instance_id uuid, cancel_requested boolean, cancel_reason text,
              update_id uuid, update_name varchar, update_payload text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
    v_claimed json := NULLIF(current_setting('cleat.claimed', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('cleat.tenant_id', v_tenant::text, true);
        RETURN QUERY
        SELECT r.id, r.cancel_requested, r.cancel_reason, u.id, u.name,
               u.payload
          FROM json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)
          JOIN workflows_workflowinstance AS r ON r.id = c.id
          LEFT JOIN workflows_updaterequest AS u
            ON u.instance_id = r.id AND u.tenant_id = v_tenant AND u.status = 'pending'
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
         ORDER BY r.id, u.created_at, u.id;
    END LOOP;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(LOAD_CLAIMED_SQL)
        for signature in SIGNATURES:
            cursor.execute(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
            cursor.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {role}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for signature in SIGNATURES:
            cursor.execute(f"DROP FUNCTION IF EXISTS {signature}")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0027_worker_claim_planned_once"),
    ]

    operations = [migrations.RunPython(create, drop)]
