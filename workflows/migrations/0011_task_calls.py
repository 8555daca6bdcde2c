"""Task calls: durable calls that run as Celery tasks, each with the record its outcome is
written to; row-level security on the new table (PostgreSQL), a frozen copy of the policy
0002 installs on the others."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

TASK_CALL_TABLE = "workflows_taskcall"


def enable_rls(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    role = str(getattr(settings, "CLEAT_APP_ROLE", "cleat_app"))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"""
ALTER TABLE {TASK_CALL_TABLE} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {TASK_CALL_TABLE} FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {TASK_CALL_TABLE};
CREATE POLICY tenant_isolation ON {TASK_CALL_TABLE}
    USING (tenant_id = (SELECT cleat.current_tenant()))
    WITH CHECK (tenant_id = (SELECT cleat.current_tenant()));
GRANT SELECT, INSERT, UPDATE, DELETE ON {TASK_CALL_TABLE} TO {role};
"""
        )


def disable_rls(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"""
DROP POLICY IF EXISTS tenant_isolation ON {TASK_CALL_TABLE};
ALTER TABLE {TASK_CALL_TABLE} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {TASK_CALL_TABLE} DISABLE ROW LEVEL SECURITY;
"""
        )


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0009_retention"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskCall",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        help_text="The task's id in the task system.",
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("step", models.PositiveIntegerField()),
                ("service", models.CharField(max_length=128)),
                ("operation", models.CharField(max_length=128)),
                ("idempotency_key", models.CharField(max_length=64)),
                ("token", models.CharField(max_length=64)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("pending", "pending"),
                            ("reported", "reported"),
                            ("settled", "settled"),
                            ("abandoned", "abandoned"),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("sent", models.BooleanField(default=False)),
                ("deadline_ms", models.BigIntegerField(blank=True, null=True)),
                (
                    "status",
                    models.PositiveSmallIntegerField(
                        blank=True,
                        help_text="The ABI status the task's outcome maps to.",
                        null=True,
                    ),
                ),
                ("payload", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("reported_at", models.DateTimeField(blank=True, null=True)),
                (
                    "instance",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="task_calls",
                        to="workflows.workflowinstance",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="workflows.tenant"
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("instance", "step"), name="task_call_step_unique"
                    )
                ],
            },
        ),
        migrations.RunPython(enable_rls, disable_rls),
    ]
