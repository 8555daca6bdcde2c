"""Encryption at rest (workflows/crypto.py): the error code ``encryption_key_missing``.

The payload columns keep their types: a sealed value is text in the same column (its key id
in its prefix), so no column changes. Frozen: the choices are written out here."""

from django.db import migrations, models

ERROR_CODES = [
    "error",
    "permanent",
    "ambiguous",
    "timeout",
    "cancelled",
    "retries_exhausted",
    "not_found",
    "denied",
    "resource_limit",
    "guest_fault",
    "panic",
    "nondeterminism",
    "history_corrupt",
    "invalid_module",
    "terminated",
    "internal",
    "encryption_key_missing",
]


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0015_wake_sweep"),
    ]

    operations = [
        migrations.AlterField(
            model_name="workflowinstance",
            name="error_code",
            field=models.CharField(
                blank=True,
                choices=[(c, c) for c in ERROR_CODES],
                max_length=32,
                null=True,
            ),
        ),
    ]
