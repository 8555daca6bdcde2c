"""History compaction (engine/compaction.py): how many of a run's first events its
checkpoint (``compaction_state``, a column since 0001) holds, their rows deleted."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("workflows", "0017_dispatch_on_broker")]

    operations = [
        migrations.AddField(
            model_name="workflowinstance",
            name="compacted_events",
            field=models.PositiveIntegerField(default=0),
        ),
    ]
