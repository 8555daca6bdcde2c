"""The load of a claimed run on PostgreSQL as two functions, ``cleat.load_instance`` and
``cleat.load_history``, called in one message: their statements are planned once per
connection instead of at every load. They run as their caller, under row-level security,
with the run's tenant set; the instance comes as the table's own row type.

The SQL is a frozen copy (a migration must not import the app's live modules); the live
definition is in workflows/store/sql/postgresql.py."""

from django.conf import settings
from django.db import migrations

SIGNATURES = (
    "cleat.load_instance(uuid, uuid, bigint, text)",
    "cleat.load_history(uuid, uuid, bigint, text)",
)
LOAD_SQL = """
CREATE OR REPLACE FUNCTION cleat.load_instance(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(i workflows_workflowinstance, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT r, d.sha256, d.max_history_length, d.min_version
      FROM workflows_workflowinstance AS r JOIN workflows_workflowdefinition AS d ON d.id = r.definition_id
     WHERE r.id = p_id AND r.tenant_id = p_tenant AND r.generation = p_generation
           AND r.assigned_to = p_worker AND r.status = 'running';
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
CREATE OR REPLACE FUNCTION cleat.load_history(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(step integer, type_code smallint, timestamp_ms bigint, payload text,
              checksum varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_caller text := current_setting('cleat.tenant_id', true);
BEGIN
    PERFORM set_config('cleat.tenant_id', p_tenant::text, true);
    RETURN QUERY
    SELECT e.step, e.type_code, e.timestamp_ms, e.payload, e.checksum
      FROM workflows_workflowevent AS e
     WHERE e.instance_id = p_id
       AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS r
                    WHERE r.id = p_id AND r.tenant_id = p_tenant AND r.generation = p_generation
           AND r.assigned_to = p_worker AND r.status = 'running')
     ORDER BY e.step;
    PERFORM set_config('cleat.tenant_id', COALESCE(v_caller, ''), true);
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(LOAD_SQL)
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
        ("workflows", "0020_finalize_done_function"),
    ]

    operations = [migrations.RunPython(create, drop)]
