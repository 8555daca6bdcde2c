"""Retention: the per-tenant and per-definition policies (``RetentionPolicy``, secured by
row-level security on PostgreSQL), the purge's mark on a run it is deleting
(``WorkflowInstance.purge_batch``) and its index (a tenant's runs of a status by end time).

The SQL is a frozen copy (a migration never imports the live modules)."""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


TABLE = "workflows_retentionpolicy"

# The policy of every tenant-scoped table, as 0002 installs it.
ENABLE_RLS = f"""
ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {TABLE} FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {TABLE};
CREATE POLICY tenant_isolation ON {TABLE}
    USING (tenant_id = (SELECT cleat.current_tenant()))
    WITH CHECK (tenant_id = (SELECT cleat.current_tenant()));
"""

DISABLE_RLS = f"""
DROP POLICY IF EXISTS tenant_isolation ON {TABLE};
ALTER TABLE {TABLE} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {TABLE} DISABLE ROW LEVEL SECURITY;
"""


def enable_rls(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(ENABLE_RLS)


def disable_rls(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(DISABLE_RLS)


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0008_versions_and_policies"),
    ]

    operations = [
        migrations.CreateModel(
            name="RetentionPolicy",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "definition_name",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Empty: the tenant's policy; a definition's name: that definition's runs.",
                        max_length=128,
                    ),
                ),
                (
                    "finished_days",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Days finished runs (done, failed, terminated, cancelled) are kept; 'off' keeps them forever; empty inherits.",
                        max_length=8,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^(|off|[0-9]{1,6})$",
                                "Give a number of days, 'off' (keep forever) or nothing (inherit).",
                            )
                        ],
                    ),
                ),
                (
                    "dead_lettered_days",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Days dead-lettered runs are kept; 'off' keeps them forever; empty inherits.",
                        max_length=8,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^(|off|[0-9]{1,6})$",
                                "Give a number of days, 'off' (keep forever) or nothing (inherit).",
                            )
                        ],
                    ),
                ),
                (
                    "start_keys_days",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Days start idempotency keys are kept; 'off' keeps them forever; empty inherits.",
                        max_length=8,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^(|off|[0-9]{1,6})$",
                                "Give a number of days, 'off' (keep forever) or nothing (inherit).",
                            )
                        ],
                    ),
                ),
                (
                    "service_keys_days",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Days delivered or failed service calls (durable_send, durable_schedule_invoke) and their idempotency keys (tenant policy only) are kept; 'off' keeps them forever; empty inherits.",
                        max_length=8,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^(|off|[0-9]{1,6})$",
                                "Give a number of days, 'off' (keep forever) or nothing (inherit).",
                            )
                        ],
                    ),
                ),
                (
                    "audit_days",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Days audit rows (tenant policy only) are kept; 'off' keeps them forever; empty inherits.",
                        max_length=8,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^(|off|[0-9]{1,6})$",
                                "Give a number of days, 'off' (keep forever) or nothing (inherit).",
                            )
                        ],
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "retention policy",
                "verbose_name_plural": "retention policies",
                "ordering": ["definition_name"],
            },
        ),
        migrations.AddField(
            model_name="workflowinstance",
            name="purge_batch",
            field=models.CharField(blank=True, editable=False, max_length=32, null=True),
        ),
        migrations.AddIndex(
            model_name="workflowinstance",
            index=models.Index(
                fields=["tenant", "status", "completed_at"], name="instance_retention"
            ),
        ),
        migrations.AddIndex(
            model_name="workflowinstance",
            index=models.Index(fields=["tenant", "purge_batch"], name="instance_purge_batch"),
        ),
        migrations.AddField(
            model_name="retentionpolicy",
            name="tenant",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, to="workflows.tenant"
            ),
        ),
        migrations.AddConstraint(
            model_name="retentionpolicy",
            constraint=models.UniqueConstraint(
                fields=("tenant", "definition_name"), name="retention_policy_unique"
            ),
        ),
        migrations.RunPython(enable_rls, disable_rls),
    ]
