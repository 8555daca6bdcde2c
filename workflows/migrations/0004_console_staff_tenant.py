"""The operator console's staff-to-tenant binding (``StaffTenant``). Not tenant-scoped: the
console reads it to choose the tenant context, so it gets no row-level security policy; the
application role reaches it through the default privileges granted in 0002."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("workflows", "0003_claim_invocations"),
    ]

    operations = [
        migrations.CreateModel(
            name="StaffTenant",
            fields=[
                (
                    "user",
                    models.OneToOneField(
                        help_text="A staff user (not a superuser: superusers may see every tenant).",
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="cleat_staff_tenant",
                        serialize=False,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        help_text="The only tenant this user sees in the console.",
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="staff",
                        to="workflows.tenant",
                    ),
                ),
            ],
            options={"verbose_name": "staff tenant binding"},
        ),
    ]
