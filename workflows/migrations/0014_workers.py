"""The worker registry: one row per live ``runworker`` process, upserted on its heartbeats.
Fleet-wide, not tenant-scoped, so not under row-level security (it holds no tenant's data);
on PostgreSQL the application role is granted the table, and the definer function the web
process's /metrics reads the due backlog of every tenant through is installed (a frozen copy
of ``workflows/store/sql/postgresql.py``'s ``ready_backlog_function_sql``)."""

from django.conf import settings
from django.db import migrations, models

WORKER_TABLE = "workflows_workerprocess"
DISPATCHER_ROLE = "cleat_dispatcher"
SIGNATURE = "cleat.ready_backlog(timestamptz)"


def install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"""
GRANT SELECT, INSERT, UPDATE, DELETE ON {WORKER_TABLE} TO {role};

CREATE OR REPLACE FUNCTION cleat.ready_backlog(p_now timestamptz)
RETURNS TABLE(task_queue varchar, definition_name varchar, depth bigint, oldest timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT w.task_queue, w.definition_name, count(*), min(w.next_wake_at)
      FROM workflows_workflowinstance AS w
     WHERE w.status = 'ready' AND w.next_wake_at <= p_now
     GROUP BY w.task_queue, w.definition_name
$$;
ALTER FUNCTION {SIGNATURE} OWNER TO {DISPATCHER_ROLE};
REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role};
"""
        )


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE};")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0013_trace_parent"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkerProcess",
            fields=[
                (
                    "worker_id",
                    models.CharField(
                        help_text="host-pid-suffix, or --worker-id.",
                        max_length=128,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("host", models.CharField(help_text="The machine it runs on.", max_length=255)),
                ("pid", models.PositiveIntegerField(help_text="Its process id on that machine.")),
                (
                    "task_queues",
                    models.JSONField(default=list, help_text="The task queues it claims from."),
                ),
                ("concurrency", models.PositiveIntegerField(help_text="Segments it runs at once.")),
                ("started_at", models.DateTimeField(help_text="Its first heartbeat.")),
                (
                    "heartbeat_at",
                    models.DateTimeField(help_text="Its last heartbeat (the database's clock)."),
                ),
                (
                    "heartbeat_interval_s",
                    models.FloatField(help_text="Seconds between its heartbeats."),
                ),
                (
                    "runs_held",
                    models.PositiveIntegerField(
                        default=0, help_text="Segments running at its last heartbeat, all tenants."
                    ),
                ),
                (
                    "steps_total",
                    models.BigIntegerField(default=0, help_text="Durable steps since it started."),
                ),
                (
                    "steps_per_s",
                    models.FloatField(
                        default=0.0, help_text="Steps per second between its last two heartbeats."
                    ),
                ),
                (
                    "last_error",
                    models.TextField(blank=True, default="", help_text="Its loop's last error."),
                ),
                (
                    "last_error_at",
                    models.DateTimeField(blank=True, help_text="When it happened.", null=True),
                ),
            ],
            options={
                "verbose_name": "worker",
                "ordering": ["worker_id"],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
