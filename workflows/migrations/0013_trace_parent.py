"""Tracing: the W3C traceparent a run's segment spans continue (workflows/tracing.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("workflows", "0012_compiled_artifacts")]

    operations = [
        migrations.AddField(
            model_name="workflowinstance",
            name="trace_parent",
            field=models.CharField(
                blank=True,
                editable=False,
                help_text="W3C traceparent the run's segment spans continue (None: not traced).",
                max_length=55,
                null=True,
            ),
        ),
    ]
